// The reuse cache of device memory, written once for every device kind:
// the policy (which freed block to hand out again, when to zero it, how
// much to keep, the capacity) here, and where blocks come from in a
// MemoryBacking each kind implements (host pages for the CPU device,
// aclrtMalloc for the Ascend one).
#ifndef OPSERVER_DEVICES_MEMORY_POOL_H_
#define OPSERVER_DEVICES_MEMORY_POOL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace opserver {

// Where a MemoryPool's blocks come from and go back to: a device's own
// allocator. Called by the pool, sometimes under its lock, from any thread;
// implementations are thread-safe.
class MemoryBacking {
 public:
  virtual ~MemoryBacking() = default;
  // A fresh block of `size` bytes, a multiple of granule(). The error (the
  // device's refusal, RESOURCE_EXHAUSTED when it is out of memory) reaches
  // the caller of Allocate as it is.
  virtual absl::StatusOr<void*> Map(uint64_t size) = 0;
  // Gives back a block Map returned, with its size.
  virtual void Unmap(void* block, uint64_t size) = 0;
  // Sets the `size` bytes at `block` to zero, complete when it returns.
  virtual absl::Status Zero(void* block, uint64_t size) = 0;
  // Whether a block fresh from Map reads as zero (the kernel's pages do; an
  // accelerator's memory holds whatever was stored there last).
  virtual bool FreshIsZero() const = 0;
  // The unit sizes are rounded up to (a power of two): what one byte
  // costs.
  virtual uint64_t granule() const = 0;
};

// Device memory for buffers, with freed blocks kept for reuse.
//
// Getting fresh memory from a device is slow (the kernel faults host pages
// in at ~10 us each; aclrtMalloc and aclrtFree are calls into the driver)
// and training loops allocate the same sizes every step, so freed blocks
// are kept and handed out again: a steady workload asks the backing for
// memory once. Sizes are rounded up to the backing's granule. Allocation
// picks the smallest cached block that fits and is at most twice the
// request; the cache is trimmed, largest blocks first, when it exceeds
// `max_cached_bytes`.
//
// Memory is a real capacity: blocks in use, reservations (Reserve) and
// blocks cached never exceed `capacity_bytes` (the cache gives way first),
// so a client that writes into everything it allocated meets
// RESOURCE_EXHAUSTED at Allocate, never a failure of the device later.
//
// Tenants never see each other's bytes: every block carries the owner that
// last held it, and a cached block handed to another owner (or to owner 0,
// "anyone") is zeroed first, as is a fresh block from a backing whose fresh
// memory is not zero. Reuse within one owner, the common steady state,
// costs nothing.
//
// Thread-safe. Blocks are aligned as the backing's Map aligns them.
class MemoryPool {
 public:
  // `capacity_origin` says in RESOURCE_EXHAUSTED's message where the
  // capacity came from.
  MemoryPool(std::unique_ptr<MemoryBacking> backing, uint64_t max_cached_bytes,
             uint64_t capacity_bytes = UINT64_MAX,
             std::string capacity_origin = "--device_memory_bytes");
  // Gives cached blocks back to the backing; outstanding blocks are leaked
  // (a device destroyed under its sessions has no one to report to).
  ~MemoryPool();

  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of at least `bytes` (0 is fine: one granule) for `owner`.
  // RESOURCE_EXHAUSTED past the capacity; the backing's error when it
  // refuses a fresh block or fails to zero one (nothing is then held). The
  // contents are zero unless `owner` (non-zero) held the block last.
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner = 0);
  // `bytes` is the value given to Allocate.
  void Deallocate(void* block, uint64_t bytes);

  // Takes `bytes` of the capacity for memory the caller gets from the
  // device itself, outside the cache and its zeroing (the Ascend device's
  // stream scratch), trimming the cache to make room. RESOURCE_EXHAUSTED,
  // taking nothing, when blocks in use and reservations leave less.
  absl::Status Reserve(uint64_t bytes);
  // Gives back what Reserve took.
  void Unreserve(uint64_t bytes);

  // Gives every cached block back to the backing.
  void ReleaseCached();

  // What Allocate(bytes) takes from the capacity.
  uint64_t RoundUp(uint64_t bytes) const;

  uint64_t cached_bytes() const;
  // Blocks handed out and not yet deallocated, in (rounded) bytes, and
  // reservations.
  uint64_t in_use_bytes() const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  // Gives cached blocks back, largest first, until the cache holds at most
  // `limit` bytes. Under the lock, so that the capacity the accounting
  // frees is really free before another thread claims it.
  void TrimLocked(uint64_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ExhaustedLocked(uint64_t bytes) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<MemoryBacking> backing_;
  const uint64_t max_cached_bytes_;
  const uint64_t capacity_bytes_;
  const std::string capacity_origin_;
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

}  // namespace opserver

#endif  // OPSERVER_DEVICES_MEMORY_POOL_H_
