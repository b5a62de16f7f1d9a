#include "devices/cpu/memory_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace opserver::cpu {
namespace {

constexpr uint64_t kPage = 4096;
// Blocks this large are worth huge pages; smaller ones would waste memory.
constexpr uint64_t kHugePageThreshold = 2ull << 20;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older libc headers lack it.
#endif

}  // namespace

MemoryPool::MemoryPool(uint64_t max_cached_bytes, uint64_t capacity_bytes)
    : max_cached_bytes_(max_cached_bytes), capacity_bytes_(capacity_bytes) {}

MemoryPool::~MemoryPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [size, block] : free_) munmap(block, size);
}

uint64_t MemoryPool::RoundUp(uint64_t bytes) {
  if (bytes == 0) return kPage;
  return (bytes + kPage - 1) / kPage * kPage;
}

absl::StatusOr<void*> MemoryPool::Allocate(uint64_t bytes, uint64_t owner) {
  if (bytes > (1ull << 62)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  const uint64_t size = RoundUp(bytes);
  void* reused = nullptr;
  uint64_t reused_size = 0;
  bool zero = false;
  {
    absl::MutexLock lock(&mu_);
    if (size > capacity_bytes_ - std::min(capacity_bytes_, in_use_bytes_)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes: the device has ",
          capacity_bytes_ - std::min(capacity_bytes_, in_use_bytes_),
          " of its ", capacity_bytes_, " bytes free (--device_memory_bytes)"));
    }
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size &&
        it->first <= capacity_bytes_ - in_use_bytes_) {
      reused = it->second;
      reused_size = it->first;
      cached_bytes_ -= it->first;
      free_.erase(it);
      BlockInfo& info = blocks_[reused];
      zero = owner == 0 || info.owner != owner;
      info.owner = owner;
      in_use_bytes_ += reused_size;
    } else {
      // Fresh pages: make room for them in the capacity by shrinking the
      // cache, and claim them before mapping outside the lock.
      TrimLocked(
          std::min(capacity_bytes_ - in_use_bytes_ - size, max_cached_bytes_));
      in_use_bytes_ += size;
    }
  }
  if (reused != nullptr) {
    // Another tenant's bytes: clear them (at memory speed, and only on a
    // change of owner).
    if (zero) std::memset(reused, 0, reused_size);
    return reused;
  }
  void* block = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (block != MAP_FAILED) {
    if (size >= kHugePageThreshold) madvise(block, size, MADV_HUGEPAGE);
    // Fault every page in now, in one call: faulting them one by one as the
    // first upload writes them costs ~13 us per 4 KiB page on these VMs
    // (0.3 GB/s; the first 256 MiB upload into a fresh buffer ran at a
    // quarter of the second's speed), populating costs ~50 ms per 256 MiB.
    // A device's memory is real once allocated, so this is also what an
    // accelerator does. Kernels before 5.14 refuse it (EINVAL): the pages
    // then come on first touch, as before.
    madvise(block, size, MADV_POPULATE_WRITE);
  }
  absl::MutexLock lock(&mu_);
  if (block == MAP_FAILED) {
    in_use_bytes_ -= size;
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes: ", std::strerror(errno)));
  }
  blocks_[block] = BlockInfo{size, owner};
  return block;
}

void MemoryPool::Deallocate(void* block, uint64_t /*bytes*/) {
  if (block == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(block);
  if (it == blocks_.end()) return;  // Not ours: never happens.
  in_use_bytes_ -= it->second.size;
  free_.emplace(it->second.size, block);
  cached_bytes_ += it->second.size;
  TrimLocked(std::min(max_cached_bytes_, capacity_bytes_ - in_use_bytes_));
}

void MemoryPool::TrimLocked(uint64_t limit) {
  while (cached_bytes_ > limit && !free_.empty()) {
    auto largest = std::prev(free_.end());
    munmap(largest->second, largest->first);
    cached_bytes_ -= largest->first;
    blocks_.erase(largest->second);
    free_.erase(largest);
  }
}

uint64_t MemoryPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

uint64_t MemoryPool::in_use_bytes() const {
  absl::MutexLock lock(&mu_);
  return in_use_bytes_;
}

}  // namespace opserver::cpu
