// kernels/tensor.h's checks on their own. Each case named Fuzz* is an input
// a fuzzer of //fuzz found (RELIABILITY.md, "Fuzzing"), kept here as a
// regression test; its input is also in the fuzzer's seed corpus.
#include "kernels/tensor.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"

namespace opserver::kernels {
namespace {

using ::testing::HasSubstr;

TensorView View(std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  TensorView v;
  v.dtype = DType::kFloat;
  v.shape = std::move(shape);
  v.strides = std::move(strides);
  return v;
}

TEST(CheckTensorBounds, EmptyViewsNeedNoStorage) {
  EXPECT_TRUE(CheckTensorBounds(View({3, 0, 2}), 0).ok());
  EXPECT_TRUE(CheckTensorBounds(View({0}, {1 << 20}), 0).ok());
  int64_t max_element = 0;
  ASSERT_TRUE(CheckTensorLayout(View({4, 0}), "t", &max_element).ok());
  EXPECT_EQ(max_element, -1);
}

// tensor_view_fuzzer: an empty view whose other dims multiply past int64
// was refused when they came before the zero dim and accepted when they
// came after it. Now it is refused in any order (every product of dims of
// an accepted view fits int64), and an empty view whose dims fit is
// accepted in any order.
TEST(CheckTensorBounds, FuzzEmptyViewDimOrderDoesNotMatter) {
  const int64_t k = 4096;
  const std::vector<std::vector<int64_t>> overflowing = {
      {k, k, k, k, k, 176, 0},  // The fuzzer's input.
      {0, k, k, k, k, k, 176},
      {k, k, k, 0, k, k, 176},
  };
  for (const auto& shape : overflowing) {
    absl::Status s = CheckTensorBounds(View(shape), 1 << 20, "t");
    EXPECT_EQ(GetAclnnStatus(s), kAclnnErrParamInvalid) << s;
    EXPECT_THAT(s.message(), HasSubstr("overflows int64"));
  }
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{k, k, k, k, 0}, std::vector<int64_t>{0, k, k, k, k},
        std::vector<int64_t>{int64_t{1} << 62, 0, 1}}) {
    EXPECT_TRUE(CheckTensorBounds(View(shape), 0, "t").ok());
  }
}

TEST(CheckTensorBounds, ExtentMustFit) {
  EXPECT_TRUE(CheckTensorBounds(View({2, 3}), 24).ok());
  EXPECT_FALSE(CheckTensorBounds(View({2, 3}), 23).ok());
  TensorView v = View({2, 3}, {8, 2});
  v.offset = 1;
  // Furthest element: 1 + 8 + 4 = 13, so 14 floats.
  EXPECT_TRUE(CheckTensorBounds(v, 56).ok());
  EXPECT_FALSE(CheckTensorBounds(v, 55).ok());
  v.strides = {int64_t{1} << 62, 1};
  EXPECT_THAT(CheckTensorBounds(v, 1 << 20).message(), HasSubstr("overflow"));
}

TEST(CheckNoInternalOverlap, DistinctElementsOnly) {
  EXPECT_TRUE(CheckNoInternalOverlap(View({3, 4}, {1, 3})).ok());
  EXPECT_FALSE(CheckNoInternalOverlap(View({3, 4}, {1, 2})).ok());
  EXPECT_FALSE(CheckNoInternalOverlap(View({1 << 30}, {0})).ok());
  EXPECT_TRUE(CheckNoInternalOverlap(View({0, 5}, {0, 0})).ok());
}

}  // namespace
}  // namespace opserver::kernels
