#include "kernels/elementwise_simd.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace opserver::kernels {
namespace {

// Every operator/dtype the SIMD list names is reachable, and nothing else:
// a broken list would silently fall back to the (correct, slower) strided
// kernels, which the result tests cannot see.
TEST(SimdContigKernel, CoversExactlyTheListedOperatorsAndDTypes) {
  const std::vector<std::pair<OpKind, std::vector<DType>>> simd = {
      {OpKind::kThresholdBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16, DType::kInt32,
        DType::kInt8, DType::kUint8}},
      {OpKind::kSoftshrinkBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16}},
      {OpKind::kHardswishBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16}},
      {OpKind::kLeakyReluBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16, DType::kDouble}},
      {OpKind::kDropoutBackward,
       {DType::kFloat, DType::kFloat16, DType::kBFloat16}},
  };
  const DType all[] = {DType::kFloat,  DType::kFloat16, DType::kInt8,
                       DType::kInt32,  DType::kUint8,   DType::kInt16,
                       DType::kUint16, DType::kUint32,  DType::kInt64,
                       DType::kUint64, DType::kDouble,  DType::kBool,
                       DType::kBFloat16};
  for (const auto& [op, dtypes] : simd) {
    for (DType d : all) {
      bool listed = false;
      for (DType l : dtypes) listed = listed || l == d;
      EXPECT_EQ(SimdContigKernel(op, d) != nullptr, listed)
          << static_cast<int>(op) << " " << DTypeName(d);
    }
  }
  // Distinct kernels for distinct entries.
  EXPECT_NE(SimdContigKernel(OpKind::kThresholdBackward, DType::kFloat),
            SimdContigKernel(OpKind::kHardswishBackward, DType::kFloat));
  EXPECT_NE(SimdContigKernel(OpKind::kLeakyReluBackward, DType::kFloat),
            SimdContigKernel(OpKind::kLeakyReluBackward, DType::kDouble));
}

}  // namespace
}  // namespace opserver::kernels
