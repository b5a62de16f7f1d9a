// The Runtime service's events (aclrtEvent) and device memory operations
// (Memset, CopyDeviceToDevice): the semantics are runtime/event.h's and
// runtime/memory_ops.h's, shared with the Pipeline channel's commands.

#include <chrono>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "runtime/memory_ops.h"
#include "server/grpc_status_util.h"
#include "server/runtime_service.h"
#include "server/synchronize_reactor.h"

namespace opserver {

absl::StatusOr<RuntimeService::EventTarget> RuntimeService::ResolveEvent(
    const grpc::ServerContextBase* context, absl::string_view id,
    uint64_t event, std::optional<uint64_t> stream_id) const {
  EventTarget target;
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, SessionOf(context, id));
  target.session = std::move(session);
  ASSIGN_OR_RETURN(std::shared_ptr<Event> found,
                   target.session->GetEvent(event));
  target.event = std::move(found);
  if (stream_id.has_value()) {
    ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                     target.session->GetStream(*stream_id));
    target.stream = std::move(stream);
  }
  return target;
}

grpc::ServerUnaryReactor* RuntimeService::CreateEvent(
    grpc::CallbackServerContext* context, const v1::CreateEventRequest* request,
    v1::CreateEventResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  absl::StatusOr<uint64_t> event = session->CreateEvent(request->flags());
  if (event.ok()) response->set_event(*event);
  return Reply(context, event.status());
}

grpc::ServerUnaryReactor* RuntimeService::DestroyEvent(
    grpc::CallbackServerContext* context,
    const v1::DestroyEventRequest* request,
    v1::DestroyEventResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  return Reply(context, session->DestroyEvent(request->event()));
}

grpc::ServerUnaryReactor* RuntimeService::RecordEvent(
    grpc::CallbackServerContext* context, const v1::RecordEventRequest* request,
    v1::RecordEventResponse* /*response*/) {
  ASSIGN_OR_RETURN(EventTarget target,
                   ResolveEvent(context, request->session(), request->event(),
                                request->stream()),
                   ReplyTo(context));
  return Reply(context, target.event->Record(*target.stream));
}

grpc::ServerUnaryReactor* RuntimeService::StreamWaitEvent(
    grpc::CallbackServerContext* context,
    const v1::StreamWaitEventRequest* request,
    v1::StreamWaitEventResponse* /*response*/) {
  ASSIGN_OR_RETURN(EventTarget target,
                   ResolveEvent(context, request->session(), request->event(),
                                request->stream()),
                   ReplyTo(context));
  return Reply(context, target.event->Wait(*target.stream,
                                           target.session->op_wait_timeout()));
}

grpc::ServerUnaryReactor* RuntimeService::ResetEvent(
    grpc::CallbackServerContext* context, const v1::ResetEventRequest* request,
    v1::ResetEventResponse* /*response*/) {
  ASSIGN_OR_RETURN(EventTarget target,
                   ResolveEvent(context, request->session(), request->event(),
                                request->stream()),
                   ReplyTo(context));
  return Reply(context, target.event->Reset(*target.stream));
}

grpc::ServerUnaryReactor* RuntimeService::QueryEvent(
    grpc::CallbackServerContext* context, const v1::QueryEventRequest* request,
    v1::QueryEventResponse* response) {
  ASSIGN_OR_RETURN(
      EventTarget target,
      ResolveEvent(context, request->session(), request->event(), std::nullopt),
      ReplyTo(context));
  // A cancelled record is no normal completion: the call fails with it.
  RETURN_IF_ERROR(target.event->RecordError(), ReplyTo(context));
  response->set_complete(target.event->Complete());
  response->set_recorded(target.event->Recorded());
  absl::StatusOr<Event::Clock::time_point> time =
      target.event->CompletionTime();
  if (time.ok()) {
    response->set_completed_ns(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            time->time_since_epoch())
            .count()));
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RuntimeService::SynchronizeEvent(
    grpc::CallbackServerContext* context,
    const v1::SynchronizeEventRequest* request,
    v1::SynchronizeEventResponse* /*response*/) {
  ASSIGN_OR_RETURN(
      EventTarget target,
      ResolveEvent(context, request->session(), request->event(), std::nullopt),
      ReplyTo(context));
  ASSIGN_OR_RETURN(SessionSlot slot, target.session->TakeSynchronizeSlot(),
                   ReplyTo(context));
  // Answered by the record's completion (a stream always reaches it, even
  // cancelled), the event's destruction or the call's cancellation: no
  // thread waits meanwhile, and an abandoned call leaves nothing behind.
  return StartSynchronize(
      context, std::move(slot),
      [event = target.event](
          SynchronizeAnswer answer) -> absl::StatusOr<std::function<void()>> {
        ASSIGN_OR_RETURN(uint64_t ticket,
                         event->WhenCompleteOrForgotten(std::move(answer)));
        if (ticket == 0) return std::function<void()>();
        return std::function<void()>(
            [weak = std::weak_ptr<Event>(event), ticket = ticket] {
              if (std::shared_ptr<Event> live = weak.lock()) {
                live->Forget(ticket);
              }
            });
      });
}

grpc::ServerUnaryReactor* RuntimeService::EventElapsedTime(
    grpc::CallbackServerContext* context,
    const v1::EventElapsedTimeRequest* request,
    v1::EventElapsedTimeResponse* response) {
  ASSIGN_OR_RETURN(
      EventTarget start,
      ResolveEvent(context, request->session(), request->start(), std::nullopt),
      ReplyTo(context));
  ASSIGN_OR_RETURN(std::shared_ptr<Event> end,
                   start.session->GetEvent(request->end()), ReplyTo(context));
  absl::StatusOr<float> ms = Event::ElapsedMs(*start.event, *end);
  if (ms.ok()) response->set_ms(*ms);
  return Reply(context, ms.status());
}

grpc::ServerUnaryReactor* RuntimeService::Memset(
    grpc::CallbackServerContext* context, const v1::MemsetRequest* request,
    v1::MemsetResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                   session->GetStream(request->stream()), ReplyTo(context));
  return Reply(context, QueueMemset(*session, *stream, *request));
}

grpc::ServerUnaryReactor* RuntimeService::CopyDeviceToDevice(
    grpc::CallbackServerContext* context,
    const v1::CopyDeviceToDeviceRequest* request,
    v1::CopyDeviceToDeviceResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                   session->GetStream(request->stream()), ReplyTo(context));
  return Reply(context, QueueCopy(*session, *stream, *request));
}

}  // namespace opserver
