// The Runtime service's events (aclrtEvent) and device memory operations
// (Memset, CopyDeviceToDevice): the semantics are server/event.h's and
// server/memory_ops.h's, shared with the Pipeline channel's commands.

#include <chrono>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "server/grpc_status_util.h"
#include "server/memory_ops.h"
#include "server/runtime_service.h"
#include "server/synchronize_reactor.h"

namespace opserver {

absl::StatusOr<RuntimeService::EventTarget> RuntimeService::ResolveEvent(
    const grpc::ServerContextBase* context, absl::string_view id,
    uint64_t event, std::optional<uint64_t> stream_id) const {
  EventTarget target;
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(context, id);
  if (!session.ok()) return session.status();
  target.session = *std::move(session);
  absl::StatusOr<std::shared_ptr<Event>> found =
      target.session->GetEvent(event);
  if (!found.ok()) return found.status();
  target.event = *std::move(found);
  if (stream_id.has_value()) {
    absl::StatusOr<std::shared_ptr<Stream>> stream =
        target.session->GetStream(*stream_id);
    if (!stream.ok()) return stream.status();
    target.stream = *std::move(stream);
  }
  return target;
}

grpc::ServerUnaryReactor* RuntimeService::CreateEvent(
    grpc::CallbackServerContext* context, const v1::CreateEventRequest* request,
    v1::CreateEventResponse* response) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  absl::StatusOr<uint64_t> event = (*session)->CreateEvent(request->flags());
  if (event.ok()) response->set_event(*event);
  return Reply(context, event.status());
}

grpc::ServerUnaryReactor* RuntimeService::DestroyEvent(
    grpc::CallbackServerContext* context,
    const v1::DestroyEventRequest* request,
    v1::DestroyEventResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  return Reply(context, (*session)->DestroyEvent(request->event()));
}

grpc::ServerUnaryReactor* RuntimeService::RecordEvent(
    grpc::CallbackServerContext* context, const v1::RecordEventRequest* request,
    v1::RecordEventResponse* /*response*/) {
  absl::StatusOr<EventTarget> target = ResolveEvent(
      context, request->session(), request->event(), request->stream());
  if (!target.ok()) return Reply(context, target.status());
  return Reply(context, target->event->Record(*target->stream));
}

grpc::ServerUnaryReactor* RuntimeService::StreamWaitEvent(
    grpc::CallbackServerContext* context,
    const v1::StreamWaitEventRequest* request,
    v1::StreamWaitEventResponse* /*response*/) {
  absl::StatusOr<EventTarget> target = ResolveEvent(
      context, request->session(), request->event(), request->stream());
  if (!target.ok()) return Reply(context, target.status());
  return Reply(
      context,
      target->event->Wait(*target->stream, target->session->op_wait_timeout()));
}

grpc::ServerUnaryReactor* RuntimeService::ResetEvent(
    grpc::CallbackServerContext* context, const v1::ResetEventRequest* request,
    v1::ResetEventResponse* /*response*/) {
  absl::StatusOr<EventTarget> target = ResolveEvent(
      context, request->session(), request->event(), request->stream());
  if (!target.ok()) return Reply(context, target.status());
  return Reply(context, target->event->Reset(*target->stream));
}

grpc::ServerUnaryReactor* RuntimeService::QueryEvent(
    grpc::CallbackServerContext* context, const v1::QueryEventRequest* request,
    v1::QueryEventResponse* response) {
  absl::StatusOr<EventTarget> target =
      ResolveEvent(context, request->session(), request->event(), std::nullopt);
  if (!target.ok()) return Reply(context, target.status());
  // A cancelled record is no normal completion: the call fails with it.
  if (absl::Status cancelled = target->event->RecordError(); !cancelled.ok()) {
    return Reply(context, cancelled);
  }
  response->set_complete(target->event->Complete());
  response->set_recorded(target->event->Recorded());
  absl::StatusOr<Event::Clock::time_point> time =
      target->event->CompletionTime();
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
  absl::StatusOr<EventTarget> target =
      ResolveEvent(context, request->session(), request->event(), std::nullopt);
  if (!target.ok()) return Reply(context, target.status());
  absl::StatusOr<SessionSlot> slot = target->session->TakeSynchronizeSlot();
  if (!slot.ok()) return Reply(context, slot.status());
  // Answered by the record's completion (a stream always reaches it, even
  // cancelled), the event's destruction or the call's cancellation: no
  // thread waits meanwhile, and an abandoned call leaves nothing behind.
  return StartSynchronize(
      context, *std::move(slot),
      [event = target->event](
          SynchronizeAnswer answer) -> absl::StatusOr<std::function<void()>> {
        absl::StatusOr<uint64_t> ticket =
            event->WhenCompleteOrForgotten(std::move(answer));
        if (!ticket.ok()) return ticket.status();
        if (*ticket == 0) return std::function<void()>();
        return std::function<void()>(
            [weak = std::weak_ptr<Event>(event), ticket = *ticket] {
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
  absl::StatusOr<EventTarget> start =
      ResolveEvent(context, request->session(), request->start(), std::nullopt);
  if (!start.ok()) return Reply(context, start.status());
  absl::StatusOr<std::shared_ptr<Event>> end =
      start->session->GetEvent(request->end());
  if (!end.ok()) return Reply(context, end.status());
  absl::StatusOr<float> ms = Event::ElapsedMs(*start->event, **end);
  if (ms.ok()) response->set_ms(*ms);
  return Reply(context, ms.status());
}

grpc::ServerUnaryReactor* RuntimeService::Memset(
    grpc::CallbackServerContext* context, const v1::MemsetRequest* request,
    v1::MemsetResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      (*session)->GetStream(request->stream());
  if (!stream.ok()) return Reply(context, stream.status());
  return Reply(context, QueueMemset(**session, **stream, *request));
}

grpc::ServerUnaryReactor* RuntimeService::CopyDeviceToDevice(
    grpc::CallbackServerContext* context,
    const v1::CopyDeviceToDeviceRequest* request,
    v1::CopyDeviceToDeviceResponse* /*response*/) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (!session.ok()) return Reply(context, session.status());
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      (*session)->GetStream(request->stream());
  if (!stream.ok()) return Reply(context, stream.status());
  return Reply(context, QueueCopy(**session, **stream, *request));
}

}  // namespace opserver
