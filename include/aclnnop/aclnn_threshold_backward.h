// aclnn-compatible C API of opserver: CANN's
// aclnnop/aclnn_threshold_backward.h.
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_THRESHOLD_BACKWARD_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_THRESHOLD_BACKWARD_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

// out = self > threshold ? gradOutput : 0.
ACL_FUNC_VISIBILITY aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *self,
    const aclScalar *threshold, aclTensor *out, uint64_t *workspaceSize,
    aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus
aclnnThresholdBackward(void *workspace, uint64_t workspaceSize,
                       aclOpExecutor *executor, const aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_THRESHOLD_BACKWARD_H_
