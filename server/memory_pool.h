#ifndef OPSERVER_SERVER_MEMORY_POOL_H_
#define OPSERVER_SERVER_MEMORY_POOL_H_

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace opserver {

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
// Thread-safe. Every block is 4096-byte aligned.
class MemoryPool {
 public:
  explicit MemoryPool(uint64_t max_cached_bytes);
  ~MemoryPool();  // Returns cached blocks; outstanding blocks are leaked.

  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of at least `bytes` (0 is fine: one page). RESOURCE_EXHAUSTED
  // when the OS refuses. The contents are unspecified.
  absl::StatusOr<void*> Allocate(uint64_t bytes);
  // `bytes` is the value given to Allocate.
  void Deallocate(void* block, uint64_t bytes);

  uint64_t cached_bytes() const;

 private:
  static uint64_t RoundUp(uint64_t bytes);
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t max_cached_bytes_;
  mutable absl::Mutex mu_;
  // Free blocks by their (rounded) size. Allocations remember only the size
  // asked for, so the actual size is kept here per block address.
  std::multimap<uint64_t, void*> free_ ABSL_GUARDED_BY(mu_);
  std::map<void*, uint64_t> block_size_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_MEMORY_POOL_H_
