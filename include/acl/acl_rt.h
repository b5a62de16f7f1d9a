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

// aclrtCreateEventWithFlag's flags.
#define ACL_EVENT_SYNC 0x00000001U
#define ACL_EVENT_CAPTURE_STREAM_PROGRESS 0x00000002U
#define ACL_EVENT_TIME_LINE 0x00000008U
#define ACL_EVENT_EXTERNAL 0x00000020U
#define ACL_EVENT_IPC 0x00000040U

typedef enum aclrtEventRecordedStatus {
  ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
  ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
} aclrtEventRecordedStatus;

typedef enum aclrtStreamStatus {
  ACL_STREAM_STATUS_COMPLETE = 0,
  ACL_STREAM_STATUS_NOT_READY = 1,
  ACL_STREAM_STATUS_RESERVED = 0xFFFF,
} aclrtStreamStatus;

typedef enum aclrtCallbackBlockType {
  ACL_CALLBACK_NO_BLOCK,
  ACL_CALLBACK_BLOCK,
} aclrtCallbackBlockType;

typedef void (*aclrtCallback)(void *userData);
typedef void (*aclrtHostFunc)(void *args);

// aclrtSetStreamFailureMode's modes.
#define ACL_CONTINUE_ON_FAILURE 0x00000000U
#define ACL_STOP_ON_FAILURE 0x00000001U

// What aclrtSetExceptionInfoCallback's callback is given: read it with the
// aclrtGet*FromExceptionInfo calls, during the callback only.
typedef struct rtExceptionInfo aclrtExceptionInfo;
typedef void (*aclrtExceptionInfoCallback)(aclrtExceptionInfo *exceptionInfo);

typedef enum aclrtRunMode {
  ACL_DEVICE,
  ACL_HOST,
} aclrtRunMode;

typedef enum aclrtLastErrLevel {
  ACL_RT_THREAD_LEVEL = 0,
} aclrtLastErrLevel;

typedef enum aclrtFloatOverflowMode {
  ACL_RT_OVERFLOW_MODE_SATURATION = 0,
  ACL_RT_OVERFLOW_MODE_INFNAN,
  ACL_RT_OVERFLOW_MODE_UNDEF,
} aclrtFloatOverflowMode;

// ---- Devices and contexts ----
// Device ordinals count the devices of the servers OPSERVER_ADDRESS lists
// (HOST:PORT[,HOST:PORT...]), in that order.
//
// Opens a session on device `deviceId` (on first use) and binds its
// default context to the calling thread: the thread's later calls go to
// that device. Each thread sets its own device (or context).
ACL_FUNC_VISIBILITY aclError aclrtSetDevice(int32_t deviceId);
// Closes the device's session: frees every buffer, stream, executor and
// event it owns and destroys its contexts.
ACL_FUNC_VISIBILITY aclError aclrtResetDevice(int32_t deviceId);
// A new context on `deviceId`, made current on the calling thread. The
// contexts of one device share its session (memory, streams, events).
ACL_FUNC_VISIBILITY aclError aclrtCreateContext(aclrtContext *context,
                                                int32_t deviceId);
// Destroys a context aclrtCreateContext made (not a default context).
ACL_FUNC_VISIBILITY aclError aclrtDestroyContext(aclrtContext context);
ACL_FUNC_VISIBILITY aclError aclrtSetCurrentContext(aclrtContext context);
// ACL_ERROR_RT_CONTEXT_NULL when the thread has none.
ACL_FUNC_VISIBILITY aclError aclrtGetCurrentContext(aclrtContext *context);

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
// The devices this process can use: the total over the servers named by
// OPSERVER_ADDRESS. ACL_ERROR_UNINITIALIZE before aclInit.
ACL_FUNC_VISIBILITY aclError aclrtGetDeviceCount(uint32_t *count);
// The current context's device; ACL_ERROR_RT_CONTEXT_NULL without one.
ACL_FUNC_VISIBILITY aclError aclrtGetDevice(int32_t *deviceId);
// Waits until every stream's queued work on the current device is done
// (and every aclrtMemcpyAsync has landed); reports the first failure.
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDevice(void);
// The current device's free and total memory, in bytes.
ACL_FUNC_VISIBILITY aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free,
                                             size_t *total);
// "opserver-" and the current device's kind (e.g. "opserver-cpu"), valid
// until aclFinalize; NULL without a context.
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
// channel and costs no round trip, as does a device to device copy on one
// device (the server copies); larger copies are done before the call
// returns, ordered after the stream's queued work.
ACL_FUNC_VISIBILITY aclError aclrtMemcpyAsync(void *dst, size_t destMax,
                                              const void *src, size_t count,
                                              aclrtMemcpyKind kind,
                                              aclrtStream stream);
