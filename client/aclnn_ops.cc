// The aclnn-compatible C API's operators (aclnnop/aclnn_*_backward.h): each
// is a GetWorkspaceSize shim (opserver::Plan) and a launch shim
// (opserver::Launch), forwarded to the opserver through the C++ client.
//
// A new operator: its GetWorkspaceSize shim below (its signature is its
// own) and one line in OPSERVER_ACLNN_OPS for its launch shim.

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "client/aclnn_state.h"
#include "client/client.h"

// Every operator by its aclnn name less the "aclnn" prefix; X(Name) is
// expanded once per operator.
#define OPSERVER_ACLNN_OPS(X) \
  X(ThresholdBackward)        \
  X(SoftshrinkBackward)       \
  X(HardswishBackward)        \
  X(LeakyReluBackward)        \
  X(DropoutBackward)

namespace {

// A GetWorkspaceSize shim's answer to a nullptr scalar argument `name`.
aclnnStatus NullScalar(const char* function, const char* name) {
  return opserver::Fail(ACLNN_ERR_PARAM_NULLPTR,
                        absl::StrCat(function, ": ", name, " is nullptr"));
}

}  // namespace

extern "C" {

// Phase one: each shim names its function (__func__, for error messages),
// the server's operator, its scalars and its tensors.

aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   const aclScalar* threshold,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  if (threshold == nullptr) return NullScalar(__func__, "threshold");
  opserver::v1::OpParams params;
  params.set_threshold(threshold->value);
  return opserver::Plan(
      __func__, "ThresholdBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnSoftshrinkBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar* lambd,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor) {
  if (lambd == nullptr) return NullScalar(__func__, "lambd");
  opserver::v1::OpParams params;
  params.set_lambd(lambd->value);
  return opserver::Plan(
      __func__, "SoftshrinkBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"gradInput", gradInput}},
      workspaceSize, executor);
}

aclnnStatus aclnnHardswishBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  return opserver::Plan(
      __func__, "HardswishBackward", opserver::v1::OpParams(),
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnLeakyReluBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self,
    const aclScalar* negativeSlope, bool selfIsResult, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
  if (negativeSlope == nullptr) return NullScalar(__func__, "negativeSlope");
  opserver::v1::OpParams params;
  params.mutable_negative_slope()->set_dtype(
      static_cast<opserver::v1::DataType>(negativeSlope->dtype));
  params.mutable_negative_slope()->set_value(negativeSlope->value);
  params.set_self_is_result(selfIsResult);
  return opserver::Plan(
      __func__, "LeakyReluBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnDropoutBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                 const aclTensor* mask,
                                                 double scale, aclTensor* out,
                                                 uint64_t* workspaceSize,
                                                 aclOpExecutor** executor) {
  opserver::v1::OpParams params;
  params.set_scale(scale);
  return opserver::Plan(
      __func__, "DropoutBackward", params,
      {{"gradOutput", gradOutput}, {"mask", mask}, {"out", out}}, workspaceSize,
      executor);
}

// Phase two: the same for every operator. A launch shim whose signature
// drifted from its header's declaration fails to compile (two C functions
// of one name).
#define OPSERVER_ACLNN_LAUNCH(Name)                                            \
  aclnnStatus aclnn##Name(void* workspace, uint64_t workspaceSize,             \
                          aclOpExecutor* executor, aclrtStream stream) {       \
    return opserver::Launch("aclnn" #Name, workspace, workspaceSize, executor, \
                            stream);                                           \
  }
OPSERVER_ACLNN_OPS(OPSERVER_ACLNN_LAUNCH)
#undef OPSERVER_ACLNN_LAUNCH

}  // extern "C"
