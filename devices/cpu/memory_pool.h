#ifndef OPSERVER_DEVICES_CPU_MEMORY_POOL_H_
#define OPSERVER_DEVICES_CPU_MEMORY_POOL_H_

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace opserver::cpu {

// Host memory for the CPU device's buffers.
//
// The first touch of a fresh page costs ~10 us on these machines (0.4 GB/s),
// so freed blocks are kept and handed out again instead of going back to the
// kernel: a steady workload touches each page once. Blocks are mmap'ed in
// page multiples and asked for transparent huge pages (fewer faults and TLB
// misses for large tensors). Allocation picks the smallest cached block that
// fits and is at most twice the request; the cache is trimmed, largest blocks
// first, when it exceeds `max_cached_bytes`.
//
// Memory is a real capacity: blocks in use plus blocks cached never exceed
// `capacity_bytes` (the cache gives way first), so a client that writes into
// everything it allocated meets RESOURCE_EXHAUSTED at Allocate, never the
// kernel's OOM killer later (blocks are not MAP_NORESERVE).
//
// Tenants never see each other's bytes: every block carries the owner that
// last held it, and a cached block handed to another owner (or to owner 0,
// "anyone") is zeroed first. Fresh pages are zero already; reuse within one
// owner, the common steady state, costs nothing.
//
// Thread-safe. Every block is 4096-byte aligned.
class MemoryPool {
 public:
  explicit MemoryPool(uint64_t max_cached_bytes,
                      uint64_t capacity_bytes = UINT64_MAX);
  ~MemoryPool();  // Returns cached blocks; outstanding blocks are leaked.

  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of at least `bytes` (0 is fine: one page) for `owner`.
  // RESOURCE_EXHAUSTED past the capacity or when the OS refuses. The
  // contents are zero unless `owner` (non-zero) held the block last.
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner = 0);
  // `bytes` is the value given to Allocate.
  void Deallocate(void* block, uint64_t bytes);

  // What Allocate(bytes) takes from the capacity.
  static uint64_t RoundUp(uint64_t bytes);

  uint64_t cached_bytes() const;
  // Blocks handed out and not yet deallocated, in (rounded) bytes.
  uint64_t in_use_bytes() const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  // Unmaps cached blocks, largest first, until the cache holds at most
  // `limit` bytes.
  void TrimLocked(uint64_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t max_cached_bytes_;
  const uint64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  // Free blocks by their (rounded) size. Allocations remember only the size
  // asked for, so the actual size and last owner are kept per block address.
  std::multimap<uint64_t, void*> free_ ABSL_GUARDED_BY(mu_);
  struct BlockInfo {
    uint64_t size;
    uint64_t owner;
  };
  std::map<void*, BlockInfo> blocks_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t in_use_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_MEMORY_POOL_H_
