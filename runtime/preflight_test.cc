#include "runtime/preflight.h"

#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "devices/device_factory.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"
#include "runtime/executor.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Device> Cpu() {
  DeviceOptions options;
  options.threads = 1;
  options.memory_cache_bytes = 0;
  options.memory_bytes = 64 << 20;
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(options);
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *std::move(device) : nullptr;
}

// One request per operator, each of which the CPU device accepts (every
// argument and parameter present, the mask's size right).
TEST(PreflightTest, EveryOperatorHasARequestTheCpuDeviceRuns) {
  const auto requests = PreflightRequests();
  ASSERT_EQ(requests.size(), kernels::OpRegistry().size());
  std::unique_ptr<Device> cpu = Cpu();
  for (const v1::EvaluateRequest& request : requests) {
    absl::StatusOr<v1::ValueTensor> out = RunEvaluate(request, cpu.get(), 64);
    ASSERT_TRUE(out.ok()) << request.op() << ": " << out.status();
    EXPECT_EQ(out->values_size(), 8) << request.op();
  }
}

// A device that computes as the CPU device does passes, with a line per
// device and operator and the devices listed with their memory.
TEST(PreflightTest, AnAgreeingDevicePasses) {
  std::unique_ptr<Device> cpu = Cpu();
  FakeDevice fake;  // Plans and computes as the CPU device, asynchronously.
  std::ostringstream out;
  EXPECT_TRUE(RunPreflight({&fake, cpu.get()}, *cpu, out)) << out.str();
  const std::string report = out.str();
  EXPECT_THAT(report, HasSubstr("device 0: fake"));
  EXPECT_THAT(report, HasSubstr("GiB free"));
  EXPECT_THAT(report, HasSubstr("device 1: cpu"));
  for (const kernels::OpInfo& op : kernels::OpRegistry()) {
    EXPECT_THAT(report, HasSubstr(absl::StrCat("device 0 ", op.name, ": ok")));
    EXPECT_THAT(report, HasSubstr(absl::StrCat("device 1 ", op.name, ": ok")));
  }
  EXPECT_THAT(report, HasSubstr("preflight passed: 10 of 10"));
}

// A device that lacks an operator, or whose kernel faults, fails the
// preflight naming the operator and the error.
class MissingOpDevice : public FakeDevice {
 public:
  bool SupportsOp(kernels::OpKind op) const override {
    return op != kernels::OpKind::kHardswishBackward;
  }
};

TEST(PreflightTest, AMissingOperatorOrAFaultFails) {
  std::unique_ptr<Device> cpu = Cpu();
  MissingOpDevice missing;
  std::ostringstream out;
  EXPECT_FALSE(RunPreflight({&missing}, *cpu, out));
  EXPECT_THAT(out.str(),
              HasSubstr("device 0 HardswishBackward: ERROR: UNIMPLEMENTED"));
  EXPECT_THAT(out.str(), HasSubstr("device 0 ThresholdBackward: ok"));
  EXPECT_THAT(out.str(), HasSubstr("preflight FAILED: 4 of 5"));

  FakeDevice faulty;
  faulty.FailNextSynchronize(absl::InternalError("kernel fault 507015"));
  std::ostringstream faulted;
  EXPECT_FALSE(RunPreflight({&faulty}, *cpu, faulted));
  EXPECT_THAT(faulted.str(), HasSubstr("kernel fault 507015"));
  EXPECT_THAT(faulted.str(), HasSubstr("preflight FAILED: 4 of 5"));
}

TEST(PreflightTest, CompareOutputsIsBitExact) {
  v1::ValueTensor a;
  a.set_dtype(v1::FLOAT);
  a.add_shape(3);
  a.add_values(1.0);
  a.add_values(std::numeric_limits<double>::quiet_NaN());
  a.add_values(0.0);
  v1::ValueTensor b = a;
  EXPECT_EQ(CompareOutputs(a, b), "") << "NaN matches NaN";
  b.set_values(2, -0.0);
  EXPECT_EQ(CompareOutputs(a, b), "element 2 is 0, the CPU device's -0");
  b = a;
  b.set_values(0, 1.0000001);
  EXPECT_THAT(CompareOutputs(a, b), HasSubstr("element 0 is 1,"));
  b = a;
  b.set_shape(0, 4);
  EXPECT_EQ(CompareOutputs(a, b), "the output shape differs");
  b = a;
  b.set_dtype(v1::FLOAT16);
  EXPECT_THAT(CompareOutputs(a, b), HasSubstr("dtype"));
}

}  // namespace
}  // namespace opserver
