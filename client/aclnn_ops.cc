// The aclnn-compatible C API's operators (aclnnop/aclnn_*_backward.h): each
// is a GetWorkspaceSize shim (opserver::Plan) and a launch shim
// (opserver::Launch), forwarded to the opserver through the C++ client.

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

using opserver::Fail;

extern "C" {

aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   const aclScalar* threshold,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  constexpr char kFunction[] = "aclnnThresholdBackwardGetWorkspaceSize";
  if (threshold == nullptr) {
    return Fail(ACLNN_ERR_PARAM_NULLPTR,
                absl::StrCat(kFunction, ": threshold is nullptr"));
  }
  opserver::v1::OpParams params;
  params.set_threshold(threshold->value);
  return opserver::Plan(
      kFunction, "ThresholdBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnThresholdBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   const aclrtStream stream) {
  return opserver::Launch("aclnnThresholdBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnSoftshrinkBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar* lambd,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor) {
  constexpr char kFunction[] = "aclnnSoftshrinkBackwardGetWorkspaceSize";
  if (lambd == nullptr) {
    return Fail(ACLNN_ERR_PARAM_NULLPTR,
                absl::StrCat(kFunction, ": lambd is nullptr"));
  }
  opserver::v1::OpParams params;
  params.set_lambd(lambd->value);
  return opserver::Plan(
      kFunction, "SoftshrinkBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"gradInput", gradInput}},
      workspaceSize, executor);
}

aclnnStatus aclnnSoftshrinkBackward(void* workspace, uint64_t workspaceSize,
                                    aclOpExecutor* executor,
                                    const aclrtStream stream) {
  return opserver::Launch("aclnnSoftshrinkBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnHardswishBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  return opserver::Plan(
      "aclnnHardswishBackwardGetWorkspaceSize", "HardswishBackward",
      opserver::v1::OpParams(),
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnHardswishBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   const aclrtStream stream) {
  return opserver::Launch("aclnnHardswishBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnLeakyReluBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self,
    const aclScalar* negativeSlope, bool selfIsResult, aclTensor* out,
    uint64_t* workspaceSize, aclOpExecutor** executor) {
  constexpr char kFunction[] = "aclnnLeakyReluBackwardGetWorkspaceSize";
  if (negativeSlope == nullptr) {
    return Fail(ACLNN_ERR_PARAM_NULLPTR,
                absl::StrCat(kFunction, ": negativeSlope is nullptr"));
  }
  opserver::v1::OpParams params;
  params.mutable_negative_slope()->set_dtype(
      static_cast<opserver::v1::DataType>(negativeSlope->dtype));
  params.mutable_negative_slope()->set_value(negativeSlope->value);
  params.set_self_is_result(selfIsResult);
  return opserver::Plan(
      kFunction, "LeakyReluBackward", params,
      {{"gradOutput", gradOutput}, {"self", self}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnLeakyReluBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return opserver::Launch("aclnnLeakyReluBackward", workspace, workspaceSize,
                          executor, stream);
}

aclnnStatus aclnnDropoutBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                 const aclTensor* mask,
                                                 double scale, aclTensor* out,
                                                 uint64_t* workspaceSize,
                                                 aclOpExecutor** executor) {
  opserver::v1::OpParams params;
  params.set_scale(scale);
  return opserver::Plan(
      "aclnnDropoutBackwardGetWorkspaceSize", "DropoutBackward", params,
      {{"gradOutput", gradOutput}, {"mask", mask}, {"out", out}}, workspaceSize,
      executor);
}

aclnnStatus aclnnDropoutBackward(void* workspace, uint64_t workspaceSize,
                                 aclOpExecutor* executor, aclrtStream stream) {
  return opserver::Launch("aclnnDropoutBackward", workspace, workspaceSize,
                          executor, stream);
}

}  // extern "C"
