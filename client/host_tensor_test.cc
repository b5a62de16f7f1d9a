#include "client/host_tensor.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver::remote {
namespace {

using kernels::DType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HostTensorTest, EncodeDecodeRoundTripsEveryDtype) {
  const std::vector<double> values = {0, 1, 2, 100};
  for (DType dtype :
       {DType::kFloat, DType::kFloat16, DType::kBFloat16, DType::kDouble,
        DType::kInt8, DType::kUint8, DType::kInt16, DType::kUint16,
        DType::kInt32, DType::kUint32, DType::kInt64, DType::kUint64}) {
    auto bytes = EncodeValues(dtype, values);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(bytes->size(), values.size() * kernels::DTypeSize(dtype));
    EXPECT_EQ(DecodeValues(dtype, *bytes), values);
  }
}

TEST(HostTensorTest, HalfRoundsAndIntegersMustBeExact) {
  auto half = EncodeValues(DType::kFloat16, {0.1});
  ASSERT_TRUE(half.ok());
  EXPECT_THAT(DecodeValues(DType::kFloat16, *half),
              ElementsAre(0.0999755859375));
  auto bad = EncodeValues(DType::kInt8, {1.5});
  EXPECT_THAT(bad.status().message(), HasSubstr("not representable as INT8"));
  EXPECT_FALSE(EncodeValues(DType::kUint8, {256}).ok());
  EXPECT_FALSE(EncodeValues(DType::kBool, {2}).ok());
}

// The largest 64-bit values round to 2^63 / 2^64 in double, one past the
// range: casting those is undefined behaviour (issue 10), so they are
// refused, while the exact bounds below them are kept.
TEST(HostTensorTest, IntegerBoundsAreExactFor64BitTypes) {
  const double two63 = std::ldexp(1.0, 63);
  const double two64 = std::ldexp(1.0, 64);
  EXPECT_FALSE(EncodeValues(DType::kInt64, {two63}).ok());
  EXPECT_FALSE(EncodeValues(DType::kUint64, {two64}).ok());
  EXPECT_FALSE(EncodeValues(DType::kInt64, {-two63 * 2}).ok());
  EXPECT_FALSE(EncodeValues(DType::kUint64, {-1}).ok());
  EXPECT_FALSE(EncodeValues(DType::kInt32, {2147483648.0}).ok());
  auto low = EncodeValues(DType::kInt64, {-two63});
  ASSERT_TRUE(low.ok()) << low.status();
  EXPECT_THAT(DecodeValues(DType::kInt64, *low), ElementsAre(-two63));
  // 2^64 - 2048 is the largest double below 2^64.
  const double top = two64 - 2048;
  auto high = EncodeValues(DType::kUint64, {top});
  ASSERT_TRUE(high.ok()) << high.status();
  EXPECT_THAT(DecodeValues(DType::kUint64, *high), ElementsAre(top));
  EXPECT_TRUE(EncodeValues(DType::kInt32, {2147483647.0, -2147483648.0}).ok());
}

TEST(HostTensorTest, ParsesNumbersShapesAndDtypes) {
  auto values = ParseNumberList("1.5, -2,nan");
  ASSERT_TRUE(values.ok());
  EXPECT_EQ((*values)[0], 1.5);
  EXPECT_TRUE(std::isnan((*values)[2]));
  EXPECT_THAT(ParseNumberList("1,x").status().message(),
              HasSubstr("'x' is not a number"));
  EXPECT_THAT(*ParseShape("2,3"), ElementsAre(2, 3));
  EXPECT_TRUE(ParseShape("")->empty());
  EXPECT_FALSE(ParseShape("2,-1").ok());
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("ACL_FLOAT16"), DType::kFloat16);
  EXPECT_THAT(ParseDType("FLOAT128").status().message(),
              HasSubstr("unknown dtype 'FLOAT128'"));
}

TEST(HostTensorTest, NpyRoundTripAndErrors) {
  const std::string dir = ::testing::TempDir();
  HostTensor tensor;
  tensor.dtype = DType::kFloat;
  tensor.shape = {2, 3};
  tensor.bytes = *EncodeValues(DType::kFloat, {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(WriteNpy(dir + "/a.npy", tensor).ok());
  auto back = ReadNpy(dir + "/a.npy");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dtype, DType::kFloat);
  EXPECT_THAT(back->shape, ElementsAre(2, 3));
  EXPECT_EQ(back->bytes, tensor.bytes);

  tensor.shape = {6};
  tensor.dtype = DType::kInt32;
  ASSERT_TRUE(WriteNpy(dir + "/b.npy", tensor).ok());
  EXPECT_THAT(ReadNpy(dir + "/b.npy")->shape, ElementsAre(6));

  tensor.dtype = DType::kBFloat16;
  EXPECT_FALSE(WriteNpy(dir + "/c.npy", tensor).ok());
  EXPECT_EQ(ReadNpy(dir + "/missing.npy").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      WriteNpy(dir + "/d.npy", HostTensor{DType::kUint8, {0}, ""}).ok());
  EXPECT_EQ(ReadNpy(dir + "/d.npy")->numel(), 0);
}

// A .npy header's shape is hostile input; its size is
// computed with overflow checks (once UB, fatal under --config=asan).
TEST(HostTensorTest, NpyShapesThatOverflowAreRefused) {
  const std::string dir = ::testing::TempDir();
  for (const char* shape :
       {"(4294967296, 4294967296)", "(4611686018427387904, 4)",
        "(9223372036854775807, 9223372036854775807)"}) {
    std::string header = absl::StrCat(
        "{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string file = std::string("\x93NUMPY\x01\x00", 8);
    file += static_cast<char>(header.size() & 0xff);
    file += static_cast<char>(header.size() >> 8);
    file += header;
    const std::string path = dir + "/huge.npy";
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(file.data(), 1, file.size(), f);
    std::fclose(f);
    absl::StatusOr<HostTensor> read = ReadNpy(path);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument)
        << shape;
    EXPECT_THAT(std::string(read.status().message()), HasSubstr("too large"))
        << shape;
  }
}

}  // namespace
}  // namespace opserver::remote
