#include "devices/memory_pool.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"

namespace opserver {

MemoryPool::MemoryPool(std::unique_ptr<MemoryBacking> backing,
                       uint64_t max_cached_bytes, uint64_t capacity_bytes,
                       std::string capacity_origin)
    : backing_(std::move(backing)),
      max_cached_bytes_(max_cached_bytes),
      capacity_bytes_(capacity_bytes),
      capacity_origin_(std::move(capacity_origin)) {}

MemoryPool::~MemoryPool() { ReleaseCached(); }

uint64_t MemoryPool::RoundUp(uint64_t bytes) const {
  const uint64_t granule = backing_->granule();
  if (bytes == 0) return granule;
  return (bytes + granule - 1) / granule * granule;
}

absl::Status MemoryPool::ExhaustedLocked(uint64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot allocate ", bytes, " bytes: the device has ",
      capacity_bytes_ - std::min(capacity_bytes_, in_use_bytes_), " of its ",
      capacity_bytes_, " bytes free (", capacity_origin_, ")"));
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
      return ExhaustedLocked(bytes);
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
      // A fresh block: make room for it in the capacity by shrinking the
      // cache, and claim it before asking the backing outside the lock.
      TrimLocked(
          std::min(capacity_bytes_ - in_use_bytes_ - size, max_cached_bytes_));
      in_use_bytes_ += size;
    }
  }
  if (reused != nullptr) {
    // Another tenant's bytes: clear them (only on a change of owner). The
    // whole block, not just the request: the same owner may later get it
    // back for a larger request without zeroing.
    if (zero) {
      if (absl::Status s = backing_->Zero(reused, reused_size); !s.ok()) {
        // Its contents are unknown now: give it back rather than cache
        // another owner's bytes under the new owner's name.
        backing_->Unmap(reused, reused_size);
        absl::MutexLock lock(&mu_);
        in_use_bytes_ -= reused_size;
        blocks_.erase(reused);
        return s;
      }
    }
    return reused;
  }
  absl::StatusOr<void*> block = backing_->Map(size);
  if (block.ok() && !backing_->FreshIsZero()) {
    if (absl::Status s = backing_->Zero(*block, size); !s.ok()) {
      backing_->Unmap(*block, size);
      block = s;
    }
  }
  absl::MutexLock lock(&mu_);
  if (!block.ok()) {
    in_use_bytes_ -= size;
    return block.status();
  }
  blocks_[*block] = BlockInfo{size, owner};
  return *block;
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

absl::Status MemoryPool::Reserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > capacity_bytes_ - std::min(capacity_bytes_, in_use_bytes_)) {
    return ExhaustedLocked(bytes);
  }
  in_use_bytes_ += bytes;
  TrimLocked(std::min(max_cached_bytes_, capacity_bytes_ - in_use_bytes_));
  return absl::OkStatus();
}

void MemoryPool::Unreserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  in_use_bytes_ -= std::min(bytes, in_use_bytes_);
}

void MemoryPool::ReleaseCached() {
  absl::MutexLock lock(&mu_);
  TrimLocked(0);
}

void MemoryPool::TrimLocked(uint64_t limit) {
  while (cached_bytes_ > limit && !free_.empty()) {
    auto largest = std::prev(free_.end());
    backing_->Unmap(largest->second, largest->first);
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

}  // namespace opserver
