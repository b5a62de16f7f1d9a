// aclnn-compatible C API of opserver: CANN's
// aclnnop/aclnn_softshrink_backward.h.
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_SOFTSHRINK_BACKWARD_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_SOFTSHRINK_BACKWARD_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

// gradInput = |self| > lambd ? gradOutput : 0.
ACL_FUNC_VISIBILITY aclnnStatus aclnnSoftshrinkBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *self, const aclScalar *lambd,
    aclTensor *gradInput, uint64_t *workspaceSize, aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus
aclnnSoftshrinkBackward(void *workspace, uint64_t workspaceSize,
                        aclOpExecutor *executor, const aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_SOFTSHRINK_BACKWARD_H_
