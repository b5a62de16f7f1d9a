#include "devices/cpu/memory_pool.h"

#include <sys/mman.h>
#include <unistd.h>

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

// What madvise(MADV_POPULATE_WRITE) does here, tried on one probe page.
enum class Populate {
  kFaultsPagesIn,
  kRefused,  // Kernels before Linux 5.14 (EINVAL).
  kIgnored,  // qemu-user: accepts every madvise advice, passes none on.
};

Populate ProbePopulate() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return Populate::kRefused;
  const int populated = madvise(probe, page, 23 /* MADV_POPULATE_WRITE */);
  unsigned char resident = 0;
  const bool known = mincore(probe, page, &resident) == 0;
  munmap(probe, page);
  if (populated != 0 || !known) return Populate::kRefused;
  return (resident & 1) != 0 ? Populate::kFaultsPagesIn : Populate::kIgnored;
}

// A fresh block comes with its pages faulted in, so the first upload into
// it runs at wire speed instead of paying a page fault per page. Checked
// wherever the kernel populates at all; skipped, with the reason in the
// test log (scripts/test-arm64.sh lists skips), where it cannot.
TEST(MemoryPoolTest, FreshBlocksAreResident) {
  switch (ProbePopulate()) {
    case Populate::kFaultsPagesIn:
      break;
    case Populate::kRefused:
      GTEST_SKIP() << "this kernel cannot populate (MADV_POPULATE_WRITE "
                      "needs Linux 5.14)";
    case Populate::kIgnored:
      GTEST_SKIP() << "madvise(MADV_POPULATE_WRITE) succeeded without "
                      "faulting a probe page in: an emulator (qemu-user "
                      "ignores madvise advice), so residency says nothing "
                      "about the pool here";
  }
  constexpr uint64_t kBytes = 8 << 20;
  // 4 KiB on x86; arm64 kernels also run with 16 or 64 KiB pages.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  MemoryPool pool(0);
  absl::StatusOr<void*> block = pool.Allocate(kBytes);
  ASSERT_TRUE(block.ok());
  std::vector<unsigned char> resident((kBytes + page - 1) / page);
  ASSERT_EQ(mincore(*block, kBytes, resident.data()), 0);
  size_t in_memory = 0;
  for (unsigned char p : resident) in_memory += p & 1;
  EXPECT_EQ(in_memory, resident.size());
  pool.Deallocate(*block, kBytes);
}

}  // namespace
}  // namespace opserver::cpu
