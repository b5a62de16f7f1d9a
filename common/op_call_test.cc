#include "common/op_call.h"

#include <string>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"

namespace opserver {
namespace {

using kernels::DType;

kernels::OpParams Params(absl::string_view op, const v1::OpParams& in) {
  kernels::OpParams out;
  const kernels::OpInfo* info = kernels::FindOp(op);
  EXPECT_NE(info, nullptr) << op;
  if (info == nullptr) return out;
  absl::Status status = SetParams(*info, in, &out);
  EXPECT_TRUE(status.ok()) << op << ": " << status;
  return out;
}

// The value the call got for the parameter ListOperators names `name`.
double Applied(const kernels::OpParams& p, absl::string_view name) {
  if (name == "threshold") return p.threshold;
  if (name == "lambd") return p.lambd;
  if (name == "negativeSlope") return p.negative_slope.AsDouble();
  if (name == "selfIsResult") return p.self_is_result ? 1 : 0;
  if (name == "scale") return p.scale;
  ADD_FAILURE() << "a parameter this test does not know: " << name;
  return -1;
}

// Every default ListOperators advertises is what a request that leaves the
// parameter out gets.
TEST(SetParamsTest, EveryAdvertisedDefaultIsApplied) {
  for (const kernels::OpInfo& op : kernels::OpRegistry()) {
    const kernels::OpParams got = Params(op.name, v1::OpParams());
    for (const kernels::ScalarArgInfo& arg : op.scalars) {
      if (!arg.default_value.has_value()) continue;
      // A "scalar" holds the default as its dtype (dtypes[0]) holds it.
      const double want =
          arg.type == "scalar"
              ? kernels::Scalar::Float(*arg.default_value, arg.dtypes[0])
                    .AsDouble()
              : *arg.default_value;
      EXPECT_EQ(Applied(got, arg.name), want) << op.name << " " << arg.name;
    }
  }
}

TEST(SetParamsTest, LeakyReluWithoutSlopeUsesFloat001) {
  const kernels::OpParams got = Params("LeakyReluBackward", v1::OpParams());
  EXPECT_EQ(got.negative_slope.dtype, DType::kFloat);
  EXPECT_EQ(got.negative_slope.f, 0.01);
}

TEST(SetParamsTest, GivenValuesWinEvenWhenZero) {
  v1::OpParams in;
  in.set_lambd(0);
  in.set_scale(0);
  in.mutable_negative_slope()->set_dtype(v1::DOUBLE);  // value 0
  EXPECT_EQ(Params("SoftshrinkBackward", in).lambd, 0);
  EXPECT_EQ(Params("DropoutBackward", in).scale, 0);
  const kernels::OpParams leaky = Params("LeakyReluBackward", in);
  EXPECT_EQ(leaky.negative_slope.dtype, DType::kDouble);
  EXPECT_EQ(leaky.negative_slope.f, 0);
}

TEST(SetParamsTest, LeftOutInJsonToo) {
  v1::OpParams in;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage("{}", &in).ok());
  EXPECT_EQ(Params("SoftshrinkBackward", in).lambd, 0.5);
  EXPECT_EQ(Params("DropoutBackward", in).scale, 2);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"lambd": 0, "scale": 0})", &in)
                  .ok());
  EXPECT_EQ(Params("SoftshrinkBackward", in).lambd, 0);
  EXPECT_EQ(Params("DropoutBackward", in).scale, 0);
}

// Both names of aclDataType 27 parse from JSON (copied from the docs or
// from CANN), and JSON prints the one every other surface prints.
TEST(DTypeNamesTest, JsonAcceptsBothNamesOfBFloat16AndPrintsOne) {
  for (const char* name : {"BF16", "BFLOAT16"}) {
    v1::ScalarValue scalar;
    const std::string json =
        std::string(R"({"dtype": ")") + name + R"(", "value": 0.25})";
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &scalar).ok())
        << json;
    EXPECT_EQ(scalar.dtype(), 27) << name;
    std::string printed;
    ASSERT_TRUE(
        google::protobuf::util::MessageToJsonString(scalar, &printed).ok());
    EXPECT_EQ(printed, R"({"dtype":"BFLOAT16","value":0.25})");
  }
  EXPECT_EQ(kernels::DTypeName(DType::kBFloat16), "BFLOAT16");
  EXPECT_EQ(v1::DataType_Name(v1::BF16), "BFLOAT16");
}

TEST(DTypeNamesTest, EveryWireNameIsTheKernelsName) {
  const google::protobuf::EnumDescriptor* e = v1::DataType_descriptor();
  for (int i = 0; i < e->value_count(); ++i) {
    const auto* value = e->value(i);
    const DType dtype = static_cast<DType>(value->number());
    ASSERT_TRUE(kernels::IsKnownDType(value->number())) << value->name();
    if (value->name() == "BF16") continue;  // The alias.
    EXPECT_EQ(kernels::DTypeName(dtype), value->name());
  }
}

}  // namespace
}  // namespace opserver
