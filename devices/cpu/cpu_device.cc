#include "devices/cpu/cpu_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "devices/cpu/plan.h"

namespace opserver::cpu {
namespace {

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown CPU";
}

// The largest number of logical devices --devices may ask for: far more
// than anyone needs, and small enough that every share is a useful size.
constexpr int kMaxDevices = 64;

}  // namespace

int CpuDevice::ResolveThreads(int threads) {
  if (threads > 0) return threads;
  int hw = static_cast<int>(std::thread::hardware_concurrency());
  return hw > 0 ? hw : 1;
}

uint64_t CpuDevice::DefaultMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 4ull << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) / 2;
}

CpuDevice::CpuDevice(int threads, uint64_t pool_cache_bytes,
                     uint64_t memory_bytes)
    : CpuDevice(std::make_shared<ThreadPool>(ResolveThreads(threads)),
                std::make_shared<ComputeTurns>(ResolveThreads(threads)),
                /*party=*/0, pool_cache_bytes, memory_bytes) {}

CpuDevice::CpuDevice(std::shared_ptr<ThreadPool> compute,
                     std::shared_ptr<ComputeTurns> turns, int party,
                     uint64_t pool_cache_bytes, uint64_t memory_bytes)
    : memory_(pool_cache_bytes,
              memory_bytes != 0 ? memory_bytes : DefaultMemoryBytes()),
      compute_(std::move(compute)),
      turns_(std::move(turns)),
      party_(party) {
  description_.kind = "cpu";
  description_.name = CpuModelName();
  description_.threads = static_cast<uint32_t>(compute_->num_threads());
  description_.memory_bytes = memory_.capacity_bytes();
}

uint64_t CpuDevice::FreeBytes() const {
  const uint64_t capacity = memory_.capacity_bytes();
  return capacity - std::min(capacity, memory_.in_use_bytes());
}

DeviceDescription CpuDevice::Describe() const { return description_; }

absl::StatusOr<std::unique_ptr<DevicePlan>> CpuDevice::Prepare(
    kernels::ValidCall valid) const {
  return HostPlan::Prepare(this, std::move(valid));
}

absl::StatusOr<void*> CpuDevice::Allocate(uint64_t bytes, uint64_t owner) {
  return memory_.Allocate(bytes, owner);
}

void CpuDevice::Deallocate(void* block, uint64_t bytes) {
  memory_.Deallocate(block, bytes);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> CpuDevice::CreateStream() {
  return std::make_unique<CpuStream>(this, compute_.get(), turns_.get(),
                                     party_);
}

absl::Status CpuStream::CopyToDevice(void* device_dst, const void* host_src,
                                     uint64_t bytes) {
  if (bytes != 0) std::memcpy(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuStream::CopyFromDevice(void* host_dst, const void* device_src,
                                       uint64_t bytes) {
  if (bytes != 0) std::memcpy(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::Status CpuStream::CheckCancelled(const char* what) const {
  if (!stop_.load(std::memory_order_relaxed)) return absl::OkStatus();
  if (!cancelled_.load(std::memory_order_relaxed)) {
    return absl::CancelledError(absl::StrCat(
        "the ", what,
        " was interrupted (it ran past the operator execute time-out); its "
        "destination is partly written"));
  }
  return absl::CancelledError(absl::StrCat(
      "the ", what,
      " was cancelled (its stream was destroyed, its session closed, or the "
      "server is shutting down); its destination is partly written"));
}

ComputeTurns* CpuStream::TurnsFor(uint64_t bytes) const {
  return bytes <= ComputeTurns::kSmallBytes ? nullptr : turns_;
}

absl::Status CpuStream::Memset(void* dst, int value, uint64_t bytes) {
  char* const out = static_cast<char*>(dst);
  ComputeTurns* const turns = TurnsFor(bytes);
  for (uint64_t at = 0; at < bytes; at += kSliceBytes) {
    RETURN_IF_ERROR(CheckCancelled("memset"));
    ComputeTurns::Turn turn(turns, party_);
    std::memset(out + at, value & 0xff, std::min(kSliceBytes, bytes - at));
  }
  return absl::OkStatus();
}

absl::Status CpuStream::CopyOnDevice(void* dst, const void* src,
                                     uint64_t bytes) {
  char* const out = static_cast<char*>(dst);
  const char* const in = static_cast<const char*>(src);
  // A copy within one buffer may overlap: when the destination starts
  // inside the source, slices go from the end so that none overwrites
  // source bytes a later slice still reads (memmove within each slice).
  const bool backward = out > in && out < in + bytes;
  ComputeTurns* const turns = TurnsFor(bytes);
  for (uint64_t done = 0; done < bytes; done += kSliceBytes) {
    RETURN_IF_ERROR(CheckCancelled("copy"));
    const uint64_t n = std::min(kSliceBytes, bytes - done);
    const uint64_t at = backward ? bytes - done - n : done;
    ComputeTurns::Turn turn(turns, party_);
    std::memmove(out + at, in + at, n);
  }
  return absl::OkStatus();
}

absl::Status CpuStream::Launch(const DevicePlan& plan, void* workspace,
                               uint64_t workspace_size) {
  ASSIGN_OR_RETURN(const Plan* host, HostPlan::Of(plan, device_));
  return RunPlan(*host, workspace, workspace_size, compute_, &stop_, turns_,
                 party_);
}

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCpuDevices(
    const DeviceOptions& options) {
  if (options.kind != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("'", options.kind,
                     "': the cpu device takes no arguments; split it "
                     "with --devices"));
  }
  if (options.devices < 1 || options.devices > kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "devices must be 1 to ", kMaxDevices, ", got ", options.devices));
  }
  const uint64_t count = static_cast<uint64_t>(options.devices);
  const uint64_t total = options.memory_bytes != 0
                             ? options.memory_bytes
                             : CpuDevice::DefaultMemoryBytes();
  constexpr uint64_t kPage = 4096;
  // Whole pages, so no share holds a partial page another could use.
  const uint64_t share = total / count / kPage * kPage;
  if (share == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory of ", total, " bytes cannot be split into ", count,
                     " devices of at least ", kPage, " bytes each"));
  }
  // One pool of compute threads for all logical devices: they are the same
  // cores, so a pool per device would run `devices` times as many compute
  // threads as cores whenever several devices are busy, and every launch
  // would slow down by the oversubscription. With one pool, a device alone
  // still gets every core, and busy devices share them; the pool takes
  // concurrent launches from many streams already (one device's streams
  // run concurrently on it today).
  //
  // Sharing the cores, the devices take turns at them (ComputeTurns): a
  // slot per compute thread, handed round the devices that want one, so a
  // device's latency does not depend on how much work another queues.
  const int threads = CpuDevice::ResolveThreads(options.threads);
  auto compute = std::make_shared<ThreadPool>(threads);
  auto turns = std::make_shared<ComputeTurns>(threads);
  std::vector<std::unique_ptr<Device>> devices;
  for (uint64_t i = 0; i < count; ++i) {
    devices.push_back(
        std::make_unique<CpuDevice>(compute, turns, static_cast<int>(i),
                                    options.memory_cache_bytes / count, share));
  }
  return devices;
}

}  // namespace opserver::cpu
