// The reuse cache's policy against a fake backing that counts what the pool
// asks of it: which calls reuse, zero, map and unmap, and what a failing
// backing leaves behind (nothing).
#include "devices/memory_pool.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

// Host memory the test can read, with every call counted. Fresh blocks
// hold 0xAB unless `fresh_is_zero` (an accelerator's memory holds whatever
// was stored there last).
class FakeBacking : public MemoryBacking {
 public:
  struct Counts {
    int maps = 0;
    int unmaps = 0;
    int zeros = 0;
    uint64_t zeroed_bytes = 0;
    // Blocks mapped and not unmapped.
    int live = 0;
    // Failures to inject: the next Map / Zero fails.
    bool fail_map = false;
    bool fail_zero = false;
  };

  FakeBacking(Counts* counts, bool fresh_is_zero, uint64_t granule = 256)
      : counts_(counts), fresh_is_zero_(fresh_is_zero), granule_(granule) {}

  absl::StatusOr<void*> Map(uint64_t size) override {
    EXPECT_EQ(size % granule_, 0u);
    if (counts_->fail_map) {
      counts_->fail_map = false;
      return absl::ResourceExhaustedError("fake: out of memory");
    }
    ++counts_->maps;
    ++counts_->live;
    char* block = new char[size];
    std::memset(block, fresh_is_zero_ ? 0 : 0xAB, size);
    return block;
  }
  void Unmap(void* block, uint64_t size) override {
    ++counts_->unmaps;
    --counts_->live;
    delete[] static_cast<char*>(block);
  }
  absl::Status Zero(void* block, uint64_t size) override {
    if (counts_->fail_zero) {
      counts_->fail_zero = false;
      return absl::InternalError("fake: memset failed");
    }
    ++counts_->zeros;
    counts_->zeroed_bytes += size;
    std::memset(block, 0, size);
    return absl::OkStatus();
  }
  bool FreshIsZero() const override { return fresh_is_zero_; }
  uint64_t granule() const override { return granule_; }

 private:
  Counts* const counts_;
  const bool fresh_is_zero_;
  const uint64_t granule_;
};

bool AllZero(const void* block, uint64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(block);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

class MemoryPoolPolicyTest : public ::testing::Test {
 protected:
  std::unique_ptr<MemoryPool> Pool(bool fresh_is_zero, uint64_t max_cached,
                                   uint64_t capacity = UINT64_MAX) {
    return std::make_unique<MemoryPool>(
        std::make_unique<FakeBacking>(&counts_, fresh_is_zero), max_cached,
        capacity);
  }
  FakeBacking::Counts counts_;
};

TEST_F(MemoryPoolPolicyTest, SizesRoundUpToTheGranule) {
  auto pool = Pool(true, 1 << 20);
  EXPECT_EQ(pool->RoundUp(0), 256u);
  EXPECT_EQ(pool->RoundUp(1), 256u);
  EXPECT_EQ(pool->RoundUp(256), 256u);
  EXPECT_EQ(pool->RoundUp(257), 512u);
  auto a = pool->Allocate(300, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool->in_use_bytes(), 512u);
  pool->Deallocate(*a, 300);
}

TEST_F(MemoryPoolPolicyTest, ReuseWithinAnOwnerZeroesNothing) {
  auto pool = Pool(/*fresh_is_zero=*/false, 1 << 20);
  auto a = pool->Allocate(1000, 7);
  ASSERT_TRUE(a.ok());
  // Fresh memory that is not zero is zeroed, all of the block.
  EXPECT_EQ(counts_.maps, 1);
  EXPECT_EQ(counts_.zeros, 1);
  EXPECT_EQ(counts_.zeroed_bytes, 1024u);
  EXPECT_TRUE(AllZero(*a, 1024));
  std::memset(*a, 0x5A, 1000);
  pool->Deallocate(*a, 1000);
  EXPECT_EQ(pool->cached_bytes(), 1024u);
  for (int i = 0; i < 3; ++i) {
    auto again = pool->Allocate(900, 7);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *a);
    EXPECT_EQ(static_cast<unsigned char*>(*again)[10], 0x5A);
    pool->Deallocate(*again, 900);
  }
  EXPECT_EQ(counts_.maps, 1);
  EXPECT_EQ(counts_.zeros, 1);
  EXPECT_EQ(counts_.unmaps, 0);
}

