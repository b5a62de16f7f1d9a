#include "client/op_catalog.h"

#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"

namespace opserver::remote {
namespace {

using kernels::DType;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

v1::ListOperatorsResponse Parse(const std::string& text) {
  v1::ListOperatorsResponse response;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &response))
      << text;
  return response;
}

// What the server sends for two operators (dtypes as aclDataType numbers).
constexpr char kTwoOps[] = R"pb(
  operators {
    name: "LeakyReluBackward"
    aclnn_name: "aclnnLeakyReluBackward"
    tensors {
      name: "gradOutput"
      role: "input"
      dtypes: [ 0, 1 ]
    }
    tensors {
      name: "self"
      role: "input"
      dtypes: [ 0, 1 ]
    }
    tensors {
      name: "out"
      role: "output"
      dtypes: [ 0, 1, 11 ]
    }
    params {
      name: "negative_slope"
      aclnn_name: "negativeSlope"
      type: "scalar"
      default_value: 0.01
      dtypes: [ 0, 3 ]
    }
    params {
      name: "self_is_result"
      aclnn_name: "selfIsResult"
      type: "bool"
      default_value: 0
    }
  }
  operators {
    name: "DropoutBackward"
    aclnn_name: "aclnnDropoutBackward"
    tensors {
      name: "gradOutput"
      role: "input"
      dtypes: [ 0 ]
    }
    tensors {
      name: "mask"
      role: "input"
      dtypes: [ 4 ]
    }
    tensors {
      name: "out"
      role: "output"
      dtypes: [ 0 ]
    }
    params { name: "scale" aclnn_name: "scale" type: "double" }
  }
)pb";

TEST(OpCatalog, ParsesWhatTheServerSends) {
  OpCatalog catalog = ParseCatalog(Parse(kTwoOps));
  EXPECT_THAT(catalog.rejected, IsEmpty());
  ASSERT_THAT(catalog.ops, SizeIs(2));
  const OpSignature& leaky = catalog.ops[0];
  EXPECT_EQ(leaky.inputs[1].name, "self");
  EXPECT_EQ(leaky.output.name, "out");
  EXPECT_THAT(leaky.output.dtypes,
              ElementsAre(DType::kFloat, DType::kFloat16, DType::kDouble));
  ASSERT_THAT(leaky.params, SizeIs(2));
  EXPECT_EQ(leaky.params[0].name, "negativeSlope");
  EXPECT_EQ(leaky.params[0].default_value, 0.01);
  EXPECT_EQ(leaky.params[0].default_dtype(), DType::kFloat);
  EXPECT_EQ(leaky.params[1].default_value, 0);
  // No default: the caller must give one.
  EXPECT_FALSE(catalog.ops[1].params[0].default_value.has_value());

  EXPECT_EQ(catalog.Find("aclnnleakyrelubackward"), &leaky);
  EXPECT_EQ(catalog.Find("DROPOUTBACKWARD"), &catalog.ops[1]);
  EXPECT_EQ(catalog.Find("Relu"), nullptr);
  EXPECT_EQ(catalog.Names(), "LeakyReluBackward, DropoutBackward");
  EXPECT_EQ(OpCatalog().Names(), "none");
}

TEST(OpCatalog, SetParamWritesTheListedField) {
  OpCatalog catalog = ParseCatalog(Parse(kTwoOps));
  ASSERT_THAT(catalog.ops, SizeIs(2));
  v1::OpParams params;
  SetParam(catalog.ops[0].params[0], 2.5, DType::kInt32, &params);
  SetParam(catalog.ops[0].params[1], 1, DType::kFloat, &params);
  SetParam(catalog.ops[1].params[0], 2, DType::kFloat, &params);
  EXPECT_EQ(params.negative_slope().dtype(), v1::DataType::INT32);
  EXPECT_EQ(params.negative_slope().value(), 2.5);
  EXPECT_TRUE(params.self_is_result());
  EXPECT_EQ(params.scale(), 2);
}

