#include "runtime/command_pipeline.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "runtime/byte_range.h"
#include "runtime/event.h"
#include "runtime/executor.h"
#include "runtime/graph.h"
#include "runtime/log.h"
#include "runtime/memory_ops.h"
#include "runtime/stream.h"

namespace opserver {
namespace {

// `error` with `context` before its message and its aclnn status kept, so a
// deferred error says which command it came from, cut to
// kMaxKeptErrorBytes (it is kept until reported).
absl::Status Deferred(const absl::Status& error, absl::string_view context) {
  return kernels::AclnnError(
      kernels::GetAclnnStatus(error), error.code(),
      Truncated(absl::StrCat(context, ": ", error.message()),
                kMaxKeptErrorBytes));
}

}  // namespace

template <typename... Context>
void CommandPipeline::DeferToSession(const absl::Status& status,
                                     const Context&... context) {
  if (status.ok()) return;
  FailSessionLazily(
      [&] { return Deferred(status, absl::StrCat(context...)); });
}

CommandPipeline::CommandPipeline(const SessionLimits& limits, size_t max_fences,
                                 FenceDone fence_done,
                                 RuntimeObserver* observer,
                                 DataTransfers* data_transfers)
    : limits_(limits),
      max_fences_(std::max<size_t>(1, max_fences)),
      fence_done_([done = std::move(fence_done), observer](
                      uint64_t id, absl::Status status, std::string data) {
        if (!status.ok() && observer != nullptr) observer->DeferredError();
        done(id, std::move(status), std::move(data));
      }),
      observer_(observer),
      data_transfers_(data_transfers) {}

CommandPipeline::~CommandPipeline() { DisconnectCallbacks(); }

size_t CommandPipeline::Apply(
    Session& session,
    const google::protobuf::RepeatedPtrField<v1::PipelineCommand>& commands,
    size_t from, size_t to, const Resume& resume) {
  to = std::min(to, static_cast<size_t>(commands.size()));
  for (size_t i = from; i < to; ++i) {
    if (!ApplyOne(session, commands[static_cast<int>(i)], resume)) return i;
  }
  return std::max(from, to);
}

bool CommandPipeline::ApplyOne(Session& session,
                               const v1::PipelineCommand& command,
                               const Resume& resume) {
  if (observer_ != nullptr) observer_->PipelineCommand(command.command_case());
  using C = v1::PipelineCommand;
  switch (command.command_case()) {
    case C::kPlan:
      return Plan(session, command.plan());
    case C::kLaunch:
      return Launch(session, command.launch(), resume);
    case C::kDestroyExecutor:
      return DestroyExecutor(session, command.destroy_executor());
    case C::kSetExecutorRepeatable:
      return SetRepeatable(session, command.set_executor_repeatable());
    case C::kFree:
      return Free(session, command.free());
    case C::kFence:
      return Fence(session, command.fence(), resume);
    case C::kWrite:
      return Write(session, command.write(), resume);
    case C::kCreateEvent:
      return CreateEvent(session, command.create_event());
    case C::kRecordEvent:
      return RecordEvent(session, command.record_event());
    case C::kWaitEvent:
      return WaitEvent(session, command.wait_event());
    case C::kResetEvent:
      return ResetEvent(session, command.reset_event());
    case C::kDestroyEvent:
      return DestroyEvent(session, command.destroy_event());
    case C::kMemset:
      return Memset(session, command.memset(), resume);
    case C::kCopy:
      return Copy(session, command.copy(), resume);
    case C::kDefineGraph:
      return DefineGraph(session, command.define_graph());
    case C::kReplayGraph:
      return ReplayGraph(session, command.replay_graph(), resume);
    case C::kDestroyGraph:
      return DestroyGraph(session, command.destroy_graph());
    case C::kCallback:
      return Callback(session, command.callback(), resume);
    case C::kReleaseCallback:
      return ReleaseCallback(session, command.release_callback());
    case C::kStreamFailureMode:
      return StreamFailureMode(session, command.stream_failure_mode());
    case C::kOpTimeouts:
      return OpTimeouts(session, command.op_timeouts());
    case C::kDataTransfer:
      return DataTransfer(session, command.data_transfer(), resume);
    case C::kCancelDataTransfer:
      return CancelDataTransfer(session, command.cancel_data_transfer());
    case C::COMMAND_NOT_SET:
      break;
  }
  FailSession(absl::InvalidArgumentError(
      "an empty or unknown Pipeline command (this server knows plan, "
      "launch, destroy_executor, set_executor_repeatable, free, fence, "
      "write, create_event, record_event, wait_event, reset_event, "
      "destroy_event, memset, copy, define_graph, replay_graph, "
      "destroy_graph, callback, release_callback, stream_failure_mode, "
      "op_timeouts, data_transfer and cancel_data_transfer)"));
  return true;
}

bool CommandPipeline::StreamFull(Session& session, uint64_t stream_id,
                                 const Resume& resume) {
  // A fast client waits for a full stream rather than losing work to its
  // limit: the command is retried once the stream has run what it holds.
  absl::StatusOr<std::shared_ptr<Stream>> stream = session.GetStream(stream_id);
  if (!stream.ok() ||
      (*stream)->CheckRoom().code() != absl::StatusCode::kResourceExhausted) {
    return false;
  }
  (*stream)->WhenReached(resume);
  return true;
}

bool CommandPipeline::DestroyExecutor(Session& session, uint64_t id) {
  if (std::optional<absl::Status> refused = session.TakeRefusedPlan(id)) {
    // A refused plan not reported yet (by a launch or a session fence) is
    // reported now, once.
    if (!refused->ok()) FailSession(*std::move(refused));
    return true;
  }
  DeferToSession(session.DestroyExecutor(id), "DestroyExecutor ", id);
  return true;
}

bool CommandPipeline::SetRepeatable(Session& session, uint64_t id) {
  // A refused plan's launches report the plan's error.
  if (session.RefusedPlan(id, /*launch=*/false).has_value()) return true;
  DeferToSession(session.SetExecutorRepeatable(id), "SetExecutorRepeatable ",
                 id);
  return true;
}

bool CommandPipeline::Free(Session& session, uint64_t buffer) {
  DeferToSession(session.Free(buffer), "Free ", buffer);
  return true;
}

bool CommandPipeline::Callback(Session& session,
                               const v1::CallbackCommand& callback,
                               const Resume& resume) {
  // Its notice holds a place until written, as a fence's result does.
  if (!TakeReplyRoom(0, resume)) return false;
  const uint64_t id = callback.id();
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(callback.stream());
  absl::Status status = stream.status();
  if (status.ok()) {
    status = session.callbacks().Queue(
        **stream, id, callback.block(),
        [sink = callbacks_, id](absl::Status reached) {
          sink->Notify(id, std::move(reached));
        });
  }
  if (status.ok()) return true;
  status = Deferred(status, absl::StrCat("callback ", id));
  // The client learns it twice: the notice lets it drop the callback now,
  // the deferred error tells the next synchronize.
  if (stream.ok()) {
    (*stream)->Fail(status);
  } else {
    FailSession(status);
  }
  callbacks_->Notify(id, std::move(status));
  return true;
}

bool CommandPipeline::ReleaseCallback(Session& session, uint64_t id) {
  // An id that holds nothing may have crossed the time-out on the wire.
  session.callbacks().Release(id);
  return true;
}

bool CommandPipeline::StreamFailureMode(
    Session& session, const v1::StreamFailureModeCommand& mode) {
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(mode.stream());
  if (!stream.ok()) {
    DeferToSession(stream.status(), "stream_failure_mode");
    return true;
  }
  (*stream)->SetStopOnFailure(mode.stop());
  return true;
}

bool CommandPipeline::OpTimeouts(Session& session,
                                 const v1::OpTimeoutsCommand& timeouts) {
  DeferToSession(session.SetOpTimeouts(timeouts.execute_timeout_ms(),
                                       timeouts.wait_timeout_ms()),
                 "op_timeouts");
  return true;
}

bool CommandPipeline::DataTransfer(Session& session,
                                   const v1::DataTransferCommand& transfer,
                                   const Resume& resume) {
  // Like a launch, it waits for room on a full stream.
  if (StreamFull(session, transfer.stream(), resume)) return false;
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(transfer.stream());
  const absl::Status status =
      stream.ok() ? StartDataTransfer(session, *stream, transfer)
                  : stream.status();
  if (status.ok()) return true;
  // Its client is sending the ticket already: it must not wait for it.
  if (data_transfers_ != nullptr) data_transfers_->Refuse(transfer.ticket());
  auto deferred = [&] {
    return Deferred(
        status, absl::StrCat("data transfer of buffer ", transfer.buffer()));
  };
  if (!stream.ok()) {
    FailSessionLazily(deferred);
  } else {
    (*stream)->Fail(deferred());
  }
  return true;
}

bool CommandPipeline::CancelDataTransfer(Session& session,
                                         const std::string& ticket) {
  if (data_transfers_ != nullptr) data_transfers_->Cancel(&session, ticket);
  return true;
}

absl::Status CommandPipeline::StartDataTransfer(
    Session& session, const std::shared_ptr<Stream>& stream,
    const v1::DataTransferCommand& transfer) {
  if (data_transfers_ == nullptr) return NoDataPath();
  ASSIGN_OR_RETURN(const bool upload, IsUpload(transfer.direction()));
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer,
                   session.GetBuffer(transfer.buffer()));
  // As OpenDataTransfer checks it: the same transfer, without its call.
  RETURN_IF_ERROR(
      opserver::CheckRange(transfer.offset(), transfer.size(), buffer->size(),
                           upload ? "upload range" : "download range"));
  if (stream->device_stream() == nullptr) {
    return absl::FailedPreconditionError("the stream has no device");
  }
  return data_transfers_->Start({stream, std::move(buffer), transfer.offset(),
                                 transfer.size(), upload, transfer.ticket(),
                                 &session});
}

