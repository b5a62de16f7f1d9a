#include "common/values.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using kernels::DType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ValuesTest, FloatTypesRoundTrip) {
  for (DType d :
       {DType::kFloat, DType::kDouble, DType::kFloat16, DType::kBFloat16}) {
    auto bytes = EncodeValues(d, {0.5, -2, 1024, 0});
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_THAT(DecodeValues(d, bytes->data(), 4),
                ElementsAre(0.5, -2, 1024, 0));
  }
}

TEST(ValuesTest, HalfRoundsToNearestEvenFromDouble) {
  // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties go
  // to the even one, 1. Slightly above halfway rounds up.
  auto bytes = EncodeValues(
      DType::kFloat16,
      {1 + std::ldexp(1, -11), 1 + std::ldexp(1, -11) + std::ldexp(1, -30)});
  ASSERT_TRUE(bytes.ok());
  EXPECT_THAT(DecodeValues(DType::kFloat16, bytes->data(), 2),
              ElementsAre(1.0, 1 + std::ldexp(1, -10)));
}

TEST(ValuesTest, BFloat16KeepsNanAndInf) {
  const double inf = std::numeric_limits<double>::infinity();
  auto bytes = EncodeValues(DType::kBFloat16, {std::nan(""), -inf});
  ASSERT_TRUE(bytes.ok());
  auto back = DecodeValues(DType::kBFloat16, bytes->data(), 2);
  EXPECT_TRUE(std::isnan(back[0]));
  EXPECT_EQ(back[1], -inf);
}

TEST(ValuesTest, IntegersMustBeExactAndInRange) {
  auto ok = EncodeValues(DType::kInt8, {-128, 127, 0});
  ASSERT_TRUE(ok.ok());
  EXPECT_THAT(DecodeValues(DType::kInt8, ok->data(), 3),
              ElementsAre(-128, 127, 0));
  EXPECT_THAT(EncodeValues(DType::kInt8, {128}).status().message(),
              HasSubstr("values[0] = 128"));
  EXPECT_FALSE(EncodeValues(DType::kUint8, {-1}).ok());
  EXPECT_FALSE(EncodeValues(DType::kInt32, {1.5}).ok());
  EXPECT_FALSE(EncodeValues(DType::kInt32, {std::nan("")}).ok());
  EXPECT_FALSE(EncodeValues(DType::kInt64, {std::ldexp(1, 63)}).ok());
  EXPECT_TRUE(EncodeValues(DType::kUint64, {std::ldexp(1, 63)}).ok());
  EXPECT_FALSE(EncodeValues(DType::kBool, {2}).ok());
  auto b = EncodeValues(DType::kBool, {1, 0});
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(DecodeValues(DType::kBool, b->data(), 2), ElementsAre(1, 0));
}

TEST(ValuesTest, FloatBytesAreIeee) {
  auto bytes = EncodeValues(DType::kFloat, {1.0});
  ASSERT_TRUE(bytes.ok());
  float f;
  std::memcpy(&f, bytes->data(), 4);
  EXPECT_EQ(f, 1.0f);
}

}  // namespace
}  // namespace opserver
