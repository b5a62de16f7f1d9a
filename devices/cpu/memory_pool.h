// The CPU device's memory: the device-neutral reuse cache
// (devices/memory_pool.h) over host pages.
#ifndef OPSERVER_DEVICES_CPU_MEMORY_POOL_H_
#define OPSERVER_DEVICES_CPU_MEMORY_POOL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "devices/memory_pool.h"

namespace opserver::cpu {

// Host pages as device memory: mmap'ed in 4 KiB page multiples, asked for
// transparent huge pages when large (fewer faults and TLB misses for large
// tensors) and faulted in at once. Fresh pages are zero already, so the
// pool zeroes only blocks that change owner (memset).
class HostBacking : public MemoryBacking {
 public:
  absl::StatusOr<void*> Map(uint64_t size) override;
  void Unmap(void* block, uint64_t size) override;
  absl::Status Zero(void* block, uint64_t size) override;
  bool FreshIsZero() const override { return true; }
  uint64_t granule() const override { return 4096; }
};

// Host memory for the CPU device's buffers: a MemoryPool on HostBacking.
//
// The first touch of a fresh page costs ~10 us on these machines (0.4 GB/s),
// so freed blocks are kept and handed out again instead of going back to the
// kernel: a steady workload touches each page once. Blocks are not
// MAP_NORESERVE, so the capacity is real: a client that writes into
// everything it allocated meets RESOURCE_EXHAUSTED at Allocate, never the
// kernel's OOM killer later. Every block is 4096-byte aligned.
class MemoryPool : public opserver::MemoryPool {
 public:
  explicit MemoryPool(uint64_t max_cached_bytes,
                      uint64_t capacity_bytes = UINT64_MAX);
};

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_MEMORY_POOL_H_