void CommandPipeline::CallbackSink::Notify(uint64_t id, absl::Status status) {
  absl::MutexLock lock(&mu);
  if (done) done(id, std::move(status));
}

void CommandPipeline::SetCallbackDone(CallbackDone done) {
  absl::MutexLock lock(&callbacks_->mu);
  callbacks_->done = std::move(done);
}

void CommandPipeline::DisconnectCallbacks() {
  CallbackDone dropped;  // Destroyed outside the lock.
  absl::MutexLock lock(&callbacks_->mu);
  dropped = std::move(callbacks_->done);
  callbacks_->done = nullptr;
}

bool CommandPipeline::Write(Session& session, const v1::WriteCommand& write,
                            const Resume& resume) {
  // Like a launch, a write waits for room on its stream, and for the
  // channel's queued writes to shrink below kMaxHeldBytes.
  if (StreamFull(session, write.stream(), resume)) return false;
  {
    absl::MutexLock lock(&writes_->mu);
    if (writes_->held > 0 &&
        writes_->held + write.data().size() > kMaxHeldBytes) {
      writes_->waiter = resume;
      return false;
    }
  }
  QueueWrite(session, write);
  return true;
}

bool CommandPipeline::CreateEvent(Session& session,
                                  const v1::CreateEventCommand& create) {
  DeferToSession(session.CreateEventAs(create.event(), create.flags()),
                 "CreateEvent ", create.event());
  return true;
}

