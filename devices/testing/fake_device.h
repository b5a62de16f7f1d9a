// A Device for tests that behaves like an asynchronous accelerator, so the
// server's use of the Device/DeviceStream interface is checked against what
// a CUDA device would do, not just against the CPU device (whose operations
// are complete when they return).
#ifndef OPSERVER_DEVICES_TESTING_FAKE_DEVICE_H_
#define OPSERVER_DEVICES_TESTING_FAKE_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "devices/cpu/plan.h"
#include "devices/cpu/thread_pool.h"
#include "devices/device.h"

namespace opserver {

// What FakeDevice shares with its streams, which may outlive it in tests
// (a stream's thread releases its device stream on its way out, after the
// test's device may be gone; the server's SessionManager waits for it).
struct FakeDeviceShared {
  cpu::ThreadPool compute{1};
  absl::Mutex mu;
  // See FakeDevice::FailNextSynchronize.
  absl::Status injected ABSL_GUARDED_BY(mu);
};

// What one FakeStream did; the device keeps it after the stream is gone.
struct FakeStreamRecord {
  std::atomic<int> launches{0};
  std::atomic<int> copies{0};
  std::atomic<int> synchronizes{0};
  // Operations queued and not yet run (by Synchronize).
  std::atomic<int> pending{0};
  std::atomic<int> memsets{0};
  std::atomic<int> device_copies{0};

  // For tests of ordering between streams: each launch of this stream
  // first sleeps `launch_delay` (a slow kernel), and waits while the
  // stream is held (HoldLaunches until ReleaseLaunches, or until the
  // stream is cancelled: a held stream never pins its session's
  // teardown). Both take effect when the launch runs, i.e. at the
  // device stream's Synchronize.
  void SetLaunchDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu);
    launch_delay = delay;
  }
  void HoldLaunches() {
    absl::MutexLock lock(&mu);
    held = true;
  }
  void ReleaseLaunches() {
    absl::MutexLock lock(&mu);
    held = false;
  }
  // Launches that are waiting for ReleaseLaunches now.
  int WaitingLaunches() {
    absl::MutexLock lock(&mu);
    return waiting;
  }
  // The thread that issued each launch (Launch's caller: the stream's
  // thread, or the thread that queued the launch when it ran there), in
  // order.
  std::vector<std::thread::id> LaunchThreads() {
    absl::MutexLock lock(&mu);
    return launch_threads;
  }

  absl::Mutex mu;
  absl::Duration launch_delay ABSL_GUARDED_BY(mu);
  bool held ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // SetInterrupted: a held launch stops with CANCELLED while set.
  bool interrupted ABSL_GUARDED_BY(mu) = false;
  int waiting ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::thread::id> launch_threads ABSL_GUARDED_BY(mu);
};

// Host memory; streams that only queue their operations and run them at
// Synchronize (or destruction), as an asynchronous device's would finish
// later. A caller that reads a copy's result, or releases what an operation
// uses, before synchronizing sees stale data (or ASan sees a use after
// free). Thread-safe.
class FakeDevice : public Device {
 public:
  // `max_streams` < 0: no limit; else CreateStream fails with
  // RESOURCE_EXHAUSTED once that many were created. Allocate fails with
  // RESOURCE_EXHAUSTED past `memory_bytes` allocated at once (as requested,
  // not rounded).
  explicit FakeDevice(int max_streams = -1, bool host_addressable = true,
                      uint64_t memory_bytes = kDefaultMemoryBytes)
      : max_streams_(max_streams),
        host_addressable_(host_addressable),
        memory_bytes_(memory_bytes) {}

  static constexpr uint64_t kDefaultMemoryBytes = 1ull << 30;

  DeviceDescription Describe() const override;
  // Plans as the CPU device does (cpu::HostPlan).
  absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      kernels::ValidCall valid) const override;
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner) override;
  void Deallocate(void* block, uint64_t bytes) override;
  uint64_t FreeBytes() const override {
    return memory_bytes_ - used_bytes_.load();
  }
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override;
  void* HostAddress(void* device_ptr) override {
    return host_addressable_ ? device_ptr : nullptr;
  }
  // The CPU's bound (it plans as the CPU does) unless a test sets another
  // (0: nothing runs on the receiving thread).
  int64_t inline_launch_elements() const override {
    return inline_launch_elements_.load();
  }
  void set_inline_launch_elements(int64_t elements) {
    inline_launch_elements_.store(elements);
  }

  // The records of the streams created so far, in creation order.
  std::vector<std::shared_ptr<FakeStreamRecord>> streams() const;
  // The next Synchronize of any stream reports `error` (an asynchronous
  // kernel fault) after running its operations.
  void FailNextSynchronize(absl::Status error);

 private:
  const int max_streams_;
  const bool host_addressable_;
  const uint64_t memory_bytes_;
  std::atomic<uint64_t> used_bytes_{0};
  std::atomic<int64_t> inline_launch_elements_{cpu::kInlineLaunchElements};
  const std::shared_ptr<FakeDeviceShared> shared_ =
      std::make_shared<FakeDeviceShared>();
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<FakeStreamRecord>> streams_ ABSL_GUARDED_BY(mu_);
};

// FakeDevice's device stream.
class FakeStream : public DeviceStream {
 public:
  FakeStream(const Device* owner, std::shared_ptr<FakeDeviceShared> device,
             std::shared_ptr<FakeStreamRecord> record)
      : owner_(owner), device_(std::move(device)), record_(std::move(record)) {}
  ~FakeStream() override;

  absl::Status CopyToDevice(void* device_dst, const void* host_src,
                            uint64_t bytes) override;
  absl::Status CopyFromDevice(void* host_dst, const void* device_src,
                              uint64_t bytes) override;
  absl::Status Memset(void* dst, int value, uint64_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src,
                            uint64_t bytes) override;
  absl::Status Launch(const DevicePlan& plan, void* workspace,
                      uint64_t workspace_size) override;
  absl::Status Synchronize() override;
  bool asynchronous() const override { return true; }
  // Lets a held launch go (see FakeStreamRecord::HoldLaunches).
  void CancelRunning() override;
  // Stops a held launch (see FakeStreamRecord::HoldLaunches) while `on`.
  void SetInterrupted(bool on) override;

 private:
  void Queue(std::function<absl::Status()> op);

  // Only compared with the plans' device (it may be gone by now).
  const Device* const owner_;
  const std::shared_ptr<FakeDeviceShared> device_;
  const std::shared_ptr<FakeStreamRecord> record_;
  // Not thread-safe, as the interface allows.
  std::vector<std::function<absl::Status()>> queued_;
};

}  // namespace opserver

#endif  // OPSERVER_DEVICES_TESTING_FAKE_DEVICE_H_
