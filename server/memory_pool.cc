#include "server/memory_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace opserver {
namespace {

constexpr uint64_t kPage = 4096;
// Blocks this large are worth huge pages; smaller ones would waste memory.
constexpr uint64_t kHugePageThreshold = 2ull << 20;

}  // namespace

MemoryPool::MemoryPool(uint64_t max_cached_bytes)
    : max_cached_bytes_(max_cached_bytes) {}

MemoryPool::~MemoryPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [size, block] : free_) munmap(block, size);
}

uint64_t MemoryPool::RoundUp(uint64_t bytes) {
  if (bytes == 0) return kPage;
  return (bytes + kPage - 1) / kPage * kPage;
}

absl::StatusOr<void*> MemoryPool::Allocate(uint64_t bytes) {
  if (bytes > (1ull << 62)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  const uint64_t size = RoundUp(bytes);
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      void* block = it->second;
      cached_bytes_ -= it->first;
      free_.erase(it);
      return block;
    }
  }
  void* block = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (block == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes: ", std::strerror(errno)));
  }
  if (size >= kHugePageThreshold) madvise(block, size, MADV_HUGEPAGE);
  absl::MutexLock lock(&mu_);
  block_size_[block] = size;
  return block;
}

void MemoryPool::Deallocate(void* block, uint64_t /*bytes*/) {
  if (block == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = block_size_.find(block);
  if (it == block_size_.end()) return;  // Not ours: never happens.
  free_.emplace(it->second, block);
  cached_bytes_ += it->second;
  TrimLocked();
}

void MemoryPool::TrimLocked() {
  while (cached_bytes_ > max_cached_bytes_ && !free_.empty()) {
    auto largest = std::prev(free_.end());
    munmap(largest->second, largest->first);
    cached_bytes_ -= largest->first;
    block_size_.erase(largest->second);
    free_.erase(largest);
  }
}

uint64_t MemoryPool::cached_bytes() const {
  absl::MutexLock lock(&mu_);
  return cached_bytes_;
}

}  // namespace opserver