bool CommandPipeline::RecordEvent(Session& session,
                                  const v1::RecordEventRequest& record) {
  OnEvent(session, record.event(), record.stream(), "RecordEvent",
          [](Event& event, Stream& stream) { return event.Record(stream); });
  return true;
}

bool CommandPipeline::WaitEvent(Session& session,
                                const v1::StreamWaitEventRequest& wait) {
  const absl::Duration timeout = session.op_wait_timeout();
  OnEvent(session, wait.event(), wait.stream(), "StreamWaitEvent",
          [timeout](Event& event, Stream& stream) {
            return event.Wait(stream, timeout);
          });
  return true;
}

bool CommandPipeline::ResetEvent(Session& session,
                                 const v1::ResetEventRequest& reset) {
  OnEvent(session, reset.event(), reset.stream(), "ResetEvent",
          [](Event& event, Stream& stream) { return event.Reset(stream); });
  return true;
}

bool CommandPipeline::DestroyEvent(Session& session, uint64_t id) {
  DeferToSession(session.DestroyEvent(id), "DestroyEvent ", id);
  return true;
}

bool CommandPipeline::Memset(Session& session, const v1::MemsetRequest& memset,
                             const Resume& resume) {
  return OnStream(session, memset.stream(), "Memset", resume,
                  [&](Stream& stream) {
                    return QueueMemset(session, stream, memset);
                  });
}

