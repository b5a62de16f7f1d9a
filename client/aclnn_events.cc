// The C API's events (CANN's aclrtEvent calls in acl/acl_rt.h): each is an
// event of the server session of the device that was current when it was
// made. Record, wait and reset are queued on the session's command channel
// (no round trip); query, synchronize and elapsed time ask the server.

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"
#include "common/event_flags.h"
#include "common/status_macros.h"

namespace opserver {
namespace {

// An event of the table and its device, pinned, for `function`; the error
// to return otherwise (ACL_ERROR_INVALID_PARAM for NULL or an unknown or
// destroyed event).
struct PinnedEvent {
  Pinned pinned;
  uint64_t handle = 0;
};

absl::StatusOr<PinnedEvent> PinEvent(State& state, const char* function,
                                     aclrtEvent event) {
  if (!state.initialized) {
    return WithAclError(absl::FailedPreconditionError(
                            absl::StrCat(function, ": aclInit was not called")),
                        ACL_ERROR_UNINITIALIZE);
  }
  auto it = state.events.find(reinterpret_cast<uintptr_t>(event));
  if (event == nullptr || it == state.events.end()) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            function, ": event ", absl::Hex(reinterpret_cast<uintptr_t>(event)),
            " is not a live aclrtCreateEvent event")),
        ACL_ERROR_INVALID_PARAM);
  }
  return PinnedEvent{state.Pin(it->second.device), it->second.handle};
}

// The event and `stream` for a stream operation (record, reset, wait):
// both on one device, the stream's (NULL: the current context's default
// stream).
struct StreamAndEvent {
  PinnedEvent event;
  uint64_t stream = 0;
};

absl::StatusOr<StreamAndEvent> PinStreamAndEvent(State& state,
                                                 const char* function,
                                                 aclrtEvent event,
                                                 aclrtStream stream) {
  ASSIGN_OR_RETURN(PinnedEvent pinned, PinEvent(state, function, event));
  uint32_t device;
  if (stream == nullptr) {
    ASSIGN_OR_RETURN(uint32_t current, CurrentDevice(state));
    device = current;
  } else {
    auto it = state.streams.find(reinterpret_cast<uintptr_t>(stream));
    if (it == state.streams.end()) {
      return WithAclError(absl::InvalidArgumentError(absl::StrCat(
                              function, ": stream ",
                              absl::Hex(reinterpret_cast<uintptr_t>(stream)),
                              " is not a live aclrtCreateStream stream")),
                          ACL_ERROR_INVALID_PARAM);
    }
    device = it->second.device;
  }
  ASSIGN_OR_RETURN(uint64_t handle, StreamHandle(state, stream, device));
  if (device != pinned.pinned.device) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            function, ": the event is on device ", pinned.pinned.device,
            ", the stream on device ", device)),
        ACL_ERROR_RT_STREAM_CONTEXT);
  }
  return StreamAndEvent{std::move(pinned), handle};
}

aclError CreateEvent(const char* function, aclrtEvent* event, uint32_t flag) {
  if (event == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": event is NULL"));
  }
  if ((flag & ~kKnownEventFlags) != 0) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": unknown flags 0x",
                             absl::Hex(flag & ~kKnownEventFlags)));
  }
  State& state = GetState();
  Pinned pinned;
  {
    absl::MutexLock lock(&state.mu);
    absl::StatusOr<Pinned> current = PinCurrent(state);
    if (!current.ok()) return FailAcl(current.status());
    pinned = *std::move(current);
  }
  absl::StatusOr<uint64_t> created = pinned.session->CreateEvent(flag);
  if (!created.ok()) return FailAcl(pinned.Named(created.status()));
  absl::MutexLock lock(&state.mu);
  if (!StillCurrent(state, pinned)) {
    return Fail(
        ACL_ERROR_RT_FAILURE,
        absl::StrCat(function, ": the device was reset during the call"));
  }
  const uintptr_t id = kEventBase + 16 * state.next_event++;
  state.events.emplace(id, EventEntry{pinned.device, *created});
  *event = reinterpret_cast<aclrtEvent>(id);
  return ACL_SUCCESS;
}

// A record (`queue` is RecordEvent) or reset on a capturing stream: the
// record is recorded, and the event remembered as the capture's (a stream
// that waits on it joins the capture); a reset is not a graph task.
aclError CaptureOnStream(State& state, const char* function, Capture& capture,
                         const StreamAndEvent& target, aclrtStream stream,
                         bool record) {
  const Pinned& pinned = target.event.pinned;
  if (!capture.invalidated.ok()) {
    return Fail(
        ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
        absl::StrCat(function, ": the capture of this stream was invalidated: ",
                     capture.invalidated.message()));
  }
  if (!record) {
    return FailAcl(Invalidate(
        capture, WithAclError(absl::FailedPreconditionError(absl::StrCat(
                                  function,
                                  ": an event reset cannot be captured (the "
                                  "capture is invalidated)")),
                              ACL_ERROR_RT_FEATURE_NOT_SUPPORT)));
  }
  absl::StatusOr<v1::PipelineCommand> task =
      pinned.session->RecordEventCommand(target.event.handle, target.stream);
  if (!task.ok()) return FailAcl(pinned.Named(task.status()));
  const uintptr_t key = reinterpret_cast<uintptr_t>(stream);
  Record(capture, key, *std::move(task));
  capture.recorded[target.event.handle] = {key, capture.work[key]};
  return ACL_SUCCESS;
}