// Each malformed entry is left out with a reason; the others still work.
TEST(OpCatalog, RefusesMalformedEntries) {
  const std::string good = R"pb(
    operators {
      name: "HardswishBackward"
      tensors { name: "gradOutput" role: "input" dtypes: 0 }
      tensors { name: "self" role: "input" dtypes: 0 }
      tensors { name: "out" role: "output" dtypes: 0 }
    })pb";
  struct Case {
    std::string entry;
    std::string why;
  };
  const std::string in = R"pb(tensors { name: "a" role: "input" dtypes: 0 })pb";
  const std::string out =
      R"pb(tensors { name: "o" role: "output" dtypes: 0 })pb";
  const Case cases[] = {
      {"name: \"\" " + in + out, "not an identifier"},
      {"name: \"A\\033[2J\" " + in + out, "not an identifier"},
      {"name: \"A\" aclnn_name: \"a b\" " + in + out, "aclnn_name"},
      {"name: \"A\" " + out, "no input"},
      {"name: \"A\" " + in, "no output"},
      {"name: \"A\" " + in + out + out, "collides"},
      {"name: \"A\" " + in + out +
           R"pb(tensors { name: "p" role: "output" dtypes: 0 })pb",
       "more than one output"},
      {"name: \"A\" " + in + R"pb(tensors { name: "o" role: "both" })pb",
       "role 'both'"},
      {"name: \"A\" " + in + R"pb(tensors { name: "o" role: "output" })pb",
       "no dtype"},
      {"name: \"A\" " + in +
           R"pb(tensors { name: "o" role: "output" dtypes: 99 })pb",
       "unknown dtype 99"},
      {"name: \"A\" " + in + out +
           R"pb(params { name: "nope" aclnn_name: "x" type: "float" })pb",
       "not a parameter this client can send"},
      {"name: \"A\" " + in + out +
           R"pb(params { name: "threshold" aclnn_name: "x" type: "bool" })pb",
       "not a parameter this client can send"},
      {"name: \"A\" " + in + out +
           R"pb(params { name: "scale" aclnn_name: "x" type: "scalar" })pb",
       "not a parameter this client can send"},
      {"name: \"A\" " + in + out +
           R"pb(params {
                  name: "scale"
                  aclnn_name: "x"
                  type: "double"
                  default_value: nan
                })pb",
       "default nan"},
      {"name: \"A\" " + in + out +
           R"pb(params {
                  name: "self_is_result"
                  aclnn_name: "x"
                  type: "bool"
                  default_value: 2
                })pb",
       "default 2"},
      {"name: \"A\" " + in + out + R"pb(params {
                                          name: "scale"
                                          aclnn_name: "a_dtype"
                                          type: "double"
                                        })pb",
       "collides"},
      {"name: \"A\" " + in +
           R"pb(tensors { name: "dtype" role: "output" dtypes: 0 })pb",
       "collides"},
      {"name: \"HardswishBackward\" " + in + out, "listed twice"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    OpCatalog catalog = ParseCatalog(
        Parse(good + " operators { " + c.entry + " }"), {"dtype", "output"});
    ASSERT_THAT(catalog.ops, SizeIs(1));
    EXPECT_EQ(catalog.ops[0].name, "HardswishBackward");
    ASSERT_THAT(catalog.rejected, SizeIs(1));
    EXPECT_THAT(catalog.rejected[0], HasSubstr("operator 1 ("));
    EXPECT_THAT(catalog.rejected[0], HasSubstr(c.why));
  }
}

OpSignature Find(const OpCatalog& catalog, const std::string& name) {
  const OpSignature* op = catalog.Find(name);
  EXPECT_NE(op, nullptr) << name;
  return op != nullptr ? *op : OpSignature();
}

TEST(OpCatalog, OutputShapeIsWhatValidateAccepts) {
  OpCatalog catalog = ParseCatalog(Parse(kTwoOps));
  v1::OpParams params;
  params.mutable_negative_slope()->set_value(0.01);
  // Broadcast.
  auto shape = OutputShape(Find(catalog, "LeakyReluBackward"), params,
                           {{"gradOutput", {DType::kFloat, {2, 2}}},
                            {"self", {DType::kFloat, {2, 1}}}},
                           DType::kFloat);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(2, 2));
  // The mask does not broadcast with gradOutput: gradOutput's shape.
  params.set_scale(2);
  shape = OutputShape(Find(catalog, "DropoutBackward"), params,
                      {{"gradOutput", {DType::kFloat, {4, 2}}},
                       {"mask", {DType::kUint8, {16}}}},
                      DType::kFloat);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(4, 2));
  // No shape fits: Validate's verdict, with its aclnn status.
  shape = OutputShape(
      Find(catalog, "LeakyReluBackward"), params,
      {{"gradOutput", {DType::kFloat, {3}}}, {"self", {DType::kFloat, {2}}}},
      DType::kFloat);
  EXPECT_THAT(shape.status().message(), HasSubstr("cannot be broadcast"));
  EXPECT_EQ(kernels::GetAclnnStatus(shape.status()), 161002);
}

TEST(OpCatalog, OutputShapeOfAnOperatorThisClientDoesNotKnow) {
  OpCatalog catalog = ParseCatalog(Parse(R"pb(
    operators {
      name: "GeluBackward"
      tensors { name: "gradOutput" role: "input" dtypes: 0 }
      tensors { name: "self" role: "input" dtypes: 0 }
      tensors { name: "out" role: "output" dtypes: 0 }
    })pb"));
  auto shape = OutputShape(
      Find(catalog, "GeluBackward"), v1::OpParams(),
      {{"gradOutput", {DType::kFloat, {3, 1}}}, {"self", {DType::kFloat, {4}}}},
      DType::kFloat);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_THAT(*shape, ElementsAre(3, 4));
}

}  // namespace
}  // namespace opserver::remote
