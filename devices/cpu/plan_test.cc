#include "devices/cpu/plan.h"

#include <cstdint>
#include <string>
#include <vector>

#include "devices/cpu/kernel_table.h"
#include "devices/cpu/plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"

namespace opserver::kernels {
namespace {

using cpu::FindKernel;
using cpu::Plan;
using cpu::PrepareOp;

using ::testing::ElementsAre;

// The CPU planner against the shared checks: a client answers
// GetWorkspaceSize from kernels::Validate alone, so PrepareOp must agree
// with it exactly (statuses, workspace sizes) and have a kernel for every
// dtype combination it accepts.

TensorView View(DType dtype, std::vector<int64_t> shape, void* data,
                std::vector<int64_t> strides = {}) {
  TensorView t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  t.data = data;
  return t;
}

OpCall Dropout(const TensorView& g, const TensorView& mask,
               const TensorView& out, double scale) {
  OpCall call;
  call.op = OpKind::kDropoutBackward;
  call.grad_output = g;
  call.self = mask;
  call.out = out;
  call.params.scale = scale;
  return call;
}

TEST(Validate, WorkspaceHoldsANonContiguousMaskUnlessEmpty) {
  std::vector<float> g(256), o(256);
  std::vector<uint8_t> mask(64);
  // 32 mask bytes, every other one of 64: not contiguous, gathered.
  const OpCall strided = Dropout(View(DType::kFloat, {256}, g.data()),
                                 View(DType::kUint8, {32}, mask.data(), {2}),
                                 View(DType::kFloat, {256}, o.data()), 2.0);
  absl::StatusOr<ValidCall> v = Validate(strided);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->workspace_size, 32u);
  absl::StatusOr<Plan> plan = PrepareOp(strided);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace_size(), v->workspace_size);
  // Contiguous: none.
  const OpCall contiguous = Dropout(View(DType::kFloat, {256}, g.data()),
                                    View(DType::kUint8, {32}, mask.data()),
                                    View(DType::kFloat, {256}, o.data()), 2.0);
  v = Validate(contiguous);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->workspace_size, 0u);
  // Empty: nothing to gather, whatever the mask's layout.
  const OpCall empty = Dropout(View(DType::kFloat, {0}, g.data()),
                               View(DType::kUint8, {0}, mask.data(), {2}),
                               View(DType::kFloat, {0}, o.data()), 2.0);
  v = Validate(empty);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->workspace_size, 0u);
  plan = PrepareOp(empty);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace_size(), 0u);
}

TEST(Validate, SameStatusAsThePlanner) {
  std::vector<float> g(4), o(4);
  std::vector<uint8_t> mask(16);
  const std::vector<OpCall> bad = {
      // Missing tensor: 161001.
      [&] {
        OpCall c = Dropout(View(DType::kFloat, {4}, g.data()),
                           View(DType::kUint8, {16}, mask.data()),
                           View(DType::kFloat, {4}, o.data()), 2.0);
        c.self.reset();
        return c;
      }(),
      // Null data: 161001.
      Dropout(View(DType::kFloat, {4}, nullptr),
              View(DType::kUint8, {16}, mask.data()),
              View(DType::kFloat, {4}, o.data()), 2.0),
      // Wrong mask size, bad scale, out overlapping itself: 161002.
      Dropout(View(DType::kFloat, {4}, g.data()),
              View(DType::kUint8, {8}, mask.data()),
              View(DType::kFloat, {4}, o.data()), 2.0),
      Dropout(View(DType::kFloat, {4}, g.data()),
              View(DType::kUint8, {16}, mask.data()),
              View(DType::kFloat, {4}, o.data()), 0.5),
      Dropout(View(DType::kFloat, {4}, g.data()),
              View(DType::kUint8, {16}, mask.data()),
              View(DType::kFloat, {4}, o.data(), {0}), 2.0),
  };
  const int want[] = {161001, 161001, 161002, 161002, 161002};
  for (size_t i = 0; i < bad.size(); ++i) {
    absl::StatusOr<ValidCall> v = Validate(bad[i]);
    absl::StatusOr<Plan> plan = PrepareOp(bad[i]);
    ASSERT_FALSE(v.ok()) << i;
    ASSERT_FALSE(plan.ok()) << i;
    EXPECT_EQ(GetAclnnStatus(v.status()), want[i]) << i << v.status();
    EXPECT_EQ(v.status(), plan.status()) << i;
  }
}

TEST(Validate, AcceptsExactlyTheDTypesThatHaveKernels) {
  const DType all[] = {DType::kFloat,   DType::kFloat16, DType::kInt8,
                       DType::kInt32,   DType::kUint8,   DType::kInt16,
                       DType::kUint16,  DType::kUint32,  DType::kInt64,
                       DType::kUint64,  DType::kDouble,  DType::kBool,
                       DType::kBFloat16};
  alignas(8) char g[8], s[16], o[8];
  int accepted = 0;
  for (const OpInfo& info : OpRegistry()) {
    for (DType gd : all) {
      for (DType sd : all) {
        for (DType od : all) {
          OpCall call;
          call.op = info.kind;
          call.params.negative_slope = Scalar::Float(0.5, DType::kFloat);
          call.params.scale = 2;
          call.grad_output = View(gd, {1}, g);
          // A bit mask of one element is align(1, 128) / 8 = 16 bytes.
          call.self = View(sd, {info.bit_mask_input ? 16 : 1}, s);
          call.out = View(od, {1}, o);
          const bool valid = Validate(call).ok();
          const bool has_kernel = FindKernel(info.kind, gd, sd, od) != nullptr;
          EXPECT_EQ(valid, has_kernel)
              << info.name << " " << DTypeName(gd) << " " << DTypeName(sd)
              << " " << DTypeName(od);
          accepted += valid;
        }
      }
    }
  }
  // 6 + 9 + 3 + 64 + 12 combinations.
  EXPECT_EQ(accepted, 94);
}

}  // namespace
}  // namespace opserver::kernels
