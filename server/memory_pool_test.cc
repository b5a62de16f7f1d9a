#include "server/memory_pool.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace opserver {
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

}  // namespace
}  // namespace opserver