// Sets `count` bytes at `devPtr` to `value` (its low byte); `count` must
// not exceed `maxCount`. aclrtMemset returns once they are set;
// aclrtMemsetAsync queues it on `stream` (no round trip).
ACL_FUNC_VISIBILITY aclError aclrtMemset(void *devPtr, size_t maxCount,
                                         int32_t value, size_t count);
ACL_FUNC_VISIBILITY aclError aclrtMemsetAsync(void *devPtr, size_t maxCount,
                                              int32_t value, size_t count,
                                              aclrtStream stream);

// ---- Events ----
// Events are stream operations on the server: aclrtRecordEvent completes
// when its stream reaches it, and aclrtStreamWaitEvent holds the stream's
// later work until the record issued before it has completed, without the
// host waiting. Record, wait and reset travel on the session's command
// channel and cost no round trip. An event belongs to the device current
// when it was made.
ACL_FUNC_VISIBILITY aclError aclrtCreateEvent(aclrtEvent *event);
// `flag`: ACL_EVENT_* values above, or 0.
ACL_FUNC_VISIBILITY aclError aclrtCreateEventWithFlag(aclrtEvent *event,
                                                      uint32_t flag);
ACL_FUNC_VISIBILITY aclError aclrtRecordEvent(aclrtEvent event,
                                              aclrtStream stream);
// Returns the event to "not recorded", in order on `stream`.
ACL_FUNC_VISIBILITY aclError aclrtResetEvent(aclrtEvent event,
                                             aclrtStream stream);
ACL_FUNC_VISIBILITY aclError aclrtStreamWaitEvent(aclrtStream stream,
                                                  aclrtEvent event);
// COMPLETE once the last record has completed (or if there was none).
ACL_FUNC_VISIBILITY aclError aclrtQueryEventStatus(
    aclrtEvent event, aclrtEventRecordedStatus *status);
// Blocks the calling thread until the last record has completed.
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeEvent(aclrtEvent event);
// Milliseconds between the completions of two recorded events, measured
// by the server; ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID while either has no
// completed record.
ACL_FUNC_VISIBILITY aclError aclrtEventElapsedTime(float *ms,
                                                   aclrtEvent startEvent,
                                                   aclrtEvent endEvent);
ACL_FUNC_VISIBILITY aclError aclrtDestroyEvent(aclrtEvent event);

// ---- Asking and waiting ----
// ACL_STREAM_STATUS_COMPLETE once everything queued on `stream` (NULL: the
// current context's default stream) has run on the server, else
// ACL_STREAM_STATUS_NOT_READY. No round trip when the library knows the
// stream is idle (a synchronize or query found it so and nothing was queued
// on it since), else one. Takes no deferred error.
ACL_FUNC_VISIBILITY aclError aclrtStreamQuery(aclrtStream stream,
                                              aclrtStreamStatus *status);
// aclrtSynchronizeStream that gives up after `timeout` milliseconds with
// ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: the queued work goes on running and
// its deferred error stays for the next synchronize. -1 waits for ever;
// 0 only checks (as aclrtStreamQuery); other negative values are
// ACL_ERROR_INVALID_PARAM.
ACL_FUNC_VISIBILITY aclError
aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);
// aclrtSynchronizeDevice with a time-out, as above (the time-out covers
// every stream of the device together).
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout);
// aclrtSynchronizeEvent with a time-out, as above, but
// ACL_ERROR_RT_EVENT_SYNC_TIMEOUT.
ACL_FUNC_VISIBILITY aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event,
                                                              int32_t timeout);

// ---- Host callbacks ----
// A callback is a stream command: it runs once the work queued on its
// stream before it has finished on the server. The server tells the
// library so on the session's command channel (no polling, no round trip
// per callback), and `fn` then runs on the thread subscribed to the stream,
// inside that thread's aclrtProcessReport.
//
// `threadId` (a pthread_t as uint64_t) will run the callbacks of `stream`
// (NULL: the current context's default stream). One thread per stream:
// ACL_ERROR_RT_STREAM_SUBSCRIBE when the stream has one already.
ACL_FUNC_VISIBILITY aclError aclrtSubscribeReport(uint64_t threadId,
                                                  aclrtStream stream);
// Ends it: ACL_ERROR_RT_STREAM_NO_CB_REG when the stream has no subscribed
// thread, ACL_ERROR_RT_THREAD_SUBSCRIBE when it is another thread's.
// Callbacks already handed to the thread still run in its
// aclrtProcessReport.
ACL_FUNC_VISIBILITY aclError aclrtUnSubscribeReport(uint64_t threadId,
                                                    aclrtStream stream);
