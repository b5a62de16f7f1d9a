// aclnn-compatible C API of opserver: CANN's
// aclnnop/aclnn_leaky_relu_backward.h.
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_LEAKY_RELU_BACKWARD_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_LEAKY_RELU_BACKWARD_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

// out = self > 0 ? gradOutput : gradOutput * negativeSlope.
ACL_FUNC_VISIBILITY aclnnStatus aclnnLeakyReluBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *self,
    const aclScalar *negativeSlope, bool selfIsResult, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus aclnnLeakyReluBackward(void *workspace,
                                                       uint64_t workspaceSize,
                                                       aclOpExecutor *executor,
                                                       aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_LEAKY_RELU_BACKWARD_H_
