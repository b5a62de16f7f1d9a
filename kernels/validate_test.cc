#include "kernels/validate.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"

namespace opserver::kernels {
namespace {

using ::testing::ElementsAre;

// Validate answers what GetWorkspaceSize promises with no device and no
// kernels (devices/cpu/plan_test.cc checks that the CPU planner agrees).

TensorView View(DType dtype, std::vector<int64_t> shape, void* data,
                std::vector<int64_t> strides = {}) {
  TensorView t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.data = data;
  return t;
}

TEST(Validate, BroadcastShapeAndParams) {
  std::vector<float> g(6), s(3), o(6);
  OpCall call;
  call.op = OpKind::kThresholdBackward;
  call.grad_output = View(DType::kFloat, {2, 3}, g.data());
  call.self = View(DType::kFloat, {3}, s.data());
  call.out = View(DType::kFloat, {2, 3}, o.data());
  call.params.threshold = 1.5;
  absl::StatusOr<ValidCall> v = Validate(call);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(v->out_shape, ElementsAre(2, 3));
  EXPECT_EQ(v->workspace_size, 0u);
  EXPECT_EQ(v->params.threshold, 1.5f);
}

// Each operator's checks (what Validate accepts) and its kKernels (what the
// kernel table holds) are written side by side in its definition
// (kernels/ops/); they must name exactly the same dtype combinations, or a
// valid call would have no kernel (an internal error) or a kernel would be
// dead code.
TEST(BroadcastShapes, AlignsRightAndStretchesOnes) {
  EXPECT_EQ(BroadcastShapes({2, 1, 4}, {3, 1}),
            (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(BroadcastShapes({}, {5}), (std::vector<int64_t>{5}));
  EXPECT_EQ(BroadcastShapes({0}, {1}), (std::vector<int64_t>{0}));
  size_t mismatch = 99;
  EXPECT_EQ(BroadcastShapes({2, 3, 4}, {5, 4}, &mismatch), std::nullopt);
  EXPECT_EQ(mismatch, 1u);
}

// opctl run fills absent flags from these (through ListOperators).
TEST(Validate, EveryScalarHasADefault) {
  for (const OpInfo& op : OpRegistry()) {
    for (const ScalarArgInfo& scalar : op.scalars) {
      SCOPED_TRACE(std::string(op.name) + " " + std::string(scalar.name));
      ASSERT_TRUE(scalar.default_value.has_value());
      EXPECT_EQ(scalar.type == "scalar", !scalar.dtypes.empty());
      if (scalar.type == "bool") {
        EXPECT_TRUE(*scalar.default_value == 0 || *scalar.default_value == 1);
      }
    }
  }
  EXPECT_EQ(GetOpInfo(OpKind::kThresholdBackward).scalars[0].default_value, 0);
  EXPECT_EQ(GetOpInfo(OpKind::kSoftshrinkBackward).scalars[0].default_value,
            0.5);
  EXPECT_EQ(GetOpInfo(OpKind::kLeakyReluBackward).scalars[0].default_value,
            0.01);
  EXPECT_EQ(GetOpInfo(OpKind::kLeakyReluBackward).scalars[0].dtypes[0],
            DType::kFloat);
  EXPECT_EQ(GetOpInfo(OpKind::kDropoutBackward).scalars[0].default_value, 2);
}

}  // namespace
}  // namespace opserver::kernels
