#include "kernels/op_signatures.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/validate.h"

namespace opserver {
namespace {

using ::testing::ElementsAreArray;

// One operator as OPSERVER_OPERATORS writes it.
struct Signature {
  std::string name;
  std::vector<std::string> tensors;  // Inputs, then the output.
  std::vector<std::string> params;   // aclnn names.
  std::vector<std::string> kinds;
};

std::vector<Signature> Table() {
  std::vector<Signature> table;
#define OPSERVER_TEST_PARAM(KIND, name, field) \
  s.params.push_back(#name);                   \
  s.kinds.push_back(#KIND);
#define OPSERVER_TEST_OP(Name, in0, in1, out, PARAMS) \
  {                                                   \
    Signature s{#Name, {#in0, #in1, #out}};           \
    PARAMS(OPSERVER_TEST_PARAM)                       \
    table.push_back(s);                               \
  }
  OPSERVER_OPERATORS(OPSERVER_TEST_OP)
#undef OPSERVER_TEST_OP
#undef OPSERVER_TEST_PARAM
  return table;
}

// The typed surfaces agree with the registry the server lists and checks
// calls against: same operators in the same order, tensors, parameters and
// their kinds.
TEST(OpSignatures, MatchTheRegistry) {
  const std::vector<Signature> table = Table();
  const std::vector<kernels::OpInfo>& registry = kernels::OpRegistry();
  ASSERT_EQ(table.size(), registry.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const kernels::OpInfo& op = registry[i];
    const Signature& s = table[i];
    SCOPED_TRACE(s.name);
    EXPECT_EQ(s.name, op.name);
    std::vector<std::string> tensors, params, kinds;
    for (const auto& t : op.tensors) {
      tensors.emplace_back(t.name);
      EXPECT_EQ(t.is_output, tensors.size() == op.tensors.size());
    }
    for (const auto& p : op.scalars) {
      params.emplace_back(p.name);
      // The registry's type as the table spells it.
      kinds.push_back(p.type == "float"    ? "FLOAT"
                      : p.type == "scalar" ? "SCALAR"
                      : p.type == "double" ? "DOUBLE"
                      : p.type == "bool"   ? "BOOL"
                                           : std::string(p.type));
    }
    EXPECT_THAT(s.tensors, ElementsAreArray(tensors));
    EXPECT_THAT(s.params, ElementsAreArray(params));
    EXPECT_THAT(s.kinds, ElementsAreArray(kinds));
  }
}

}  // namespace
}  // namespace opserver
