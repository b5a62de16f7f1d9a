// The C API's questions and bounded waits (CANN's acl/acl_rt.h):
// aclrtStreamQuery, the synchronize calls with a time-out, the thread's
// last error, the run mode and the saturation mode. A bounded wait waits for
// a record of the stream's probe event (which takes no deferred error), and
// only once it completed synchronizes as the plain call does, so a time-out
// leaves the queued work running and its error for the next synchronize.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "client/client.h"

namespace opserver {
namespace {

// -1: for ever (nullopt); below: INVALID_PARAM naming `function`.
absl::StatusOr<std::optional<absl::Duration>> TimeoutOf(const char* function,
                                                        int32_t timeout) {
  if (timeout == -1) return std::nullopt;
  if (timeout < 0) {
    return WithAclError(
        absl::InvalidArgumentError(
            absl::StrCat(function, ": timeout ", timeout,
                         " ms is negative (-1 waits for ever, 0 only checks)")),
        ACL_ERROR_INVALID_PARAM);
  }
  return absl::Milliseconds(timeout);
}

// Waits until the work queued on `stream` so far has run, within
// `timeout`: ACL_ERROR_RT_STREAM_SYNC_TIMEOUT past it. 0 only asks.
absl::Status WaitWithin(const char* function, const PinnedStream& target,
                        absl::Duration timeout) {
  absl::Status status;
  if (timeout == absl::ZeroDuration()) {
    absl::StatusOr<bool> busy =
        target.pinned.session->StreamBusy(target.handle);
    status = busy.ok() && *busy
                 ? absl::DeadlineExceededError("the stream is not done")
                 : busy.status();
  } else {
    status = target.pinned.session->WaitStream(target.handle, timeout);
  }
  if (absl::IsDeadlineExceeded(status)) {
    return WithAclError(
        absl::DeadlineExceededError(absl::StrCat(
            function, ": stream ", target.handle, " of device ",
            target.pinned.device, " not done within ",
            absl::FormatDuration(timeout),
            " (its work goes on; synchronize again to wait for it)")),
        ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  }
  return target.pinned.Named(status);
}

}  // namespace
}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus* status) {
  if (status == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: status is NULL");
  }
  State& state = GetState();
  absl::StatusOr<opserver::PinnedStream> target =
      opserver::PinStreamOf(state, __func__, stream);
  if (!target.ok()) return FailAcl(target.status());
  absl::StatusOr<bool> busy =
      target->pinned.session->StreamBusy(target->handle);
  if (!busy.ok()) {
    return FailAcl(opserver::Prefixed(target->pinned.Named(busy.status()),
                                      "aclrtStreamQuery: "));
  }
  *status = *busy ? ACL_STREAM_STATUS_NOT_READY : ACL_STREAM_STATUS_COMPLETE;
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream,
                                           int32_t timeout) {
  absl::StatusOr<std::optional<absl::Duration>> within =
      opserver::TimeoutOf(__func__, timeout);
  if (!within.ok()) return FailAcl(within.status());
  if (within->has_value()) {
    State& state = GetState();
    absl::StatusOr<opserver::PinnedStream> target =
        opserver::PinStreamOf(state, __func__, stream);
    if (!target.ok()) return FailAcl(target.status());
    if (absl::Status waited = opserver::WaitWithin(__func__, *target, **within);
        !waited.ok()) {
      return FailAcl(waited);
    }
  }
  // Done (or for ever): the plain call collects the copies and the error.
  return aclrtSynchronizeStream(stream);
}

aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
  absl::StatusOr<std::optional<absl::Duration>> within =
      opserver::TimeoutOf(__func__, timeout);
  if (!within.ok()) return FailAcl(within.status());
  if (absl::Status s = opserver::CheckUnsafeCall(GetState(), __func__);
      !s.ok()) {
    return FailAcl(s);
  }
  if (within->has_value()) {
    State& state = GetState();
    std::vector<opserver::PinnedStream> targets;
    {
      absl::MutexLock lock(&state.mu);
      absl::StatusOr<opserver::Pinned> pinned = opserver::PinCurrent(state);
      if (!pinned.ok()) {
        return FailAcl(opserver::Prefixed(
            pinned.status(), "aclrtSynchronizeDeviceWithTimeout: "));
      }
      targets.push_back({*pinned, 0});
      for (const auto& [id, entry] : state.streams) {
        if (entry.device == pinned->device) {
          targets.push_back({*pinned, entry.stream.handle()});
        }
      }
    }
    // One time-out for all the streams together.
    const absl::Time deadline = absl::Now() + **within;
    for (const opserver::PinnedStream& target : targets) {
      const absl::Duration left =
          std::max(deadline - absl::Now(), absl::ZeroDuration());
      absl::Status waited = opserver::WaitWithin(__func__, target, left);
      // A stream destroyed meanwhile has nothing left to wait for.
      if (!waited.ok() && !absl::IsNotFound(waited)) return FailAcl(waited);
    }
  }
  return aclrtSynchronizeDevice();
}

aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout) {
  absl::StatusOr<std::optional<absl::Duration>> within =
      opserver::TimeoutOf(__func__, timeout);
  if (!within.ok()) return FailAcl(within.status());
  if (!within->has_value()) return aclrtSynchronizeEvent(event);
  State& state = GetState();
  opserver::Pinned pinned;
  uint64_t handle;
  {
    absl::MutexLock lock(&state.mu);
    if (!state.initialized) {
      return Fail(ACL_ERROR_UNINITIALIZE,
                  "aclrtSynchronizeEventWithTimeout: aclInit was not called");
    }
    auto it = state.events.find(reinterpret_cast<uintptr_t>(event));
    if (event == nullptr || it == state.events.end()) {
      return Fail(ACL_ERROR_INVALID_PARAM,
                  absl::StrCat("aclrtSynchronizeEventWithTimeout: event ",
                               absl::Hex(reinterpret_cast<uintptr_t>(event)),
                               " is not a live aclrtCreateEvent event"));
    }
    pinned = state.Pin(it->second.device);
    handle = it->second.handle;
    if (absl::Status s = opserver::RefuseIfEventCaptured(state, __func__,
                                                         pinned.device, handle);
        !s.ok()) {
      return FailAcl(s);
    }
  }
  if (**within == absl::ZeroDuration()) {
    absl::StatusOr<bool> complete = pinned.session->QueryEvent(handle);
    if (!complete.ok()) return FailAcl(pinned.Named(complete.status()));
    if (*complete) return ACL_SUCCESS;
    return Fail(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                "aclrtSynchronizeEventWithTimeout: the event's record has "
                "not completed (timeout 0 only checks)");
  }
  absl::Status status = pinned.session->SynchronizeEventFor(handle, **within);
  if (absl::IsDeadlineExceeded(status)) {
    return Fail(ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
                absl::StrCat("aclrtSynchronizeEventWithTimeout: the event's "
                             "record did not complete within ",
                             absl::FormatDuration(**within)));
  }
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclrtPeekAtLastError(aclrtLastErrLevel level) {
  if (level != ACL_RT_THREAD_LEVEL) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtPeekAtLastError: unknown level ",
                             static_cast<int>(level),
                             " (ACL_RT_THREAD_LEVEL is the only one)"));
  }
  return opserver::LastErrorCode();
}

aclError aclrtGetLastError(aclrtLastErrLevel level) {
  if (level != ACL_RT_THREAD_LEVEL) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtGetLastError: unknown level ",
                             static_cast<int>(level),
                             " (ACL_RT_THREAD_LEVEL is the only one)"));
  }
  const aclError last = opserver::LastErrorCode();
  opserver::LastErrorCode() = ACL_SUCCESS;
  return last;
}

aclError aclrtGetRunMode(aclrtRunMode* runMode) {
  if (runMode == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is NULL");
  }
  *runMode = ACL_HOST;
  return ACL_SUCCESS;
}

aclError aclrtSetDeviceSatMode(aclrtFloatOverflowMode mode) {
  if (mode != ACL_RT_OVERFLOW_MODE_SATURATION &&
      mode != ACL_RT_OVERFLOW_MODE_INFNAN) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat("aclrtSetDeviceSatMode: unknown mode ",
                             static_cast<int>(mode),
                             " (ACL_RT_OVERFLOW_MODE_SATURATION or _INFNAN)"));
  }
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<uint32_t> device = opserver::CurrentDevice(state);
  if (!device.ok()) {
    return FailAcl(
        opserver::Prefixed(device.status(), "aclrtSetDeviceSatMode: "));
  }
  state.devices[*device].sat_mode = mode;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceSatMode(aclrtFloatOverflowMode* mode) {
  if (mode == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceSatMode: mode is NULL");
  }
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  absl::StatusOr<uint32_t> device = opserver::CurrentDevice(state);
  if (!device.ok()) {
    return FailAcl(
        opserver::Prefixed(device.status(), "aclrtGetDeviceSatMode: "));
  }
  *mode = static_cast<aclrtFloatOverflowMode>(state.devices[*device].sat_mode);
  return ACL_SUCCESS;
}

}  // extern "C"
