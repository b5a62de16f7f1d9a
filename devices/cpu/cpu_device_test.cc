#include "devices/cpu/cpu_device.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"

namespace opserver::cpu {
namespace {

using ::testing::HasSubstr;

// ThresholdBackward over `n` floats at `data` (in place).
kernels::ValidCall Threshold(float* data, int64_t n, double threshold) {
  kernels::TensorView view;
  view.dtype = kernels::DType::kFloat;
  view.shape = {n};
  view.data = data;
  kernels::OpCall call;
  call.op = kernels::OpKind::kThresholdBackward;
  call.grad_output = view;
  call.self = view;
  call.out = view;
  call.params.threshold = threshold;
  absl::StatusOr<kernels::ValidCall> valid = kernels::Validate(call);
  EXPECT_TRUE(valid.ok()) << valid.status();
  return *std::move(valid);
}

// Prepare keeps the shared contract (the workspace size and output shape
// Validate computed) and its stream runs it.
TEST(CpuDeviceTest, PreparesWhatValidateAcceptedAndLaunchesIt) {
  CpuDevice device(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  std::vector<float> x = {-1, 0.5f, 2, 3};
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan =
      device.Prepare(Threshold(x.data(), 4, 1.0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ((*plan)->device(), &device);
  EXPECT_EQ((*plan)->workspace_size(), 0u);
  EXPECT_EQ((*plan)->numel(), 4);
  EXPECT_EQ((*plan)->valid().out_shape, std::vector<int64_t>{4});
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = device.CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Launch(**plan, nullptr, 0).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  // self <= threshold gives 0; otherwise gradOutput (the same values).
  EXPECT_EQ(x, (std::vector<float>{0, 0, 2, 3}));
}

// A stream runs only its own device's plans: another device's (even a CPU
// device's, whose memory the host could reach) is refused, not
// reinterpreted.
TEST(CpuDeviceTest, RefusesAPlanAnotherDevicePrepared) {
  CpuDevice one(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  CpuDevice two(/*threads=*/1, /*pool_cache_bytes=*/0, 1 << 20);
  std::vector<float> x = {-1, 2};
  absl::StatusOr<std::unique_ptr<DevicePlan>> plan =
      one.Prepare(Threshold(x.data(), 2, 0.0));
  ASSERT_TRUE(plan.ok());
  absl::StatusOr<std::unique_ptr<DeviceStream>> stream = two.CreateStream();
  ASSERT_TRUE(stream.ok());
  absl::Status status = (*stream)->Launch(**plan, nullptr, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("another device"));
  EXPECT_EQ(x, (std::vector<float>{-1, 2})) << "nothing ran";
  // A plain DevicePlan (no CPU plan in it) is refused the same way.
  DevicePlan bare(&two, Threshold(x.data(), 2, 0.0));
  EXPECT_EQ((*stream)->Launch(bare, nullptr, 0).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace opserver::cpu