bool CommandPipeline::Copy(Session& session,
                           const v1::CopyDeviceToDeviceRequest& copy,
                           const Resume& resume) {
  return OnStream(session, copy.stream(), "CopyDeviceToDevice", resume,
                  [&](Stream& stream) {
                    return QueueCopy(session, stream, copy);
                  });
}

bool CommandPipeline::DefineGraph(Session& session,
                                  const v1::DefineGraphCommand& define) {
  DeferToSession(opserver::DefineGraph(session, define), "DefineGraph ",
                 define.graph());
  return true;
}

bool CommandPipeline::ReplayGraph(Session& session,
                                  const v1::ReplayGraphRequest& replay,
                                  const Resume& resume) {
  return OnStream(session, replay.stream(), "ReplayGraph", resume,
                  [&](Stream& stream) {
                    // On a Pipeline worker: a replay as large as a slice of
                    // eager launches may run here (runtime/executor.h).
                    return opserver::ReplayGraph(session, replay.graph(),
                                                 stream, kWorkerReplayLaunches);
                  });
}

bool CommandPipeline::DestroyGraph(Session& session, uint64_t id) {
  DeferToSession(session.DestroyGraph(id), "DestroyGraph ", id);
  return true;
}

bool CommandPipeline::OnStream(
    Session& session, uint64_t stream_id, absl::string_view what,
    const Resume& resume, const std::function<absl::Status(Stream&)>& queue) {
  // Like a launch, it waits for room on a full stream.
  if (StreamFull(session, stream_id, resume)) return false;
  absl::StatusOr<std::shared_ptr<Stream>> stream = session.GetStream(stream_id);
  if (!stream.ok()) {
    FailSessionLazily([&] { return Deferred(stream.status(), what); });
    return true;
  }
  if (absl::Status s = queue(**stream); !s.ok()) {
    (*stream)->Fail(Deferred(s, what));
  }
  return true;
}

void CommandPipeline::OnEvent(
    Session& session, uint64_t event_id, uint64_t stream_id,
    absl::string_view what,
    const std::function<absl::Status(Event&, Stream&)>& apply) {
  absl::StatusOr<std::shared_ptr<Stream>> stream = session.GetStream(stream_id);
  if (!stream.ok()) {
    FailSessionLazily([&] {
      return Deferred(stream.status(), absl::StrCat(what, " ", event_id));
    });
    return;
  }
  absl::StatusOr<std::shared_ptr<Event>> event = session.GetEvent(event_id);
  absl::Status status = event.ok() ? apply(**event, **stream) : event.status();
  if (!status.ok()) {
    (*stream)->Fail(Deferred(status, absl::StrCat(what, " ", event_id)));
  }
}

