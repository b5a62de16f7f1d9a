// aclnn-compatible C API of opserver: CANN's
// aclnnop/aclnn_hardswish_backward.h.
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_HARDSWISH_BACKWARD_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_HARDSWISH_BACKWARD_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

// out = gradOutput * (self < -3 ? 0 : self > 3 ? 1 : self / 3 + 0.5).
ACL_FUNC_VISIBILITY aclnnStatus aclnnHardswishBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *self, aclTensor *out,
    uint64_t *workspaceSize, aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus
aclnnHardswishBackward(void *workspace, uint64_t workspaceSize,
                       aclOpExecutor *executor, const aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_HARDSWISH_BACKWARD_H_
