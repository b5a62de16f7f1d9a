// aclnn-compatible C API of opserver: CANN's aclnnop/aclnn_dropout_backward.h.
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_DROPOUT_BACKWARD_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_DROPOUT_BACKWARD_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

// out = bit i of mask ? gradOutput * scale : 0 (mask: UINT8 bits, LSB
// first, align(numel, 128) / 8 bytes).
ACL_FUNC_VISIBILITY aclnnStatus aclnnDropoutBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *mask, double scale,
    aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor);
ACL_FUNC_VISIBILITY aclnnStatus aclnnDropoutBackward(void *workspace,
                                                     uint64_t workspaceSize,
                                                     aclOpExecutor *executor,
                                                     aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNNOP_ACLNN_DROPOUT_BACKWARD_H_
