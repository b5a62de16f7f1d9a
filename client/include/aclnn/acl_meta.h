// aclnn-compatible C API of opserver: CANN's aclnn/acl_meta.h subset
// (tensors, scalars, executors, aclnnStatus).
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNN_ACL_META_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNN_ACL_META_H_

#include <stdbool.h>
#include <stdint.h>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t aclnnStatus;

#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_RUNTIME_ERROR 361001
#define ACLNN_ERR_INNER 561000
#define ACLNN_ERR_INNER_CREATE_EXECUTOR 561101
#define ACLNN_ERR_INNER_NULLPTR 561103

typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclScalar aclScalar;

// Describes a view of device memory: `tensorData` is an aclrtMalloc pointer
// (or one inside such an allocation); strides and offset are in elements;
// `stride` may be NULL for contiguous row-major. Returns NULL on a bad
// argument (aclGetRecentErrMsg says which).
ACL_FUNC_VISIBILITY aclTensor *aclCreateTensor(
    const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType,
    const int64_t *stride, int64_t offset, aclFormat format,
    const int64_t *storageDims, uint64_t storageDimsNum, void *tensorData);
// `value` points to one host value of `dataType`.
ACL_FUNC_VISIBILITY aclScalar *aclCreateScalar(void *value,
                                               aclDataType dataType);
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyTensor(const aclTensor *tensor);
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyScalar(const aclScalar *scalar);

// Makes `executor` launchable any number of times; it must then be freed
// with aclDestroyAclOpExecutor.
ACL_FUNC_VISIBILITY aclnnStatus
aclSetAclOpExecutorRepeatable(aclOpExecutor *executor);
ACL_FUNC_VISIBILITY aclnnStatus
aclDestroyAclOpExecutor(aclOpExecutor *executor);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNN_ACL_META_H_
