#include "client/device_addresses.h"

#include <cstdint>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// A buffer handle without a session: nothing is freed on the server.
remote::DeviceBuffer Buffer(uint64_t handle, uint64_t size) {
  return remote::DeviceBuffer(nullptr, handle, size);
}

absl::StatusOr<void*> Add(DeviceAddressSpace& space, uint64_t size,
                          uint64_t handle, uint64_t buffer_size) {
  remote::DeviceBuffer buffer = Buffer(handle, buffer_size);
  return space.Add(size, buffer);
}

const void* At(void* base, intptr_t bytes) {
  return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(base) +
                                       bytes);
}

TEST(DeviceAddressSpaceTest, EveryByteOfAnAllocationResolves) {
  DeviceAddressSpace space;
  auto a = Add(space, 48, 7, 48);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a), DeviceAddressSpace::kBase);
  for (intptr_t i : {0, 1, 16, 47}) {
    auto r = space.Resolve(At(*a, i), "x");
    ASSERT_TRUE(r.ok()) << i;
    EXPECT_EQ(r->buffer, 7u);
    EXPECT_EQ(r->offset, static_cast<uint64_t>(i));
    EXPECT_EQ(r->available, static_cast<uint64_t>(48 - i));
  }
  // One past the end, just before the start, and in the gap: nothing.
  for (intptr_t i : {48, -1, 4095, 4096}) {
    auto r = space.Resolve(At(*a, i), "self's data");
    EXPECT_FALSE(r.ok()) << i;
    EXPECT_THAT(r.status().message(), HasSubstr("self's data"));
  }
}

TEST(DeviceAddressSpaceTest, AllocationsNeverTouchAndAddressesAreNotReused) {
  DeviceAddressSpace space;
  auto a = Add(space, 4096, 1, 4096);  // Exactly one unit.
  auto b = Add(space, 1, 2, 1);
  auto empty = Add(space, 0, 3, 0);
  ASSERT_TRUE(a.ok() && b.ok() && empty.ok());
  // a's last byte and b's first are not adjacent: a gap of a unit.
  EXPECT_GE(reinterpret_cast<uintptr_t>(*b),
            reinterpret_cast<uintptr_t>(*a) + 4096 + 4096);
  EXPECT_EQ(space.Resolve(At(*b, 0), "b")->buffer, 2u);
  // An empty allocation resolves at its start only (a tensor of 0 elements
  // may point there).
  EXPECT_EQ(space.Resolve(*empty, "e")->available, 0u);
  EXPECT_FALSE(space.Resolve(At(*empty, 1), "e").ok());
  // Freed: its addresses resolve to nothing, and the next allocation gets
  // new ones.
  auto freed = space.Remove(*b);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(freed->handle(), 2u);
  EXPECT_FALSE(space.Resolve(*b, "b").ok());
  auto c = Add(space, 1, 4, 1);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *b);
  EXPECT_FALSE(space.Resolve(*b, "b").ok());
}

TEST(DeviceAddressSpaceTest, RemoveWantsTheStart) {
  DeviceAddressSpace space;
  auto a = Add(space, 64, 1, 64);
  ASSERT_TRUE(a.ok());
  auto inside = space.Remove(At(*a, 8));
  EXPECT_FALSE(inside.ok());
  EXPECT_THAT(inside.status().message(), HasSubstr("not the start"));
  EXPECT_EQ(space.size(), 1u);
  EXPECT_TRUE(space.Remove(*a).ok());
  EXPECT_FALSE(space.Remove(*a).ok());
}

TEST(DeviceAddressSpaceTest, ReleaseAllForgetsButNeverReusesAddresses) {
  DeviceAddressSpace space;
  auto a = Add(space, 64, 1, 64);
  ASSERT_TRUE(a.ok());
  space.ReleaseAll();
  EXPECT_EQ(space.size(), 0u);
  EXPECT_FALSE(space.Resolve(*a, "a").ok());
  auto b = Add(space, 64, 2, 64);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
}

// Each allocation remembers its device ordinal; releasing one device's
// (its session is gone) leaves the other devices' resolvable.
TEST(DeviceAddressSpaceTest, AllocationsKnowTheirDevice) {
  DeviceAddressSpace space;
  remote::DeviceBuffer on0 = Buffer(1, 16), on1 = Buffer(2, 16);
  auto a = space.Add(16, on0, /*device=*/0);
  auto b = space.Add(16, on1, /*device=*/1);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ra = space.Resolve(At(*a, 4), "a");
  auto rb = space.Resolve(*b, "b");
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->device, 0u);
  EXPECT_EQ(rb->device, 1u);
  EXPECT_EQ(rb->buffer, 2u);
  space.ReleaseDevice(1);
  EXPECT_EQ(space.size(), 1u);
  EXPECT_TRUE(space.Resolve(*a, "a").ok());
  EXPECT_FALSE(space.Resolve(*b, "b").ok());
}

TEST(DeviceAddressSpaceTest, HugeSizesAreRefusedWithoutWrapping) {
  DeviceAddressSpace space;
  for (uint64_t size : {~uint64_t{0}, ~uint64_t{0} - 4095, uint64_t{1} << 63,
                        uint64_t{1} << 44}) {
    auto a = Add(space, size, 1, 0);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << size;
  }
  // Just under the reserved 2^44 bytes fits, once.
  auto big = Add(space, (uint64_t{1} << 44) - 4096, 2, 0);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_FALSE(Add(space, 1, 3, 1).ok());
  auto r = space.Resolve(At(*big, (int64_t{1} << 44) - 4097), "end");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->available, 1u);
}

}  // namespace
}  // namespace opserver
