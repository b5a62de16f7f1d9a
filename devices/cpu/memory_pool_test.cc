#include "devices/cpu/memory_pool.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace opserver::cpu {
namespace {

TEST(MemoryPoolTest, BlocksAreAlignedWritableAndDistinct) {
  MemoryPool pool(1 << 20);
  auto a = pool.Allocate(100);
  auto b = pool.Allocate(0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % 4096, 0u);
  std::memset(*a, 0xAB, 100);
  pool.Deallocate(*a, 100);
  pool.Deallocate(*b, 0);
}

TEST(MemoryPoolTest, FreedBlocksAreReused) {
  MemoryPool pool(64 << 20);
  auto a = pool.Allocate(3 << 20);
  ASSERT_TRUE(a.ok());
  void* first = *a;
  pool.Deallocate(first, 3 << 20);
  EXPECT_EQ(pool.cached_bytes(), 3u << 20);
  auto b = pool.Allocate((3 << 20) - 5);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, first);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.Deallocate(*b, (3 << 20) - 5);
}

TEST(MemoryPoolTest, DoesNotHandOutBlocksMoreThanTwiceTheRequest) {
  MemoryPool pool(64 << 20);
  auto big = pool.Allocate(16 << 20);
  ASSERT_TRUE(big.ok());
  pool.Deallocate(*big, 16 << 20);
  auto small = pool.Allocate(4096);
  ASSERT_TRUE(small.ok());
  EXPECT_NE(*small, *big);
  pool.Deallocate(*small, 4096);
}

TEST(MemoryPoolTest, CacheIsTrimmedToItsLimit) {
  MemoryPool pool(1 << 20);
  auto a = pool.Allocate(4 << 20);
  ASSERT_TRUE(a.ok());
  pool.Deallocate(*a, 4 << 20);
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(MemoryPoolTest, AbsurdSizeIsResourceExhausted) {
  MemoryPool pool(1 << 20);
  auto a = pool.Allocate(uint64_t{1} << 63);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
}

// A block handed to another owner never shows the bytes
// the previous owner wrote; the same owner gets its block back as it left it
// (no zeroing cost in the steady state).
TEST(MemoryPoolTest, ReuseAcrossOwnersIsZeroed) {
  MemoryPool pool(64 << 20);
  auto a = pool.Allocate(3 << 20, /*owner=*/1);
  ASSERT_TRUE(a.ok());
  std::memset(*a, 0x5A, 3 << 20);
  pool.Deallocate(*a, 3 << 20);
  auto same = pool.Allocate(3 << 20, /*owner=*/1);
  ASSERT_TRUE(same.ok());
  ASSERT_EQ(*same, *a);
  EXPECT_EQ(static_cast<unsigned char*>(*same)[12345], 0x5A);
  pool.Deallocate(*same, 3 << 20);
  for (uint64_t owner : {uint64_t{2}, uint64_t{0}}) {
    auto other = pool.Allocate(3 << 20, owner);
    ASSERT_TRUE(other.ok());
    ASSERT_EQ(*other, *a);  // Reused, so it had to be cleared.
    const unsigned char* bytes = static_cast<unsigned char*>(*other);
    for (size_t i = 0; i < (3u << 20); ++i) {
      ASSERT_EQ(bytes[i], 0) << "byte " << i << " for owner " << owner;
    }
    std::memset(*other, 0x77, 3 << 20);
    pool.Deallocate(*other, 3 << 20);
  }
}

// Blocks in use plus the cache stay within the capacity.
TEST(MemoryPoolTest, CapacityBoundsUseAndTheCacheGivesWay) {
  MemoryPool pool(/*max_cached_bytes=*/64 << 20, /*capacity_bytes=*/8 << 20);
  EXPECT_EQ(pool.capacity_bytes(), 8u << 20);
  auto a = pool.Allocate(6 << 20, 1);
  ASSERT_TRUE(a.ok());
  auto refused = pool.Allocate(3 << 20, 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.in_use_bytes(), 6u << 20);
  pool.Deallocate(*a, 6 << 20);
  EXPECT_EQ(pool.in_use_bytes(), 0u);
  EXPECT_EQ(pool.cached_bytes(), 6u << 20);
  // The cached 6 MiB block is more than twice 2.5 MiB, so fresh pages are
  // mapped, and 2.5 + 6 MiB would pass the capacity: the cache gives way.
  auto b = pool.Allocate(5 << 19, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*b, *a);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.in_use_bytes(), 5u << 19);
  pool.Deallocate(*b, 5 << 19);
}

// A fresh block comes with its pages faulted in, so the first upload into
// it runs at wire speed instead of paying a page fault per 4 KiB.
TEST(MemoryPoolTest, FreshBlocksAreResident) {
  constexpr uint64_t kBytes = 8 << 20;
  {
    // The kernel must know MADV_POPULATE_WRITE (Linux 5.14).
    void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const int populated = madvise(probe, 4096, 23 /* MADV_POPULATE_WRITE */);
    munmap(probe, 4096);
    if (populated != 0) GTEST_SKIP() << "this kernel cannot populate";
  }
  MemoryPool pool(0);
  absl::StatusOr<void*> block = pool.Allocate(kBytes);
  ASSERT_TRUE(block.ok());
  std::vector<unsigned char> resident(kBytes / 4096);
  ASSERT_EQ(mincore(*block, kBytes, resident.data()), 0);
  size_t in_memory = 0;
  for (unsigned char page : resident) in_memory += page & 1;
  EXPECT_EQ(in_memory, resident.size());
  pool.Deallocate(*block, kBytes);
}

}  // namespace
}  // namespace opserver::cpu
