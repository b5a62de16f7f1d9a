#ifndef OPSERVER_DEVICES_CPU_CPU_DEVICE_H_
#define OPSERVER_DEVICES_CPU_CPU_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "devices/cpu/compute_turns.h"
#include "devices/cpu/memory_pool.h"
#include "devices/cpu/plan.h"
#include "devices/cpu/thread_pool.h"
#include "devices/device.h"

namespace opserver::cpu {

// A CpuDevice's device stream: copies are memcpy and launches run on the
// calling (host stream) thread using the device's compute pool, so every
// operation is complete when it returns and Synchronize has nothing to wait
// for. The device must outlive it.
//
// Launches, memsets and on-device copies of any size run in slices (a
// piece of about a million elements, or kSliceBytes), each of which takes
// a turn at the cores as the device's `party` from `turns` (shared by the
// logical devices of one host) and first checks the cancel flag: so
// devices take turns slice by slice, and a cancelled stream stops within
// one slice. Small ones take no turn (ComputeTurns::kSmallBytes).
class CpuStream : public DeviceStream {
 public:
  static constexpr uint64_t kSliceBytes = 1 << 20;

  CpuStream(const Device* device, ThreadPool* compute,
            ComputeTurns* turns = nullptr, int party = 0)
      : device_(device), compute_(compute), turns_(turns), party_(party) {}
  absl::Status CopyToDevice(void* device_dst, const void* host_src,
                            uint64_t bytes) override;
  absl::Status CopyFromDevice(void* host_dst, const void* device_src,
                              uint64_t bytes) override;
  absl::Status Memset(void* dst, int value, uint64_t bytes) override;
  absl::Status CopyOnDevice(void* dst, const void* src,
                            uint64_t bytes) override;
  absl::Status Launch(const DevicePlan& plan, void* workspace,
                      uint64_t workspace_size) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  // The turns its slices take, and as whom (for tests).
  ComputeTurns* turns() const { return turns_; }
  int party() const { return party_; }
  void CancelRunning() override {
    cancelled_.store(true, std::memory_order_relaxed);
    stop_.store(true, std::memory_order_relaxed);
  }
  void SetInterrupted(bool on) override {
    stop_.store(on || cancelled_.load(std::memory_order_relaxed),
                std::memory_order_relaxed);
  }

 private:
  // CANCELLED once stop_ is set, naming `what` ("memset", "copy").
  absl::Status CheckCancelled(const char* what) const;
  // turns_, or none for work of at most ComputeTurns::kSmallBytes.
  ComputeTurns* TurnsFor(uint64_t bytes) const;

  const Device* const device_;
  ThreadPool* const compute_;
  ComputeTurns* const turns_;
  const int party_;
  // Cancelled for good (CancelRunning).
  std::atomic<bool> cancelled_{false};
  // What operations check: cancelled, or interrupted now (SetInterrupted).
  std::atomic<bool> stop_{false};
};

// The embedded default device: host memory from a page-reusing pool and a
// pool of compute threads shared by all streams. Needs nothing installed.
class CpuDevice : public Device {
 public:
  // `threads` <= 0 means one per hardware thread. `pool_cache_bytes` caps the
  // freed memory kept for reuse. `memory_bytes` bounds everything allocated
  // plus that cache; 0 = DefaultMemoryBytes().
  CpuDevice(int threads, uint64_t pool_cache_bytes, uint64_t memory_bytes = 0);
  // The same computing on `compute`, which other CpuDevices may share: the
  // logical devices one host is split into (CreateDevices, --devices).
  // `turns` (may be null: no turns) is shared with them too, and `party`
  // is this device's number in it.
  CpuDevice(std::shared_ptr<ThreadPool> compute,
            std::shared_ptr<ComputeTurns> turns, int party,
            uint64_t pool_cache_bytes, uint64_t memory_bytes = 0);
  uint64_t CachedBytes() const override { return memory_.cached_bytes(); }
  // The capacity less the blocks in use: the cache gives way to Allocate.
  uint64_t FreeBytes() const override;

  // Half of physical memory: room for the server's own heap, gRPC's buffers
  // and the host's other processes, so a full device is an allocation
  // error, never an OOM kill.
  static uint64_t DefaultMemoryBytes();
  // The compute threads `threads` asks for: itself if positive, else one
  // per hardware thread.
  static int ResolveThreads(int threads);

  DeviceDescription Describe() const override;
  // A HostPlan (plan.h).
  absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      kernels::ValidCall valid) const override;
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner) override;
  void Deallocate(void* block, uint64_t bytes) override;
  // A CpuStream: never fails (it owns no resource but a pointer).
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override;
  void* HostAddress(void* device_ptr) override { return device_ptr; }
  int64_t inline_launch_elements() const override {
    return kInlineLaunchElements;
  }

 private:
  DeviceDescription description_;
  MemoryPool memory_;
  const std::shared_ptr<ThreadPool> compute_;
  const std::shared_ptr<ComputeTurns> turns_;
  const int party_;
};

// --device=cpu (devices/device_factory.cc): options.devices logical
// devices (--devices) splitting the host. Each gets options.memory_bytes /
// devices of capacity (0 = DefaultMemoryBytes()), rounded down to whole
// 4 KiB pages, and memory_cache_bytes / devices of reuse cache; all compute
// on one pool of options.threads threads, taking turns at it slice by
// slice (ComputeTurns, one party per device). INVALID_ARGUMENT for a count
// outside 1..64, a share below one page, or anything after "cpu".
absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCpuDevices(
    const DeviceOptions& options);

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_CPU_DEVICE_H_