bool CommandPipeline::Plan(Session& session, const v1::PlanCommand& plan) {
  absl::StatusOr<std::shared_ptr<Executor>> executor =
      PlanExecutor(plan.request(), session, limits_.max_launch_elements);
  absl::Status status =
      executor.ok()
          ? session.AddExecutorAs(plan.executor(), *std::move(executor))
          : executor.status();
  if (status.ok()) return true;
  // The op name is the client's: only its start goes into the message.
  constexpr size_t kMaxOpNameBytes = 128;
  status = Deferred(
      status,
      absl::StrCat(Truncated(plan.request().op(), kMaxOpNameBytes),
                   " GetWorkspaceSize (executor ", plan.executor(), ")"));
  // An id in use stays what it is: a second plan under it is the session's
  // error, not its executor's.
  if (session.RefusedPlan(plan.executor(), /*launch=*/false).has_value() ||
      session.ExecutorForLaunch(plan.executor(), /*consume=*/false).ok()) {
    FailSession(std::move(status));
    return true;
  }
  // Past the handle limit the refusal is the session's error at once, and
  // its launches fail as launches of an unknown executor.
  if (absl::Status kept = session.AddRefusedPlan(plan.executor(), status);
      !kept.ok()) {
    FailSession(std::move(status));
  }
  return true;
}

bool CommandPipeline::Launch(Session& session, const v1::ExecuteRequest& launch,
                             const Resume& resume) {
  if (StreamFull(session, launch.stream(), resume)) return false;
  absl::Status status;
  if (std::optional<absl::Status> refused =
          session.RefusedPlan(launch.executor(), /*launch=*/true)) {
    status = *std::move(refused);
  }
  if (status.ok()) {
    status = LaunchExecutor(launch, session);
    if (status.ok()) return true;
    status = Deferred(status,
                      absl::StrCat("launch of executor ", launch.executor()));
  }
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(launch.stream());
  if (stream.ok()) {
    (*stream)->Fail(std::move(status));
  } else {
    FailSession(std::move(status));
  }
  return true;
}

void CommandPipeline::QueueWrite(Session& session,
                                 const v1::WriteCommand& write) {
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(write.stream());
  if (!stream.ok()) {
    FailSessionLazily([&] {
      return Deferred(stream.status(),
                      absl::StrCat("write to buffer ", write.buffer()));
    });
    return;
  }
  const uint64_t size = write.data().size();
  absl::StatusOr<std::shared_ptr<Buffer>> buffer =
      CheckRange(session, write.buffer(), write.offset(), size, "write");
  absl::Status status = buffer.status();
  if (status.ok() && (*stream)->device_stream() == nullptr) {
    status = absl::FailedPreconditionError("the stream has no device");
  }
  if (status.ok()) {
    // Returned to the budget when the copy has run or was dropped.
    struct Held {
      std::shared_ptr<WriteBudget> budget;
      uint64_t bytes;
      ~Held() { budget->Release(bytes); }
    };
    {
      absl::MutexLock lock(&writes_->mu);
      writes_->held += size;
    }
    std::shared_ptr<Held> held(new Held{writes_, size});
    // The task keeps `data` (and the budget) until the stream has
    // synchronized the copy (Stream: a task is done only after a
    // Synchronize that followed it), so it does not wait for it here.
    status = (*stream)->Enqueue([held, buffer = *std::move(buffer),
                                 device = (*stream)->device_stream(),
                                 offset = write.offset(),
                                 data = write.data()]() {
      return device->CopyToDevice(static_cast<char*>(buffer->data()) + offset,
                                  data.data(), data.size());
    });
  }
  if (!status.ok()) {
    (*stream)->Fail(
        Deferred(status, absl::StrCat("write to buffer ", write.buffer())));
  }
}

void CommandPipeline::WriteBudget::Release(uint64_t bytes) {
  Resume woken;
  {
    absl::MutexLock lock(&mu);
    held -= std::min(held, bytes);
    woken = std::exchange(waiter, nullptr);
  }
  if (woken) woken();
}

}  // namespace opserver