// Runs the calling thread's next reached callback, waiting up to `timeout`
// ms (-1: for ever; 0 and other negative values: ACL_ERROR_INVALID_PARAM)
// for one: ACL_ERROR_RT_REPORT_TIMEOUT when none came.
// ACL_ERROR_RT_THREAD_SUBSCRIBE when no stream is subscribed to the thread
// (also when the last one is unsubscribed while it waits) and nothing is
// left to run. A callback that will never run (its stream destroyed, its
// session closed or its server lost) is returned as that error, and its
// function is not called.
ACL_FUNC_VISIBILITY aclError aclrtProcessReport(int32_t timeout);
// Queues `fn(userData)` on `stream`, which must have a subscribed thread
// (ACL_ERROR_RT_STREAM_NO_CB_REG otherwise). ACL_CALLBACK_BLOCK: the
// stream's later work waits until `fn` has returned; over a network that
// costs the stream a round trip to this process plus the function's run
// (docs/c-api.md), and a thread that never processes its reports is cut
// off by the server's --callback_block_timeout_ms (the stream then goes on
// and its next synchronize returns ACL_ERROR_RT_REPORT_TIMEOUT).
// ACL_CALLBACK_NO_BLOCK: the stream goes on at once.
ACL_FUNC_VISIBILITY aclError aclrtLaunchCallback(aclrtCallback fn,
                                                 void *userData,
                                                 aclrtCallbackBlockType blockType,
                                                 aclrtStream stream);
// Queues `fn(args)` on `stream`, run in stream order on a thread of the
// library's own (no subscription); the stream's later work waits until it
// has returned, as ACL_CALLBACK_BLOCK.
ACL_FUNC_VISIBILITY aclError aclrtLaunchHostFunc(aclrtStream stream,
                                                 aclrtHostFunc fn, void *args);

// ---- Errors ----
// The code of the last call on this thread that failed (ACL_SUCCESS when
// none since the last aclrtGetLastError); Get also clears it. The level
// must be ACL_RT_THREAD_LEVEL (ACL_ERROR_INVALID_PARAM otherwise).
ACL_FUNC_VISIBILITY aclError aclrtPeekAtLastError(aclrtLastErrLevel level);
ACL_FUNC_VISIBILITY aclError aclrtGetLastError(aclrtLastErrLevel level);

// ---- Exceptions, failure modes and operator time-outs ----
// `callback` (NULL: none; the last call wins, for the whole process) is
// called once for each task that failed on the server, when the library
// learns of it: when a synchronize of its stream (or of the device, or a
// read queued on the stream) collects the stream's deferred error, on
// that calling thread, before the call returns the error. The callback
// must not call into the library's stream or device calls.
ACL_FUNC_VISIBILITY aclError
aclrtSetExceptionInfoCallback(aclrtExceptionInfoCallback callback);
// The failed task's position on its stream, counting from 1 (every
// launch, memset, copy and write queued on the stream counts one, a graph
// replay one per run of tasks between its event records and waits, and a
// command the server refused one); its stream's id (aclrtStreamGetId;
// 0: the default stream); the thread that collected the error (its Linux thread
// id); the device ordinal; the aclError the collecting call returns. 0xFFFFFFFF
// for a NULL info.
ACL_FUNC_VISIBILITY uint32_t
aclrtGetTaskIdFromExceptionInfo(const aclrtExceptionInfo *info);
ACL_FUNC_VISIBILITY uint32_t
aclrtGetStreamIdFromExceptionInfo(const aclrtExceptionInfo *info);
ACL_FUNC_VISIBILITY uint32_t
aclrtGetThreadIdFromExceptionInfo(const aclrtExceptionInfo *info);
ACL_FUNC_VISIBILITY uint32_t
aclrtGetDeviceIdFromExceptionInfo(const aclrtExceptionInfo *info);
ACL_FUNC_VISIBILITY uint32_t
aclrtGetErrorCodeFromExceptionInfo(const aclrtExceptionInfo *info);
// The id exception information names `stream` by (NULL: the current
// context's default stream, 0).
ACL_FUNC_VISIBILITY aclError aclrtStreamGetId(aclrtStream stream,
                                              int32_t *streamId);
