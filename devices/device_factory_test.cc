#include "devices/device_factory.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// --devices=N: N CPU devices, each with its own page-rounded share of the
// capacity, allocating independently.
TEST(CreateDevicesTest, SplitsTheCpuDeviceMemory) {
  DeviceOptions options;
  options.threads = 3;
  options.devices = 2;
  // Not a multiple of two pages: each share rounds down to 32 MiB.
  options.memory_bytes = (64ull << 20) + 4096 + 1;
  options.memory_cache_bytes = 1 << 20;
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices =
      CreateDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  for (const std::unique_ptr<Device>& device : *devices) {
    EXPECT_EQ(device->Describe().kind, "cpu");
    EXPECT_EQ(device->Describe().memory_bytes, 32ull << 20);
    EXPECT_EQ(device->Describe().threads, 3u) << "the shared pool";
    EXPECT_EQ(device->FreeBytes(), 32ull << 20);
  }
  Device& zero = *(*devices)[0];
  Device& one = *(*devices)[1];
  absl::StatusOr<void*> all = zero.Allocate(32ull << 20, 1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(zero.FreeBytes(), 0u);
  EXPECT_EQ(zero.Allocate(4096, 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Device 1 is untouched by device 0 being full.
  EXPECT_EQ(one.FreeBytes(), 32ull << 20);
  absl::StatusOr<void*> other = one.Allocate(4096, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(one.FreeBytes(), (32ull << 20) - 4096);
  one.Deallocate(*other, 4096);
  zero.Deallocate(*all, 32ull << 20);
  // Cached memory gives way to new allocations: it counts as free.
  EXPECT_EQ(zero.FreeBytes(), 32ull << 20);
  EXPECT_EQ(one.FreeBytes(), 32ull << 20);
}

TEST(CreateDevicesTest, OneDeviceByDefault) {
  DeviceOptions options;
  options.memory_bytes = 1 << 20;
  absl::StatusOr<std::vector<std::unique_ptr<Device>>> devices =
      CreateDevices(options);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0]->Describe().memory_bytes, 1u << 20);
}

TEST(CreateDevicesTest, RefusesBadCounts) {
  DeviceOptions options;
  options.memory_bytes = 1 << 20;
  for (int count : {0, -1, 65}) {
    options.devices = count;
    absl::Status status = CreateDevices(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << count;
    EXPECT_THAT(status.message(), HasSubstr("devices must be 1 to 64"));
  }
  // Less than a page each.
  options.devices = 3;
  options.memory_bytes = 8192;
  EXPECT_THAT(CreateDevices(options).status().message(),
              HasSubstr("cannot be split into 3 devices"));
  options.memory_bytes = 1 << 20;
  options.kind = "tpu";
  EXPECT_THAT(CreateDevices(options).status().message(),
              HasSubstr("unknown device 'tpu'"));
}

}  // namespace
}  // namespace opserver
