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

// ---- What a tensor was created with, as CANN's tensor API reports it. ----
// Each returns ACLNN_ERR_PARAM_NULLPTR for a NULL argument. The arrays
// (*viewDims, *stridesValue, *storageDims) are allocated by the call with
// new[]; the caller releases them with delete[].
ACL_FUNC_VISIBILITY aclnnStatus aclGetViewShape(const aclTensor *tensor,
                                                int64_t **viewDims,
                                                uint64_t *viewDimsNum);
// The strides given to aclCreateTensor, or row-major ones for a tensor
// created without.
ACL_FUNC_VISIBILITY aclnnStatus aclGetViewStrides(const aclTensor *tensor,
                                                  int64_t **stridesValue,
                                                  uint64_t *stridesNum);
ACL_FUNC_VISIBILITY aclnnStatus aclGetViewOffset(const aclTensor *tensor,
                                                 int64_t *offset);
ACL_FUNC_VISIBILITY aclnnStatus aclGetStorageShape(const aclTensor *tensor,
                                                   int64_t **storageDims,
                                                   uint64_t *storageDimsNum);
ACL_FUNC_VISIBILITY aclnnStatus aclGetFormat(const aclTensor *tensor,
                                             aclFormat *format);
ACL_FUNC_VISIBILITY aclnnStatus aclGetDataType(const aclTensor *tensor,
                                               aclDataType *dataType);

// ---- The other base objects frameworks create for every operator call. ----
// Each create copies `value` (NULL only with size 0) and returns NULL on a
// bad argument (aclGetRecentErrMsg says which); each destroy and size getter
// returns ACLNN_ERR_PARAM_NULLPTR for NULL.
typedef struct aclIntArray aclIntArray;
typedef struct aclFloatArray aclFloatArray;
typedef struct aclBoolArray aclBoolArray;
typedef struct aclTensorList aclTensorList;
typedef struct aclScalarList aclScalarList;

ACL_FUNC_VISIBILITY aclIntArray *aclCreateIntArray(const int64_t *value,
                                                   uint64_t size);
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyIntArray(const aclIntArray *array);
ACL_FUNC_VISIBILITY aclnnStatus aclGetIntArraySize(const aclIntArray *array,
                                                   uint64_t *size);
ACL_FUNC_VISIBILITY aclFloatArray *aclCreateFloatArray(const float *value,
                                                       uint64_t size);
ACL_FUNC_VISIBILITY aclnnStatus
aclDestroyFloatArray(const aclFloatArray *array);
ACL_FUNC_VISIBILITY aclnnStatus
aclGetFloatArraySize(const aclFloatArray *array, uint64_t *size);
ACL_FUNC_VISIBILITY aclBoolArray *aclCreateBoolArray(const bool *value,
                                                     uint64_t size);
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyBoolArray(const aclBoolArray *array);
ACL_FUNC_VISIBILITY aclnnStatus aclGetBoolArraySize(const aclBoolArray *array,
                                                    uint64_t *size);
// The list holds the tensors themselves: destroying the list destroys
// them (do not destroy them again). Every element must be non-NULL.
ACL_FUNC_VISIBILITY aclTensorList *aclCreateTensorList(
    const aclTensor *const *value, uint64_t size);
ACL_FUNC_VISIBILITY aclnnStatus
aclDestroyTensorList(const aclTensorList *array);
ACL_FUNC_VISIBILITY aclnnStatus
aclGetTensorListSize(const aclTensorList *tensorList, uint64_t *size);
// The same for scalars.
ACL_FUNC_VISIBILITY aclScalarList *aclCreateScalarList(
    const aclScalar *const *value, uint64_t size);
ACL_FUNC_VISIBILITY aclnnStatus
aclDestroyScalarList(const aclScalarList *array);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNN_ACL_META_H_
