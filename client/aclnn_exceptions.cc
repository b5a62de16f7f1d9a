// Exception information, stream failure modes and operator time-outs
// (CANN's acl/acl_rt.h): aclrtSetExceptionInfoCallback and the getters of
// its info object, aclrtSetStreamFailureMode, aclrtSetOpExecuteTimeOut,
// aclrtSetOpWaitTimeout, and aclrtStreamGetId (the stream id the info
// object names).
//
// A task that fails on the server is a deferred error of its stream; the
// library learns of it when a synchronize (or a read queued on the stream)
// collects it, and calls the exception callback then, once, on the
// collecting thread, before that call returns the error. The server names
// the task's position on its stream (FenceResult.task, or the unary
// SynchronizeStream's trailing metadata); an error that names no task (a
// stream cancelled with work queued) is not a task's failure.

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "client/client.h"
#include "common/task_position.h"

// CANN's exception information: an opaque type to callers, read through
// the getters below.
struct rtExceptionInfo {
  uint32_t task;
  uint32_t stream;
  uint32_t thread;
  uint32_t device;
  uint32_t code;
};

namespace opserver {
namespace {

// What CANN's getters return for a NULL info.
constexpr uint32_t kInvalidExceptionInfo = 0xFFFFFFFF;

// The last callback set (CANN: the last call wins), for the whole process.
std::atomic<aclrtExceptionInfoCallback>& ExceptionCallback() {
  static std::atomic<aclrtExceptionInfoCallback> callback{nullptr};
  return callback;
}

// aclrtSetOpExecuteTimeOut/aclrtSetOpWaitTimeout: seconds, checked, to
// milliseconds; INVALID_PARAM naming `function` above the server's bound.
absl::StatusOr<uint64_t> TimeoutMs(const char* function, uint32_t seconds) {
  const uint64_t ms = uint64_t{seconds} * 1000;
  if (ms > kMaxOpTimeoutMs) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            function, ": timeout ", seconds, " s is over the most, ",
            kMaxOpTimeoutMs / 1000, " s (0: none)")),
        ACL_ERROR_INVALID_PARAM);
  }
  return ms;
}

// Sends the operator time-outs to every open device session.
aclError ApplyOpTimeouts(const char* function) {
  State& state = GetState();
  std::vector<Pinned> open;
  uint64_t execute, wait;
  {
    absl::MutexLock lock(&state.mu);
    if (!state.initialized) {
      return Fail(ACL_ERROR_UNINITIALIZE,
                  absl::StrCat(function, ": aclInit was not called"));
    }
    execute = state.op_execute_timeout_ms;
    wait = state.op_wait_timeout_ms;
    for (size_t device = 0; device < state.devices.size(); ++device) {
      if (state.devices[device].session != nullptr) {
        open.push_back(state.Pin(static_cast<uint32_t>(device)));
      }
    }
  }
  for (const Pinned& pinned : open) {
    absl::Status sent = pinned.session->SetOpTimeouts(execute, wait);
    if (!sent.ok()) {
      return FailAcl(
          Prefixed(pinned.Named(sent), absl::StrCat(function, ": ")));
    }
  }
  return ACL_SUCCESS;
}

}  // namespace

void ReportDeferred(uint32_t device, const absl::Status& status) {
  uint64_t stream = 0;
  if (status.ok() || !DeferredStreamOf(status, &stream)) return;
  const aclrtExceptionInfoCallback callback = ExceptionCallback().load();
  if (callback == nullptr) return;
  rtExceptionInfo info{static_cast<uint32_t>(TaskPositionOf(status)),
                       static_cast<uint32_t>(stream),
                       static_cast<uint32_t>(syscall(SYS_gettid)), device,
                       static_cast<uint32_t>(AclErrorOf(status))};
  callback(&info);
}

}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclrtSetExceptionInfoCallback(aclrtExceptionInfoCallback callback) {
  // NULL is allowed: it stops the calls.
  opserver::ExceptionCallback().store(callback);
  return ACL_SUCCESS;
}

uint32_t aclrtGetTaskIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  if (info == nullptr) {
    Fail(ACL_ERROR_INVALID_PARAM,
         "aclrtGetTaskIdFromExceptionInfo: info is NULL");
    return opserver::kInvalidExceptionInfo;
  }
  return info->task;
}

uint32_t aclrtGetStreamIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  if (info == nullptr) {
    Fail(ACL_ERROR_INVALID_PARAM,
         "aclrtGetStreamIdFromExceptionInfo: info is NULL");
    return opserver::kInvalidExceptionInfo;
  }
  return info->stream;
}

uint32_t aclrtGetThreadIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  if (info == nullptr) {
    Fail(ACL_ERROR_INVALID_PARAM,
         "aclrtGetThreadIdFromExceptionInfo: info is NULL");
    return opserver::kInvalidExceptionInfo;
  }
  return info->thread;
}

uint32_t aclrtGetDeviceIdFromExceptionInfo(const aclrtExceptionInfo* info) {
  if (info == nullptr) {
    Fail(ACL_ERROR_INVALID_PARAM,
         "aclrtGetDeviceIdFromExceptionInfo: info is NULL");
    return opserver::kInvalidExceptionInfo;
  }
  return info->device;
}

uint32_t aclrtGetErrorCodeFromExceptionInfo(const aclrtExceptionInfo* info) {
  if (info == nullptr) {
    Fail(ACL_ERROR_INVALID_PARAM,
         "aclrtGetErrorCodeFromExceptionInfo: info is NULL");
    return opserver::kInvalidExceptionInfo;
  }
  return info->code;
}

aclError aclrtStreamGetId(aclrtStream stream, int32_t* streamId) {
  if (streamId == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamGetId: streamId is NULL");
  }
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(GetState(), __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  *streamId = static_cast<int32_t>(target->handle);
  return ACL_SUCCESS;
}

aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode) {
  if (mode != ACL_CONTINUE_ON_FAILURE && mode != ACL_STOP_ON_FAILURE) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtSetStreamFailureMode: unknown mode ", mode,
                             " (ACL_CONTINUE_ON_FAILURE 0 or "
                             "ACL_STOP_ON_FAILURE 1)"));
  }
  // CANN refuses the default stream too.
  if (stream == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclrtSetStreamFailureMode: stream is NULL (the default "
                "stream's mode cannot be set)");
  }
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(GetState(), __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  absl::Status set = target->pinned.session->SetStreamFailureMode(
      target->handle, mode == ACL_STOP_ON_FAILURE);
  if (!set.ok()) {
    return FailAcl(opserver::Prefixed(target->pinned.Named(set),
                                      "aclrtSetStreamFailureMode: "));
  }
  return ACL_SUCCESS;
}

aclError aclrtSetOpExecuteTimeOut(uint32_t timeout) {
  absl::StatusOr<uint64_t> ms = opserver::TimeoutMs(__func__, timeout);
  if (!ms.ok()) return FailAcl(ms.status());
  State& state = GetState();
  {
    absl::MutexLock lock(&state.mu);
    state.op_execute_timeout_ms = *ms;
  }
  return opserver::ApplyOpTimeouts(__func__);
}

aclError aclrtSetOpWaitTimeout(uint32_t timeout) {
  absl::StatusOr<uint64_t> ms = opserver::TimeoutMs(__func__, timeout);
  if (!ms.ok()) return FailAcl(ms.status());
  State& state = GetState();
  {
    absl::MutexLock lock(&state.mu);
    state.op_wait_timeout_ms = *ms;
  }
  return opserver::ApplyOpTimeouts(__func__);
}

}  // extern "C"
