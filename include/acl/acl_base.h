// aclnn-compatible C API of opserver: the base types and status codes of
// CANN's acl/acl_base.h that programs written for aclnn use. Values are
// CANN's; the implementation (libaclnn_remote.so) forwards every call to the
// opserver named by the environment variable OPSERVER_ADDRESS.
#ifndef OPSERVER_CLIENT_INCLUDE_ACL_ACL_BASE_H_
#define OPSERVER_CLIENT_INCLUDE_ACL_ACL_BASE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ACL_FUNC_VISIBILITY __attribute__((visibility("default")))

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;
typedef void *aclrtContext;

static const int ACL_SUCCESS = 0;
static const int ACL_ERROR_NONE = 0;
static const int ACL_ERROR_INVALID_PARAM = 100000;
static const int ACL_ERROR_UNINITIALIZE = 100001;
static const int ACL_ERROR_REPEAT_INITIALIZE = 100002;
static const int ACL_ERROR_REPEAT_FINALIZE = 100037;
static const int ACL_ERROR_BAD_ALLOC = 200000;
static const int ACL_ERROR_API_NOT_SUPPORT = 200001;
static const int ACL_ERROR_INVALID_DEVICE = 200002;
static const int ACL_ERROR_RESOURCE_NOT_MATCH = 200004;
static const int ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005;
static const int ACL_ERROR_FEATURE_UNSUPPORTED = 200006;
static const int ACL_ERROR_STORAGE_OVER_LIMIT = 300000;
static const int ACL_ERROR_INTERNAL_ERROR = 500000;
static const int ACL_ERROR_FAILURE = 500001;
static const int ACL_ERROR_RT_FAILURE = 500003;
// The runtime's own codes (CANN's rt error codes).
static const int ACL_ERROR_RT_PARAM_INVALID = 107000;
static const int ACL_ERROR_RT_INVALID_DEVICEID = 107001;
// A call that needs a device found no context on the thread.
static const int ACL_ERROR_RT_CONTEXT_NULL = 107002;
// A stream (or event) of another device than the current context's.
static const int ACL_ERROR_RT_STREAM_CONTEXT = 107003;
// aclrtEventElapsedTime of an event without a completed record.
static const int ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006;
// A model of another device than the current context's.
static const int ACL_ERROR_RT_MODEL_CONTEXT = 107004;
// aclmdlRIDebugJsonPrint's file could not be opened or written.
static const int ACL_ERROR_RT_FILE_OPEN = 107009;
static const int ACL_ERROR_RT_FILE_WRITE = 107010;
static const int ACL_ERROR_RT_INVALID_HANDLE = 107017;
// Graph capture (aclmdlRI*; docs/graphs.md says when each is returned).
// A forked stream that never joined back before aclmdlRICaptureEnd.
static const int ACL_ERROR_RT_CAPTURE_DEPENDENCY = 107024;
static const int ACL_ERROR_RT_STREAM_UNJOINED = 107025;
// A model whose capture is still going on.
static const int ACL_ERROR_RT_MODEL_CAPTURED = 107026;
// A call a capturing stream does not take (a second begin, a synchronize,
// a query, a destroy).
static const int ACL_ERROR_RT_STREAM_CAPTURED = 107027;
// A query or synchronize of an event recorded in a capture.
static const int ACL_ERROR_RT_EVENT_CAPTURED = 107028;
static const int ACL_ERROR_RT_STREAM_NOT_CAPTURED = 107029;
// A call the capture mode forbids on this thread (a synchronous copy or
// memset, a device synchronize).
static const int ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT = 107030;
// aclmdlRICaptureEnd on a stream that joined a capture begun on another.
static const int ACL_ERROR_RT_STREAM_CAPTURE_UNMATCHED = 107036;
static const int ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD = 107038;
// A host<->device aclrtMemcpyAsync from page-locked memory inside a
// capture (the server cannot read the host's memory at each replay).
static const int ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000;
// aclmdlRICaptureEnd of a capture an earlier error invalidated.
static const int ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED = 507903;
// aclrtSubscribeReport of a stream that has a subscribed thread already.
static const int ACL_ERROR_RT_STREAM_SUBSCRIBE = 107011;
// aclrtProcessReport on a thread no stream is subscribed to, and
// aclrtUnSubscribeReport of another thread's stream.
static const int ACL_ERROR_RT_THREAD_SUBSCRIBE = 107012;
// aclrtLaunchCallback (or aclrtUnSubscribeReport) on a stream with no
// subscribed thread.
static const int ACL_ERROR_RT_STREAM_NO_CB_REG = 107015;
// A stream's deferred error: it waited on an event longer than
// aclrtSetOpWaitTimeout's time-out (and went on), or a task ran longer
// than aclrtSetOpExecuteTimeOut's (and was stopped).
static const int ACL_ERROR_RT_WAIT_TIMEOUT = 107019;
static const int ACL_ERROR_RT_TASK_TIMEOUT = 107020;
// aclrtProcessReport found no callback to run within its time-out; also a
// stream's deferred error when a blocking callback was not run within the
// server's --callback_block_timeout_ms.
static const int ACL_ERROR_RT_REPORT_TIMEOUT = 507012;
// aclrtSynchronizeStreamWithTimeout / aclrtSynchronizeDeviceWithTimeout,
// and aclrtSynchronizeEventWithTimeout, past their time-out.
static const int ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046;
static const int ACL_ERROR_RT_EVENT_SYNC_TIMEOUT = 507047;

typedef enum {
  ACL_DT_UNDEFINED = -1,
  ACL_FLOAT = 0,
  ACL_FLOAT16 = 1,
  ACL_INT8 = 2,
  ACL_INT32 = 3,
  ACL_UINT8 = 4,
  ACL_INT16 = 6,
  ACL_UINT16 = 7,
  ACL_UINT32 = 8,
  ACL_INT64 = 9,
  ACL_UINT64 = 10,
  ACL_DOUBLE = 11,
  ACL_BOOL = 12,
  ACL_STRING = 13,
  ACL_COMPLEX64 = 16,
  ACL_COMPLEX128 = 17,
  ACL_BF16 = 27
} aclDataType;

// CANN's values; the format given to aclCreateTensor is kept and reported
// back by aclGetFormat (frameworks pass e.g. NCL for every 3-D tensor), and
// does not change how a tensor is read: strides do.
typedef enum {
  ACL_FORMAT_UNDEFINED = -1,
  ACL_FORMAT_NCHW = 0,
  ACL_FORMAT_NHWC = 1,
  ACL_FORMAT_ND = 2,
  ACL_FORMAT_NC1HWC0 = 3,
  ACL_FORMAT_FRACTAL_Z = 4,
  ACL_FORMAT_NC1HWC0_C04 = 12,
  ACL_FORMAT_HWCN = 16,
  ACL_FORMAT_NDHWC = 27,
  ACL_FORMAT_FRACTAL_NZ = 29,
  ACL_FORMAT_NCDHW = 30,
  ACL_FORMAT_NDC1HWC0 = 32,
  ACL_FRACTAL_Z_3D = 33,
  ACL_FORMAT_NC = 35,
  ACL_FORMAT_NCL = 47
} aclFormat;

// The message of the last failed call on this thread ("" when none).
ACL_FUNC_VISIBILITY const char *aclGetRecentErrMsg(void);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACL_ACL_BASE_H_
