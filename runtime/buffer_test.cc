#include "runtime/buffer.h"

#include <atomic>
#include <memory>

#include "absl/status/statusor.h"
#include "devices/testing/fake_device.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

// A buffer counts in its device's accounting and every parent of it while
// it lives, and gives its device the memory back when it goes.
TEST(BufferTest, CountsInEveryAccountingUntilDestroyed) {
  FakeDevice device;
  MemoryAccounting server;
  MemoryAccounting per_device(&server);
  absl::StatusOr<void*> block = device.Allocate(100, /*owner=*/1);
  ASSERT_TRUE(block.ok()) << block.status();
  {
    Buffer buffer(&device, *block, 100, &per_device);
    EXPECT_EQ(buffer.data(), *block);
    EXPECT_EQ(buffer.size(), 100u);
    EXPECT_EQ(buffer.device(), &device);
    EXPECT_EQ(per_device.bytes.load(), 100u);
    EXPECT_EQ(per_device.buffers.load(), 1u);
    EXPECT_EQ(server.bytes.load(), 100u);
    EXPECT_EQ(server.buffers.load(), 1u);
    EXPECT_EQ(device.FreeBytes(), FakeDevice::kDefaultMemoryBytes - 100);
  }
  EXPECT_EQ(per_device.bytes.load(), 0u);
  EXPECT_EQ(per_device.buffers.load(), 0u);
  EXPECT_EQ(server.bytes.load(), 0u);
  EXPECT_EQ(server.buffers.load(), 0u);
  EXPECT_EQ(device.FreeBytes(), FakeDevice::kDefaultMemoryBytes);
}

// The session's and the tenant's charge is refunded when the memory is
// released, not before: marking the buffer freed (its handle gone) keeps it.
TEST(BufferTest, RefundsTheChargeOnlyWhenReleased) {
  FakeDevice device;
  MemoryAccounting account;
  auto session_bytes = std::make_shared<std::atomic<uint64_t>>(4096 + 7);
  auto tenant_bytes = std::make_shared<std::atomic<uint64_t>>(4096 + 9);
  absl::StatusOr<void*> block = device.Allocate(10, /*owner=*/1);
  ASSERT_TRUE(block.ok()) << block.status();
  auto buffer = std::make_shared<Buffer>(&device, *block, 10, &account,
                                         session_bytes, 4096, tenant_bytes);
  EXPECT_FALSE(buffer->freed());
  buffer->MarkFreed();
  EXPECT_TRUE(buffer->freed());
  EXPECT_EQ(session_bytes->load(), 4096u + 7);
  EXPECT_EQ(tenant_bytes->load(), 4096u + 9);
  buffer.reset();
  EXPECT_EQ(session_bytes->load(), 7u);
  EXPECT_EQ(tenant_bytes->load(), 9u);
  EXPECT_EQ(account.bytes.load(), 0u);
}

}  // namespace
}  // namespace opserver
