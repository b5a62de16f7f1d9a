#include "devices/testing/fake_device.h"

#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "devices/cpu/plan.h"

namespace opserver {

absl::StatusOr<std::unique_ptr<DevicePlan>> FakeDevice::Prepare(
    kernels::ValidCall valid) const {
  return cpu::HostPlan::Prepare(this, std::move(valid));
}

DeviceDescription FakeDevice::Describe() const {
  DeviceDescription description;
  description.kind = "fake";
  description.name = "asynchronous test device";
  description.memory_bytes = memory_bytes_;
  description.threads = 1;
  return description;
}

absl::StatusOr<void*> FakeDevice::Allocate(uint64_t bytes, uint64_t) {
  // Reserved with a compare-and-swap so that concurrent calls cannot
  // overshoot the capacity together.
  uint64_t used = used_bytes_.load();
  do {
    if (bytes > memory_bytes_ - used) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fake device: cannot allocate ", bytes, " bytes, ",
          memory_bytes_ - used, " of ", memory_bytes_, " bytes free"));
    }
  } while (!used_bytes_.compare_exchange_weak(used, used + bytes));
  char* block = new char[bytes];
  std::memset(block, 0, bytes);
  return static_cast<void*>(block);
}

void FakeDevice::Deallocate(void* block, uint64_t bytes) {
  used_bytes_ -= bytes;
  delete[] static_cast<char*>(block);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> FakeDevice::CreateStream() {
  absl::MutexLock lock(&mu_);
  if (max_streams_ >= 0 &&
      streams_.size() >= static_cast<size_t>(max_streams_)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("fake device: all ", max_streams_, " streams are in use"));
  }
  auto record = std::make_shared<FakeStreamRecord>();
  streams_.push_back(record);
  return std::make_unique<FakeStream>(this, shared_, std::move(record));
}

std::vector<std::shared_ptr<FakeStreamRecord>> FakeDevice::streams() const {
  absl::MutexLock lock(&mu_);
  return streams_;
}

void FakeDevice::FailNextSynchronize(absl::Status error) {
  absl::MutexLock lock(&shared_->mu);
  shared_->injected = std::move(error);
}

FakeStream::~FakeStream() {
  // As an asynchronous device's stream destructor waits for its work.
  Synchronize().IgnoreError();
}

void FakeStream::Queue(std::function<absl::Status()> op) {
  queued_.push_back(std::move(op));
  ++record_->pending;
}

absl::Status FakeStream::CopyToDevice(void* device_dst, const void* host_src,
                                      uint64_t bytes) {
  ++record_->copies;
  Queue([=] {
    if (bytes != 0) std::memcpy(device_dst, host_src, bytes);
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status FakeStream::CopyFromDevice(void* host_dst, const void* device_src,
                                        uint64_t bytes) {
  ++record_->copies;
  Queue([=] {
    if (bytes != 0) std::memcpy(host_dst, device_src, bytes);
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status FakeStream::Memset(void* dst, int value, uint64_t bytes) {
  ++record_->memsets;
  Queue([=] {
    if (bytes != 0) std::memset(dst, value & 0xff, bytes);
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status FakeStream::CopyOnDevice(void* dst, const void* src,
                                      uint64_t bytes) {
  ++record_->device_copies;
  Queue([=] {
    if (bytes != 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status FakeStream::Launch(const DevicePlan& device_plan, void* workspace,
                                uint64_t workspace_size) {
  ASSIGN_OR_RETURN(const cpu::Plan* host,
                   cpu::HostPlan::Of(device_plan, owner_));
  ++record_->launches;
  {
    absl::MutexLock lock(&record_->mu);
    record_->launch_threads.push_back(std::this_thread::get_id());
  }
  // By reference: the caller keeps the plan until Synchronize returns.
  Queue([&plan = *host, workspace, workspace_size, compute = &device_->compute,
         record = record_.get()] {
    absl::Duration delay;
    {
      absl::MutexLock lock(&record->mu);
      delay = record->launch_delay;
      ++record->waiting;
      record->mu.Await(absl::Condition(
          +[](FakeStreamRecord* r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !r->held || r->cancelled || r->interrupted;
          },
          record));
      --record->waiting;
      if (record->held && record->interrupted && !record->cancelled) {
        return absl::CancelledError("the held launch was interrupted");
      }
    }
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
    return cpu::RunPlan(plan, workspace, workspace_size, compute);
  });
  return absl::OkStatus();
}

void FakeStream::SetInterrupted(bool on) {
  absl::MutexLock lock(&record_->mu);
  record_->interrupted = on;
}

void FakeStream::CancelRunning() {
  absl::MutexLock lock(&record_->mu);
  record_->cancelled = true;
}

absl::Status FakeStream::Synchronize() {
  ++record_->synchronizes;
  absl::Status first;
  for (std::function<absl::Status()>& op : queued_) {
    absl::Status status = op();
    if (first.ok()) first = std::move(status);
    --record_->pending;
  }
  queued_.clear();
  absl::Status injected;
  {
    absl::MutexLock lock(&device_->mu);
    injected = std::exchange(device_->injected, absl::OkStatus());
  }
  if (first.ok()) first = std::move(injected);
  return first;
}

}  // namespace opserver
