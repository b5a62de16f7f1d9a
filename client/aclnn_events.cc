// The C API's events (CANN's aclrtEvent calls in acl/acl_rt.h): each is an
// event of the server session of the device that was current when it was
// made. Record, wait and reset are queued on the session's command channel
// (no round trip); query, synchronize and elapsed time ask the server.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "client/aclnn_state.h"

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
  absl::StatusOr<PinnedEvent> pinned = PinEvent(state, function, event);
  if (!pinned.ok()) return pinned.status();
  uint32_t device;
  if (stream == nullptr) {
    absl::StatusOr<uint32_t> current = CurrentDevice(state);
    if (!current.ok()) return current.status();
    device = *current;
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
  absl::StatusOr<uint64_t> handle = StreamHandle(state, stream, device);
  if (!handle.ok()) return handle.status();
  if (device != pinned->pinned.device) {
    return WithAclError(
        absl::InvalidArgumentError(absl::StrCat(
            function, ": the event is on device ", pinned->pinned.device,
            ", the stream on device ", device)),
        ACL_ERROR_RT_STREAM_CONTEXT);
  }
  return StreamAndEvent{*std::move(pinned), *handle};
}

aclError CreateEvent(const char* function, aclrtEvent* event, uint32_t flag) {
  if (event == nullptr) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": event is NULL"));
  }
  constexpr uint32_t kKnownFlags =
      ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE |
      ACL_EVENT_EXTERNAL | ACL_EVENT_IPC;
  if ((flag & ~kKnownFlags) != 0) {
    return Fail(ACL_ERROR_INVALID_PARAM,
                absl::StrCat(function, ": unknown flags 0x",
                             absl::Hex(flag & ~kKnownFlags)));
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

// `function` (aclrtRecordEvent, aclrtResetEvent): `queue` of the event on
// the stream, queued on the device's command channel.
aclError QueueOnStream(
    const char* function, aclrtEvent event, aclrtStream stream,
    absl::Status (remote::Session::*queue)(uint64_t event, uint64_t stream)) {
  State& state = GetState();
  absl::StatusOr<StreamAndEvent> target;
  {
    absl::MutexLock lock(&state.mu);
    target = PinStreamAndEvent(state, function, event, stream);
    if (!target.ok()) return FailAcl(target.status());
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
    if (!target.ok()) {
      if (opserver::AclErrorOf(target.status()) !=
          ACL_ERROR_RT_STREAM_CONTEXT) {
        return FailAcl(target.status());
      }
      other = opserver::PinEvent(state, __func__, event);
      if (!other.ok()) return FailAcl(other.status());
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