// ACL_STOP_ON_FAILURE: after a task of `stream` fails, the server skips
// the stream's later tasks until the error is collected by a synchronize,
// whose message then says how many were skipped. ACL_CONTINUE_ON_FAILURE
// (every stream's default): later tasks run. NULL (the default stream) and
// other modes: ACL_ERROR_INVALID_PARAM.
ACL_FUNC_VISIBILITY aclError aclrtSetStreamFailureMode(aclrtStream stream,
                                                       uint64_t mode);
// Seconds (0: none, the default; at most 86400) for every open device and
// those set later: a task (launch, memset, copy) still running that long
// after it started on the server is stopped where the device can stop it
// (the CPU device can) and fails its stream with
// ACL_ERROR_RT_TASK_TIMEOUT; a stream waiting on an event
// (aclrtStreamWaitEvent) that long goes on and fails with
// ACL_ERROR_RT_WAIT_TIMEOUT. Both are collected by the stream's next
// synchronize.
ACL_FUNC_VISIBILITY aclError aclrtSetOpExecuteTimeOut(uint32_t timeout);
ACL_FUNC_VISIBILITY aclError aclrtSetOpWaitTimeout(uint32_t timeout);

// ---- Modes ----
// ACL_HOST: the program runs on the host; the device is a server.
ACL_FUNC_VISIBILITY aclError aclrtGetRunMode(aclrtRunMode *runMode);
// The current device's floating-point overflow mode, kept per device until
// aclFinalize (ACL_RT_OVERFLOW_MODE_INFNAN until set). It is kept and
// reported only: the server's kernels compute IEEE results (inf and NaN on
// overflow) in either mode.
ACL_FUNC_VISIBILITY aclError aclrtSetDeviceSatMode(aclrtFloatOverflowMode mode);
ACL_FUNC_VISIBILITY aclError
aclrtGetDeviceSatMode(aclrtFloatOverflowMode *mode);

// ---- Graph capture (aclmdlRI; docs/graphs.md) ----
// A model runtime instance: the work a capture recorded, defined once on
// the server and replayed there by one message.
typedef void *aclmdlRI;

typedef enum {
  ACL_MODEL_RI_CAPTURE_MODE_GLOBAL = 0,
  ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL,
  ACL_MODEL_RI_CAPTURE_MODE_RELAXED,
} aclmdlRICaptureMode;

typedef enum {
  ACL_MODEL_RI_CAPTURE_STATUS_NONE = 0,
  ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE,
  ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED,
} aclmdlRICaptureStatus;

// aclmdlRIDebugJsonPrint's flags.
#define ACL_MDLRI_DEBUG_JSON_PRINT_SUMMARY 0x0UL
#define ACL_MDLRI_DEBUG_JSON_PRINT_VERBOSE 0x1UL

// Work queued on `stream` from now on (launches, aclrtMemsetAsync,
// device-to-device aclrtMemcpyAsync, event records and waits) is recorded,
// not run, until aclmdlRICaptureEnd. `mode` limits the unsafe calls
// (synchronous copies and memsets, device synchronizes) of this and other
// threads meanwhile.
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureBegin(aclrtStream stream,
                                                 aclmdlRICaptureMode mode);
// Whether `stream` is capturing (ACTIVE), was invalidated by a refused
// call (INVALIDATED) or neither (NONE); the model being captured (NULL
// for NONE).
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureGetInfo(
    aclrtStream stream, aclmdlRICaptureStatus *status, aclmdlRI *modelRI);
// Ends the capture begun on `stream` and defines its model on the server
// (one round trip, to learn whether the server took it).
ACL_FUNC_VISIBILITY aclError aclmdlRICaptureEnd(aclrtStream stream,
                                               aclmdlRI *modelRI);
// A readable JSON list of the model's tasks, written to `path`.
ACL_FUNC_VISIBILITY aclError aclmdlRIDebugJsonPrint(aclmdlRI modelRI,
                                                   const char *path,
                                                   uint32_t flags);
// Sets this thread's capture mode to *mode and returns the previous one in
// *mode.
ACL_FUNC_VISIBILITY aclError
aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode *mode);
// Queues one replay of the model on `stream` (no round trip).
ACL_FUNC_VISIBILITY aclError aclmdlRIExecuteAsync(aclmdlRI modelRI,
                                                 aclrtStream stream);
// Replays the model on the default stream and waits, at most `timeout`
// milliseconds (-1: for ever).
ACL_FUNC_VISIBILITY aclError aclmdlRIExecute(aclmdlRI modelRI,
                                            int32_t timeout);
// Releases the model once the replays already queued have run.
ACL_FUNC_VISIBILITY aclError aclmdlRIDestroy(aclmdlRI modelRI);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACL_ACL_RT_H_