// A wait of `target.stream` on `target.event` while a capture is involved:
// `waiting` (the stream's capture, or null) and `recording` (the event's).
// The stream joins the event's capture when it is in none (fork); a stream
// of the capture waiting on another's event joins that one back.
aclError CaptureWait(State& state, Capture* waiting, Capture* recording,
                     const StreamAndEvent& target, aclrtStream stream) {
  const Pinned& pinned = target.event.pinned;
  if (waiting != nullptr && recording != nullptr && waiting != recording) {
    absl::Status refused = WithAclError(
        absl::FailedPreconditionError(
            "aclrtStreamWaitEvent: the stream and the event belong to two "
            "different captures (both are invalidated)"),
        ACL_ERROR_RT_CAPTURE_DEPENDENCY);
    Invalidate(*recording, refused).IgnoreError();
    return FailAcl(Invalidate(*waiting, refused));
  }
  Capture& capture = waiting != nullptr ? *waiting : *recording;
  if (!capture.invalidated.ok()) {
    return Fail(ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED,
                absl::StrCat("aclrtStreamWaitEvent: the capture was "
                             "invalidated: ",
                             capture.invalidated.message()));
  }
  absl::StatusOr<v1::PipelineCommand> task =
      pinned.session->WaitEventCommand(target.stream, target.event.handle);
  if (!task.ok()) return FailAcl(pinned.Named(task.status()));
  const uintptr_t key = reinterpret_cast<uintptr_t>(stream);
  if (waiting == nullptr) {
    state.capturing[key] = capture.model;  // The fork.
  }
  if (auto it = capture.recorded.find(target.event.handle);
      it != capture.recorded.end() && it->second.first != key) {
    uint64_t& joined = capture.joined_at[it->second.first];
    joined = std::max(joined, it->second.second);
  }
  Record(capture, key, *std::move(task));
  return ACL_SUCCESS;
}

// `function` (aclrtRecordEvent, aclrtResetEvent): `queue` of the event on
// the stream, queued on the device's command channel (recorded instead on
// a capturing stream).
aclError QueueOnStream(
    const char* function, aclrtEvent event, aclrtStream stream,
    absl::Status (remote::Session::*queue)(uint64_t event, uint64_t stream)) {
  State& state = GetState();
  absl::StatusOr<StreamAndEvent> target;
  {
    absl::MutexLock lock(&state.mu);
    target = PinStreamAndEvent(state, function, event, stream);
    if (!target.ok()) return FailAcl(target.status());
    if (Capture* capture = CaptureOf(state, stream); capture != nullptr) {
      return CaptureOnStream(state, function, *capture, *target, stream,
                             queue == &remote::Session::RecordEvent);
    }
  }
  const Pinned& pinned = target->event.pinned;
  absl::Status status =
      (pinned.session.get()->*queue)(target->event.handle, target->stream);
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

}  // namespace
}  // namespace opserver

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclError aclrtCreateEvent(aclrtEvent* event) {
  return opserver::CreateEvent(__func__, event, ACL_EVENT_SYNC);
}

aclError aclrtCreateEventWithFlag(aclrtEvent* event, uint32_t flag) {
  return opserver::CreateEvent(__func__, event, flag);
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  return opserver::QueueOnStream(__func__, event, stream,
                                 &opserver::remote::Session::RecordEvent);
}

aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) {
  return opserver::QueueOnStream(__func__, event, stream,
                                 &opserver::remote::Session::ResetEvent);
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
  State& state = GetState();
  absl::StatusOr<opserver::StreamAndEvent> target;
  absl::StatusOr<opserver::PinnedEvent> other;
  {
    absl::MutexLock lock(&state.mu);
    target = opserver::PinStreamAndEvent(state, __func__, event, stream);
    opserver::Capture* waiting = opserver::CaptureOf(state, stream);
    if (!target.ok()) {
      if (opserver::AclErrorOf(target.status()) !=
          ACL_ERROR_RT_STREAM_CONTEXT) {
        return FailAcl(target.status());
      }
      other = opserver::PinEvent(state, __func__, event);
      if (!other.ok()) return FailAcl(other.status());
      if (waiting != nullptr) {
        // Waited for here, on the host: nothing a graph could hold.
        return FailAcl(opserver::Invalidate(
            *waiting,
            opserver::WithAclError(
                absl::FailedPreconditionError(
                    "aclrtStreamWaitEvent: a capturing stream cannot wait on "
                    "an event of another device (the capture is "
                    "invalidated)"),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT)));
      }
    } else {
      opserver::Capture* recording = opserver::CaptureRecording(
          state, target->event.pinned.device, target->event.handle);
      if (stream == nullptr && recording != nullptr) {
        // The default stream cannot be captured, so it cannot fork.
        return FailAcl(opserver::Invalidate(
            *recording,
            opserver::WithAclError(
                absl::FailedPreconditionError(
                    "aclrtStreamWaitEvent: the default stream cannot wait on "
                    "an event recorded in a capture (it cannot join one; the "
                    "capture is invalidated)"),
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT)));
      }
      if (waiting != nullptr || recording != nullptr) {
        return opserver::CaptureWait(state, waiting, recording, *target,
                                     stream);
      }
    }
  }
  if (!target.ok()) {
    // An event of another device (another session, perhaps another
    // server): the stream's later work is ordered after it by waiting
    // here, before this thread queues anything later.
    absl::Status status =
        other->pinned.session->SynchronizeEvent(other->handle);
    if (!status.ok()) return FailAcl(other->pinned.Named(status));
    return ACL_SUCCESS;
  }
  const opserver::Pinned& pinned = target->event.pinned;
  absl::Status status =
      pinned.session->StreamWaitEvent(target->stream, target->event.handle);
  if (!status.ok()) return FailAcl(pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclrtQueryEventStatus(aclrtEvent event,
                               aclrtEventRecordedStatus* status) {
  if (status == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                "aclrtQueryEventStatus: status is NULL");
  }
  State& state = GetState();
  absl::StatusOr<opserver::PinnedEvent> pinned;
  {
    absl::MutexLock lock(&state.mu);
    pinned = opserver::PinEvent(state, __func__, event);
    if (!pinned.ok()) return FailAcl(pinned.status());
    if (absl::Status s = opserver::RefuseIfEventCaptured(
            state, __func__, pinned->pinned.device, pinned->handle);
        !s.ok()) {
      return FailAcl(s);
    }
  }
  absl::StatusOr<bool> complete =
      pinned->pinned.session->QueryEvent(pinned->handle);
  if (!complete.ok()) return FailAcl(pinned->pinned.Named(complete.status()));
  *status = *complete ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                      : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeEvent(aclrtEvent event) {
  State& state = GetState();
  absl::StatusOr<opserver::PinnedEvent> pinned;
  {
    absl::MutexLock lock(&state.mu);
    pinned = opserver::PinEvent(state, __func__, event);
    if (!pinned.ok()) return FailAcl(pinned.status());
    if (absl::Status s = opserver::RefuseIfEventCaptured(
            state, __func__, pinned->pinned.device, pinned->handle);
        !s.ok()) {
      return FailAcl(s);
    }
  }
  // Other threads may use the API while this one waits.
  absl::Status status =
      pinned->pinned.session->SynchronizeEvent(pinned->handle);
  if (!status.ok()) return FailAcl(pinned->pinned.Named(status));
  return ACL_SUCCESS;
}

aclError aclrtEventElapsedTime(float* ms, aclrtEvent startEvent,
                               aclrtEvent endEvent) {
  if (ms == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM, "aclrtEventElapsedTime: ms is NULL");
  }
  State& state = GetState();
  absl::StatusOr<opserver::PinnedEvent> start, end;
  {
    absl::MutexLock lock(&state.mu);
    start = opserver::PinEvent(state, __func__, startEvent);
    if (!start.ok()) return FailAcl(start.status());
    end = opserver::PinEvent(state, __func__, endEvent);
    if (!end.ok()) return FailAcl(end.status());
    for (const opserver::PinnedEvent* one : {&*start, &*end}) {
      if (absl::Status s = opserver::RefuseIfEventCaptured(
              state, __func__, one->pinned.device, one->handle);
          !s.ok()) {
        return FailAcl(s);
      }
    }
    if (start->pinned.device != end->pinned.device) {
      return Fail(
          ACL_ERROR_RT_STREAM_CONTEXT,
          absl::StrCat("aclrtEventElapsedTime: the events are on "
                       "devices ",
                       start->pinned.device, " and ", end->pinned.device,
                       " (their clocks are different servers')"));
    }
  }
  absl::StatusOr<float> elapsed =
      start->pinned.session->EventElapsedMs(start->handle, end->handle);
  if (!elapsed.ok()) {
    const absl::Status named = start->pinned.Named(elapsed.status());
    if (named.code() == absl::StatusCode::kFailedPrecondition) {
      return Fail(ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID, named.message());
    }
    return FailAcl(named);
  }
  *ms = *elapsed;
  return ACL_SUCCESS;
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  State& state = GetState();
  absl::StatusOr<opserver::PinnedEvent> pinned;
  {
    absl::MutexLock lock(&state.mu);
    pinned = opserver::PinEvent(state, __func__, event);
    if (!pinned.ok()) return FailAcl(pinned.status());
    state.events.erase(reinterpret_cast<uintptr_t>(event));
  }
  absl::Status status = pinned->pinned.session->DestroyEvent(pinned->handle);
  if (!status.ok()) return FailAcl(pinned->pinned.Named(status));
  return ACL_SUCCESS;
}

}  // extern "C"
