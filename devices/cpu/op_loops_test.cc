#include "devices/cpu/op_loops.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/half.h"
#include "kernels/kernel_params.h"
#include "kernels/ops/all.h"

namespace opserver::cpu {
namespace {

using kernels::DType;
using kernels::DTypes;
using kernels::KernelParams;

constexpr DType kF = DType::kFloat;
constexpr DType kH = DType::kFloat16;
constexpr DType kD = DType::kDouble;
constexpr DType kI8 = DType::kInt8;
constexpr DType kU8 = DType::kUint8;

const char* Bytes(const void* p) { return static_cast<const char*>(p); }
char* Bytes(void* p) { return static_cast<char*>(p); }

// SIMD where all three dtypes agree; DropoutBackward's mask is no vector of
// out's type, so there gradOutput and out decide.
TEST(OpLoops, SimdCombinations) {
  using kernels::DropoutBackward;
  using kernels::HardswishBackward;
  using kernels::LeakyReluBackward;
  using kernels::ThresholdBackward;
  static_assert(OpLoops<HardswishBackward>::Simd(DTypes{kF, kF, kF}));
  static_assert(!OpLoops<LeakyReluBackward>::Simd(DTypes{kF, kH, kF}));
  static_assert(!OpLoops<LeakyReluBackward>::Simd(DTypes{kF, kF, kD}));
  static_assert(OpLoops<ThresholdBackward>::Simd(DTypes{kI8, kI8, kI8}));
  static_assert(OpLoops<DropoutBackward>::Simd(DTypes{kH, kU8, kH}));
  static_assert(!OpLoops<DropoutBackward>::Simd(DTypes{kH, kU8, kF}));
  SUCCEED();
}

// The formula's strided loop follows each operand's stride: a stride-0
// self broadcasts one value, gradOutput is read every other element.
TEST(OpLoops, BinaryLoopFollowsStridesAndBroadcasts) {
  KernelParams p;
  p.threshold = 1.0f;
  const float grad[] = {4.5f, -1, 4.4f, -1, 4.3f, -1};
  const float self[] = {2.0f};
  float out[3] = {};
  const StridedFn fn =
      OpLoops<kernels::ThresholdBackward>::Strided<kF, kF, kF>();
  fn(p, Bytes(grad), 2 * sizeof(float), Bytes(self), 0, Bytes(out),
     sizeof(float), 3, 0);
  EXPECT_EQ(out[0], 4.5f);
  EXPECT_EQ(out[1], 4.4f);
  EXPECT_EQ(out[2], 4.3f);
  p.threshold = 2.0f;  // self 2 is not greater: nothing passes.
  fn(p, Bytes(grad), 2 * sizeof(float), Bytes(self), 0, Bytes(out),
     sizeof(float), 3, 0);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
}

// Integer self compares in its own type against floor(threshold); a
// threshold past the type's range decides every element at once.
TEST(OpLoops, IntegerThresholdComparesInItsOwnType) {
  const int8_t grad[] = {10, 20, 30, 40};
  const int8_t self[] = {-128, 1, 2, 127};
  int8_t out[4] = {};
  const StridedFn fn =
      OpLoops<kernels::ThresholdBackward>::Strided<kI8, kI8, kI8>();
  auto run = [&](double threshold) {
    KernelParams p;
    p.threshold_d = threshold;
    fn(p, Bytes(grad), 1, Bytes(self), 1, Bytes(out), 1, 4, 0);
    return std::vector<int>(out, out + 4);
  };
  EXPECT_EQ(run(1.5), (std::vector<int>{0, 0, 30, 40}));
  EXPECT_EQ(run(127.0), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(run(-129.0), (std::vector<int>{10, 20, 30, 40}));
  EXPECT_EQ(run(std::nan("")), (std::vector<int>{0, 0, 0, 0}));
}

// DropoutBackward reads bit bit_offset + i of the mask, selects rather
// than multiplies (a dropped NaN is 0), and rounds to gradOutput's dtype
// before the cast to out: FLOAT16 65504 * 2.5 is inf in a FLOAT out.
TEST(OpLoops, DropoutReadsMaskBitsAndRoundsBeforeTheCast) {
  const StridedFn fn =
      OpLoops<kernels::DropoutBackward>::Strided<kH, kU8, kF>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const uint16_t grad[] = {kernels::FloatToHalf(1.0f),
                           kernels::FloatToHalf(nan),
                           kernels::FloatToHalf(65504.0f)};
  const uint8_t mask[] = {0b1010u};  // From bit 1: kept, dropped, kept.
  float out[3] = {};
  KernelParams p;
  p.scale = 2.5f;
  fn(p, Bytes(grad), sizeof(uint16_t), Bytes(mask), 0, Bytes(out),
     sizeof(float), 3, /*bit_offset=*/1);
  EXPECT_EQ(out[0], 2.5f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_TRUE(std::isinf(out[2]));
  p.dropout_mode = kernels::DropoutMode::kZero;
  fn(p, Bytes(grad), sizeof(uint16_t), Bytes(mask), 0, Bytes(out),
     sizeof(float), 3, 1);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  p.dropout_mode = kernels::DropoutMode::kCopy;
  fn(p, Bytes(grad), sizeof(uint16_t), Bytes(mask), 0, Bytes(out),
     sizeof(float), 3, 1);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 65504.0f);
}

}  // namespace
}  // namespace opserver::cpu
