// aclnn-compatible C API of opserver: the runtime calls of CANN's
// acl/acl_rt.h used by aclnn programs. The "device" is the opserver named by
// OPSERVER_ADDRESS; device pointers are opaque addresses that only this
// library, aclrtMemcpy and aclCreateTensor understand (pointer arithmetic
// within one allocation works as on a device).
#ifndef OPSERVER_CLIENT_INCLUDE_ACL_ACL_RT_H_
#define OPSERVER_CLIENT_INCLUDE_ACL_ACL_RT_H_

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum aclrtMemMallocPolicy {
  ACL_MEM_MALLOC_HUGE_FIRST,
  ACL_MEM_MALLOC_HUGE_ONLY,
  ACL_MEM_MALLOC_NORMAL_ONLY,
  ACL_MEM_MALLOC_HUGE_FIRST_P2P,
  ACL_MEM_MALLOC_HUGE_ONLY_P2P,
  ACL_MEM_MALLOC_NORMAL_ONLY_P2P
} aclrtMemMallocPolicy;

typedef enum aclrtMemcpyKind {
  ACL_MEMCPY_HOST_TO_HOST,
  ACL_MEMCPY_HOST_TO_DEVICE,
  ACL_MEMCPY_DEVICE_TO_HOST,
  ACL_MEMCPY_DEVICE_TO_DEVICE
} aclrtMemcpyKind;

// Opens a session on the server (device 0 is the only device).
ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId);
// Closes the session: frees every buffer, stream and executor it owns.
ACL_FUNC_VISIBILITY aclError aclrtResetDevice(int32_t deviceId);

ACL_FUNC_VISIBILITY aclError aclrtCreateStream(aclrtStream *stream);
ACL_FUNC_VISIBILITY aclError aclrtDestroyStream(aclrtStream stream);
// Waits for the stream's work; reports the first failure of that work.
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeStream(aclrtStream stream);

ACL_FUNC_VISIBILITY aclError aclrtMalloc(void **devPtr, size_t size,
                                         aclrtMemMallocPolicy policy);
ACL_FUNC_VISIBILITY aclError aclrtFree(void *devPtr);
// Synchronous copy; device ranges must lie within one allocation.
ACL_FUNC_VISIBILITY aclError aclrtMemcpy(void *dst, size_t destMax,
                                         const void *src, size_t count,
                                         aclrtMemcpyKind kind);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACL_ACL_RT_H_
