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

// What aclrtGetMemInfo reports on (the server's device memory is one kind:
// every attribute reports it).
typedef enum aclrtMemAttr {
  ACL_DDR_MEM,
  ACL_HBM_MEM,
  ACL_DDR_MEM_HUGE,
  ACL_DDR_MEM_NORMAL,
  ACL_HBM_MEM_HUGE,
  ACL_HBM_MEM_NORMAL,
  ACL_DDR_MEM_P2P_HUGE,
  ACL_DDR_MEM_P2P_NORMAL,
  ACL_HBM_MEM_P2P_HUGE,
  ACL_HBM_MEM_P2P_NORMAL
} aclrtMemAttr;

// aclrtCreateStreamWithConfig's flags (accepted; the server's streams are
// all alike).
#define ACL_STREAM_FAST_LAUNCH 0x00000001U
#define ACL_STREAM_FAST_SYNC 0x00000002U
#define ACL_STREAM_PERSISTENT 0x00000004U
#define ACL_STREAM_HUGE 0x00000008U
#define ACL_STREAM_CPU_SCHEDULE 0x00000010U
#define ACL_STREAM_DEVICE_USE_ONLY 0x00000020U

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

// ---- Devices ----
// The devices this process can use: 1 (the server named by
// OPSERVER_ADDRESS). ACL_ERROR_UNINITIALIZE before aclInit.
ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count);
// The device set by aclrtSetDevice; ACL_ERROR_RT_CONTEXT_NULL before it.
ACL_FUNC_VISIBILITY aclError aclrtGetDevice(int32_t *deviceId);
// Waits until every stream's queued work is done (and every
// aclrtMemcpyAsync has landed); reports the first failure.
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDevice(void);
// The server device's free and total memory, in bytes.
ACL_FUNC_VISIBILITY aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free,
                                             size_t *total);
// "opserver-" and the server's device kind (e.g. "opserver-cpu"), valid
// until aclFinalize; NULL before aclrtSetDevice.
ACL_FUNC_VISIBILITY const char *aclrtGetSocName(void);
// aclrtCreateStream with CANN's priority (0..7) and flags (the
// ACL_STREAM_* values above, or 0).
ACL_FUNC_VISIBILITY aclError aclrtCreateStreamWithConfig(aclrtStream *stream,
                                                         uint32_t priority,
                                                         uint32_t flag);

// ---- Memory ----
// Host memory for copies (plain, 64-byte-aligned host memory here: nothing
// to pin on this side of the network); freed by aclrtFreeHost.
ACL_FUNC_VISIBILITY aclError aclrtMallocHost(void **hostPtr, size_t size);
ACL_FUNC_VISIBILITY aclError aclrtFreeHost(void *hostPtr);
// aclrtMalloc of `size` rounded up to a multiple of 32 bytes.
ACL_FUNC_VISIBILITY aclError aclrtMallocAlign32(void **devPtr, size_t size,
                                                aclrtMemMallocPolicy policy);
// Queues a copy on `stream` and returns; as in CANN, `src` (host to device)
// and `dst` (device to host) must stay valid, and `dst` is not to be read,
// until the stream is synchronized (aclrtSynchronizeStream or
// aclrtSynchronizeDevice). Up to 1 MiB travels on the session's command
// channel and costs no round trip; larger copies, and device to device
// copies, are done before the call returns, ordered after the stream's
// queued work.
ACL_FUNC_VISIBILITY aclError aclrtMemcpyAsync(void *dst, size_t destMax,
                                              const void *src, size_t count,
                                              aclrtMemcpyKind kind,
                                              aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACL_ACL_RT_H_