TEST_F(MemoryPoolPolicyTest, AChangeOfOwnerZeroesOnce) {
  auto pool = Pool(/*fresh_is_zero=*/true, 1 << 20);
  auto a = pool->Allocate(1000, 1);
  ASSERT_TRUE(a.ok());
  // Fresh memory that is zero already is not zeroed again.
  EXPECT_EQ(counts_.zeros, 0);
  std::memset(*a, 0x5A, 1000);
  pool->Deallocate(*a, 1000);
  auto b = pool->Allocate(1000, 2);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(*b, *a);
  EXPECT_EQ(counts_.zeros, 1);
  EXPECT_EQ(counts_.zeroed_bytes, 1024u);
  EXPECT_TRUE(AllZero(*b, 1024));
  std::memset(*b, 0x77, 1000);
  pool->Deallocate(*b, 1000);
  // The new owner's own reuse is free again.
  auto c = pool->Allocate(1000, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(counts_.zeros, 1);
  pool->Deallocate(*c, 1000);
  EXPECT_EQ(counts_.maps, 1);
}

TEST_F(MemoryPoolPolicyTest, OwnerZeroIsAlwaysZeroed) {
  auto pool = Pool(/*fresh_is_zero=*/true, 1 << 20);
  for (int i = 1; i <= 3; ++i) {
    auto a = pool->Allocate(512, 0);
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(AllZero(*a, 512));
    std::memset(*a, 0x11, 512);
    pool->Deallocate(*a, 512);
    // The first is fresh (zero already); each reuse by "anyone" is zeroed.
    EXPECT_EQ(counts_.zeros, i - 1);
  }
  EXPECT_EQ(counts_.maps, 1);
}

TEST_F(MemoryPoolPolicyTest, OnlyBlocksAtMostTwiceTheRequestAreReused) {
  auto pool = Pool(true, 1 << 20);
  auto big = pool->Allocate(4096, 1);
  ASSERT_TRUE(big.ok());
  pool->Deallocate(*big, 4096);
  auto small = pool->Allocate(1024, 1);  // 4096 > 2 * 1024: fresh.
  ASSERT_TRUE(small.ok());
  EXPECT_NE(*small, *big);
  auto half = pool->Allocate(2048, 1);  // 4096 <= 2 * 2048: reused.
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(*half, *big);
  EXPECT_EQ(counts_.maps, 2);
  pool->Deallocate(*small, 1024);
  pool->Deallocate(*half, 2048);
}

TEST_F(MemoryPoolPolicyTest, TheCacheIsTrimmedLargestFirstToItsCap) {
  auto pool = Pool(true, /*max_cached=*/3072);
  auto a = pool->Allocate(1024, 1);
  auto b = pool->Allocate(2048, 1);
  auto c = pool->Allocate(512, 1);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  pool->Deallocate(*a, 1024);
  pool->Deallocate(*b, 2048);
  EXPECT_EQ(pool->cached_bytes(), 3072u);
  EXPECT_EQ(counts_.unmaps, 0);
  // 3584 bytes cached would pass the cap: the largest block goes.
  pool->Deallocate(*c, 512);
  EXPECT_EQ(pool->cached_bytes(), 1536u);
  EXPECT_EQ(counts_.unmaps, 1);
  auto again = pool->Allocate(2048, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(counts_.maps, 4);  // The 2048 block was the one unmapped.
  pool->Deallocate(*again, 2048);
}

TEST_F(MemoryPoolPolicyTest, CapacityBoundsUseAndTheCacheGivesWay) {
  auto pool = Pool(true, /*max_cached=*/1 << 20, /*capacity=*/4096);
  auto a = pool->Allocate(3072, 1);
  ASSERT_TRUE(a.ok());
  auto refused = pool->Allocate(2048, 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(counts_.maps, 1);
  pool->Deallocate(*a, 3072);
  EXPECT_EQ(pool->cached_bytes(), 3072u);
  EXPECT_EQ(pool->in_use_bytes(), 0u);
  // The 3072 block is more than twice 1024, so a fresh one is mapped, and
  // 1024 + 3072 fits: the cache stays.
  auto b = pool->Allocate(1024, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool->cached_bytes(), 3072u);
  EXPECT_EQ(counts_.unmaps, 0);
  // 1024 more would not fit beside the cache: it gives way.
  auto c = pool->Allocate(1024, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(counts_.unmaps, 1);
  EXPECT_EQ(pool->cached_bytes(), 0u);
  EXPECT_EQ(pool->in_use_bytes(), 2048u);
  pool->Deallocate(*b, 1024);
  pool->Deallocate(*c, 1024);
  EXPECT_LE(pool->in_use_bytes() + pool->cached_bytes(), 4096u);
}

TEST_F(MemoryPoolPolicyTest, ReservationsShareTheCapacityWithTheCache) {
  auto pool = Pool(true, /*max_cached=*/1 << 20, /*capacity=*/4096);
  auto a = pool->Allocate(3072, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool->Reserve(2048).code(), absl::StatusCode::kResourceExhausted);
  pool->Deallocate(*a, 3072);
  EXPECT_EQ(pool->cached_bytes(), 3072u);
  // Room for the reservation comes out of the cache.
  ASSERT_TRUE(pool->Reserve(2048).ok());
  EXPECT_EQ(pool->cached_bytes(), 0u);
  EXPECT_EQ(counts_.unmaps, 1);
  EXPECT_EQ(pool->in_use_bytes(), 2048u);
  EXPECT_EQ(pool->Allocate(3000, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  pool->Unreserve(2048);
  EXPECT_EQ(pool->in_use_bytes(), 0u);
}

TEST_F(MemoryPoolPolicyTest, AFailingMapReturnsItsErrorAndHoldsNothing) {
  auto pool = Pool(false, 1 << 20, /*capacity=*/8192);
  counts_.fail_map = true;
  auto a = pool->Allocate(1000, 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.status().message(), "fake: out of memory");
  EXPECT_EQ(pool->in_use_bytes(), 0u);
  EXPECT_EQ(pool->cached_bytes(), 0u);
  // The whole capacity is still there.
  auto b = pool->Allocate(8192, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  pool->Deallocate(*b, 8192);
}

TEST_F(MemoryPoolPolicyTest, AFailingZeroReturnsItsErrorAndHoldsNothing) {
  auto pool = Pool(/*fresh_is_zero=*/false, 1 << 20, /*capacity=*/8192);
  // Of a fresh block: it is given back.
  counts_.fail_zero = true;
  auto fresh = pool->Allocate(1000, 1);
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(counts_.live, 0);
  EXPECT_EQ(pool->in_use_bytes(), 0u);
  // Of a reused block changing owner: given back too, not cached with
  // the old owner's bytes under the new owner's name.
  auto a = pool->Allocate(1000, 1);
  ASSERT_TRUE(a.ok());
  std::memset(*a, 0x5A, 1000);
  pool->Deallocate(*a, 1000);
  counts_.fail_zero = true;
  auto b = pool->Allocate(1000, 2);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(counts_.live, 0);
  EXPECT_EQ(pool->in_use_bytes(), 0u);
  EXPECT_EQ(pool->cached_bytes(), 0u);
  auto c = pool->Allocate(8192, 2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(AllZero(*c, 8192));
  pool->Deallocate(*c, 8192);
}

TEST_F(MemoryPoolPolicyTest, CachedBlocksGoBackOnReleaseAndDestruction) {
  auto pool = Pool(true, 1 << 20);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(*pool->Allocate(1024, 1));
  for (void* b : blocks) pool->Deallocate(b, 1024);
  EXPECT_EQ(counts_.live, 3);
  pool->ReleaseCached();
  EXPECT_EQ(counts_.live, 0);
  EXPECT_EQ(pool->cached_bytes(), 0u);
  void* d = *pool->Allocate(1024, 1);
  pool->Deallocate(d, 1024);
  EXPECT_EQ(counts_.live, 1);
  pool.reset();
  EXPECT_EQ(counts_.live, 0);
}

TEST_F(MemoryPoolPolicyTest, AbsurdSizeIsResourceExhaustedWithoutTheBacking) {
  auto pool = Pool(true, 1 << 20);
  EXPECT_EQ(pool->Allocate(uint64_t{1} << 63).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(counts_.maps, 0);
}

}  // namespace
}  // namespace opserver
