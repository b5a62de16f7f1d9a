#include "server/runtime_service.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data_path.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "common/values.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "kernels/dtype.h"
#include "runtime/log.h"
#include "runtime/value_requests.h"
#include "server/auth.h"
#include "server/grpc_status_util.h"
#include "server/raw_message.h"
#include "server/synchronize_reactor.h"
#include "server/upload_parser.h"
#include "server/version.h"

namespace opserver {

// An Attach stream: binds its session's life to the call.
class RuntimeService::Attacher final
    : public grpc::ServerWriteReactor<v1::AttachEvent> {
 public:
  // `slot` is the session's TakeAttachSlot, held until the call is done.
  Attacher(RuntimeService* service, std::shared_ptr<Session> session,
           SessionSlot slot, std::unique_ptr<TokenBoundCall> binding)
      : service_(service),
        session_(std::move(session)),
        slot_(std::move(slot)),
        binding_(std::move(binding)) {
    session_->Touch();
    absl::MutexLock lock(&mu_);
    event_.set_event("attached");
    writing_ = true;
    StartWrite(&event_);
  }

  // Server shutdown or the session closed by CloseSession: tell the client
  // why and end the call (which drops its hold on the session, so a closed
  // session's memory is not kept alive by its Attach call.
  void Stop(absl::string_view why = "server shutting down") {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stop_reason_ = std::string(why);
    if (finished_ || writing_) return;
    event_.set_event(stop_reason_);
    StartWriteAndFinish(&event_, grpc::WriteOptions(), grpc::Status::OK);
    finished_ = true;
  }

  const std::string& session_id() const { return session_->id(); }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (finished_) return;
    if (!ok || cancelled_) {
      FinishLocked(grpc::Status::CANCELLED);
    } else if (stopping_) {
      event_.set_event(stop_reason_);
      StartWriteAndFinish(&event_, grpc::WriteOptions(), grpc::Status::OK);
      finished_ = true;
    }
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    slot_ = SessionSlot();
    session_->Touch();  // The idle timeout starts now.
    if (!stopping) {
      // The client went away (or cancelled): free everything it owned.
      service_->sessions_
          ->Close(session_->id(), session_->owner(),
                  "attached client went away")
          .IgnoreError();
    }
    service_->RemoveAttacher(this);
    delete this;
  }

 private:
  void FinishLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  RuntimeService* const service_;
  const std::shared_ptr<Session> session_;
  SessionSlot slot_;
  // Revoking the token ends the call, which closes the session.
  const std::unique_ptr<TokenBoundCall> binding_;
  absl::Mutex mu_;
  v1::AttachEvent event_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

RuntimeService::RuntimeService(SessionManager* sessions, TransferLimits limits,
                               const Authenticator* authenticator,
                               DataListener* data_listener, WorkPool* workers)
    : sessions_(sessions),
      limits_(limits),
      authenticator_(authenticator),
      data_listener_(data_listener),
      workers_(workers),
      // Throws std::system_error without a thread (the Server turns it into
      // its start's error).
      watchdog_(NewThread([this] { WatchTransfers(); })) {}

RuntimeService::~RuntimeService() {
  {
    absl::MutexLock lock(&mu_);
    destroying_ = true;
  }
  watchdog_.join();
  // Data movers release the device memory they hold before they count
  // themselves out; the device must outlive that.
  absl::MutexLock lock(&movers_->mu);
  movers_->mu.Await(absl::Condition(
      +[](int* count) { return *count == 0; }, &movers_->count));
}

void RuntimeService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (Attacher* attacher : attachers_) attacher->Stop();
  }
  AbortPipelinedTransfers(absl::UnavailableError(
      "data transfer ended: the server is shutting down"));
}

absl::StatusOr<RuntimeService::TransferTarget> RuntimeService::ResolveTransfer(
    absl::string_view session, uint64_t buffer, uint64_t offset, uint64_t size,
    uint64_t stream, absl::string_view what,
    const absl::StatusOr<std::string>& caller,
    std::optional<absl::string_view> routing_key) {
  TransferTarget target;
  ASSIGN_OR_RETURN(std::shared_ptr<Session> owner,
                   sessions_->GetForCaller(session, caller, routing_key));
  target.session = std::move(owner);
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> found,
                   target.session->GetBuffer(buffer));
  target.buffer = std::move(found);
  RETURN_IF_ERROR(CheckRange(offset, size, target.buffer->size(), what));
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> queue,
                   target.session->GetStream(stream));
  target.stream = std::move(queue);
  return target;
}

absl::Status NoDeviceStream() {
  return absl::FailedPreconditionError(
      "the stream has no device stream (the device could not create one)");
}

void RuntimeService::RemoveAttacher(Attacher* attacher) {
  absl::MutexLock lock(&mu_);
  attachers_.erase(attacher);
}

grpc::ServerUnaryReactor* RuntimeService::GetDeviceInfo(
    grpc::CallbackServerContext* context,
    const v1::GetDeviceInfoRequest* /*request*/,
    v1::GetDeviceInfoResponse* response) {
  for (uint32_t i = 0; i < sessions_->device_count(); ++i) {
    const DeviceDescription description = sessions_->device(i)->Describe();
    if (i == 0) {
      // Device 0 at the top level too, as before there was a list.
      response->set_kind(description.kind);
      response->set_name(description.name);
      response->set_memory_bytes(description.memory_bytes);
      response->set_threads(description.threads);
    }
    v1::DeviceInfo* info = response->add_devices();
    info->set_index(i);
    info->set_kind(description.kind);
    info->set_name(description.name);
    info->set_memory_bytes(description.memory_bytes);
    info->set_threads(description.threads);
  }
  response->set_server_version(kServerVersion);
  response->set_grpc_version(grpc::Version());
  response->set_api_version(kApiVersion);
  const SessionLimits& session_limits = sessions_->limits();
  v1::Limits* limits = response->mutable_limits();
  limits->set_max_message_bytes(limits_.max_message_bytes);
  limits->set_session_memory_bytes(session_limits.session_memory_bytes);
  limits->set_max_sessions(session_limits.max_sessions);
  limits->set_max_handles_per_session(session_limits.max_handles_per_session);
  limits->set_chunk_bytes(limits_.chunk_bytes);
  limits->set_idle_timeout_seconds(
      static_cast<uint32_t>(absl::ToInt64Seconds(session_limits.idle_timeout)));
  limits->set_max_values(limits_.max_values);
  return Reply(context, absl::OkStatus());
}

// CreateSession's reply, once its session exists. A session whose id
// never reached the client (the call was cancelled, or its deadline passed,
// before the reply left) is one nobody can use or close: it is closed when
// the call ends cancelled, instead of holding a --max_sessions place and
// its memory until the idle timeout.
class RuntimeService::SessionCreator final : public grpc::ServerUnaryReactor {
 public:
  SessionCreator(RuntimeService* service, grpc::CallbackServerContext* context,
                 std::string session, std::string owner)
      : service_(service),
        context_(context),
        session_(std::move(session)),
        owner_(std::move(owner)) {
    const auto& hold = service_->limits_.hold_create_session_reply;
    absl::MutexLock lock(&mu_);
    if (!(hold && hold(session_))) FinishLocked();
  }

  // Only a held reply waits for this (in production the reply is sent at
  // once, and OnDone sees whether it left).
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked();
  }

  // gRPC reports the call cancelled when its status was not sent: the
  // client cancelled, its deadline passed, or the connection broke first.
  void OnDone() override {
    if (context_->IsCancelled()) {
      // NOT_FOUND when it is gone already (shutdown): nothing to do.
      service_->sessions_
          ->Close(session_, owner_,
                  "its CreateSession call was cancelled before the reply "
                  "left")
          .IgnoreError();
    }
    delete this;
  }

 private:
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status::OK);
  }

  RuntimeService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string session_;
  const std::string owner_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerUnaryReactor* RuntimeService::CreateSession(
    grpc::CallbackServerContext* context,
    const v1::CreateSessionRequest* request,
    v1::CreateSessionResponse* response) {
  ASSIGN_OR_RETURN(std::string caller, Caller(context), ReplyTo(context));
  if (draining_.load(std::memory_order_relaxed)) {
    // UNAVAILABLE: retryable, and a client that retries reaches another
    // server once the load balancer has seen this one's NOT_SERVING.
    return Reply(context,
                 absl::UnavailableError(
                     "server draining: it is shutting down and takes no new "
                     "sessions (open sessions are served until they close); "
                     "use another server"));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<Session> session,
      sessions_->Create(request->client_name(), caller, request->device(),
                        SessionRoutingKeyOf(context)),
      ReplyTo(context));
  response->set_session(session->id());
  response->set_idle_timeout_seconds(static_cast<uint32_t>(
      absl::ToInt64Seconds(sessions_->limits().idle_timeout)));
  return new SessionCreator(this, context, session->id(), caller);
}

grpc::ServerUnaryReactor* RuntimeService::CloseSession(
    grpc::CallbackServerContext* context,
    const v1::CloseSessionRequest* request,
    v1::CloseSessionResponse* /*response*/) {
  // Answer once the session's memory is released, not merely scheduled.
  CallLog::NoteSession(context, request->session());
  ASSIGN_OR_RETURN(std::string caller, Caller(context), ReplyTo(context));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = sessions_->Close(
      request->session(), caller, "closed by the client",
      [reactor] { reactor->Finish(grpc::Status::OK); },
      SessionRoutingKeyOf(context));
  if (!status.ok()) {
    reactor->Finish(ToGrpcStatus(status, context));
    return reactor;
  }
  absl::MutexLock lock(&mu_);
  for (Attacher* attacher : attachers_) {
    if (attacher->session_id() == request->session()) {
      attacher->Stop("session closed by CloseSession");
    }
  }
  return reactor;
}

grpc::ServerWriteReactor<v1::AttachEvent>* RuntimeService::Attach(
    grpc::CallbackServerContext* context, const v1::AttachRequest* request) {
  // Bound before the session is looked up: a revocation from here on ends
  // the call.
  auto binding = std::make_unique<TokenBoundCall>(authenticator_, context);
  CallLog::NoteSession(context, request->session());
  absl::StatusOr<std::shared_ptr<Session>> session = sessions_->GetForCaller(
      request->session(), binding->caller(), SessionRoutingKeyOf(context));
  absl::StatusOr<SessionSlot> slot =
      session.ok() ? (*session)->TakeAttachSlot()
                   : absl::StatusOr<SessionSlot>(session.status());
  if (!slot.ok()) {
    // A reactor that only finishes with the error (a refused call does not
    // attach, so its end closes nothing).
    class Failed final : public grpc::ServerWriteReactor<v1::AttachEvent> {
     public:
      explicit Failed(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Failed(ToGrpcStatus(slot.status(), context));
  }
  absl::MutexLock lock(&mu_);
  auto* attacher = new Attacher(this, *std::move(session), *std::move(slot),
                                std::move(binding));
  attachers_.insert(attacher);
  if (shutting_down_) attacher->Stop();
  return attacher;
}

grpc::ServerUnaryReactor* RuntimeService::GetSessionStats(
    grpc::CallbackServerContext* context,
    const v1::GetSessionStatsRequest* request, v1::SessionStats* response) {
  absl::StatusOr<std::shared_ptr<Session>> session =
      SessionOf(context, request->session());
  if (session.ok()) {
    SessionStatsSnapshot stats = (*session)->Stats();
    response->set_buffers(stats.buffers);
    response->set_buffer_bytes(stats.buffer_bytes);
    response->set_streams(stats.streams);
    response->set_executors(stats.executors);
    response->set_events(stats.events);
    response->set_pending_event_operations(stats.pending_event_operations);
    response->set_attach_streams(stats.attach_streams);
    response->set_pending_synchronizes(stats.pending_synchronizes);
    response->set_graphs(stats.graphs);
    response->set_graph_tasks(stats.graph_tasks);
    response->set_device((*session)->device_index());
  }
  return Reply(context, session.status());
}

grpc::ServerUnaryReactor* RuntimeService::GetServerStats(
    grpc::CallbackServerContext* context,
    const v1::GetServerStatsRequest* /*request*/, v1::ServerStats* response) {
  response->set_sessions(sessions_->session_count());
  response->set_buffer_bytes(sessions_->accounting().bytes.load());
  response->set_buffers(sessions_->accounting().buffers.load());
  if (data_listener_ != nullptr) {
    response->set_data_port(data_listener_->port());
    response->set_data_address(data_listener_->advertise());
  }
  response->set_data_path_transfers(data_path_count_.transfers.load());
  response->set_data_path_bytes(data_path_count_.bytes.load());
  response->set_grpc_transfers(grpc_count_.transfers.load());
  response->set_grpc_transfer_bytes(grpc_count_.bytes.load());
  response->set_draining(draining_.load(std::memory_order_relaxed));
  const std::vector<uint64_t> sessions = sessions_->SessionsPerDevice();
  for (uint32_t i = 0; i < sessions_->device_count(); ++i) {
    const Device* device = sessions_->device(i);
    const MemoryAccounting& account = sessions_->device_accounting(i);
    v1::DeviceStats* stats = response->add_devices();
    stats->set_device(i);
    stats->set_sessions(sessions[i]);
    stats->set_buffers(account.buffers.load());
    stats->set_buffer_bytes(account.bytes.load());
    stats->set_capacity_bytes(device->Describe().memory_bytes);
    stats->set_free_bytes(device->FreeBytes());
  }
  return Reply(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RuntimeService::CreateStream(
    grpc::CallbackServerContext* context,
    const v1::CreateStreamRequest* request,
    v1::CreateStreamResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  absl::StatusOr<uint64_t> stream = session->CreateStream();
  if (stream.ok()) response->set_stream(*stream);
  return Reply(context, stream.status());
}

grpc::ServerUnaryReactor* RuntimeService::DestroyStream(
    grpc::CallbackServerContext* context,
    const v1::DestroyStreamRequest* request,
    v1::DestroyStreamResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(std::shared_ptr<Stream> stream,
                   session->TakeStream(request->stream()), ReplyTo(context));
  // Queued work is dropped (a client cannot make teardown wait for it); the
  // call returns once the running launch, if any, has finished and the
  // stream's thread has ended: then the stream no longer counts toward
  // --max_streams_per_session, so a CreateStream sent after this reply
  // cannot be refused for it (the client library's split transfers destroy
  // their streams and create others right after).
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<Stream> doomed = stream;
  stream->Cancel();
  stream->WhenStopped([reactor] { reactor->Finish(grpc::Status::OK); });
  sessions_->DestroyLater(std::move(doomed));
  return reactor;
}

grpc::ServerUnaryReactor* RuntimeService::SynchronizeStream(
    grpc::CallbackServerContext* context,
    const v1::SynchronizeStreamRequest* request,
    v1::SynchronizeStreamResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  ASSIGN_OR_RETURN(Session::StreamSlot held,
                   session->TakeStreamSynchronizeSlot(request->stream()),
                   ReplyTo(context));
  // A call abandoned while the stream is held (a stalled transfer, a long
  // queue) is taken off the queue at once.
  return StartSynchronize(
      context, std::move(held.slot),
      [stream = std::move(held.stream)](
          SynchronizeAnswer answer) -> absl::StatusOr<std::function<void()>> {
        const uint64_t ticket = stream->SynchronizeOrForget(std::move(answer));
        if (ticket == 0) return std::function<void()>();
        return std::function<void()>(
            [weak = std::weak_ptr<Stream>(stream), ticket] {
              if (std::shared_ptr<Stream> live = weak.lock()) {
                live->Forget(ticket);
              }
            });
      });
}

grpc::ServerUnaryReactor* RuntimeService::Malloc(
    grpc::CallbackServerContext* context, const v1::MallocRequest* request,
    v1::MallocResponse* response) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  // Clearing another owner's bytes or populating fresh pages costs about
  // 50 ms per 256 MiB: large buffers are made on a worker, in the session's
  // turn.
  constexpr uint64_t kInlineMallocBytes = 1 << 20;
  if (workers_ == nullptr || request->size() < kInlineMallocBytes) {
    absl::StatusOr<uint64_t> buffer = session->Malloc(request->size());
    if (buffer.ok()) response->set_buffer(*buffer);
    return Reply(context, buffer.status());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string owner = session->work_owner();
  absl::Status queued = workers_->Submit(
      owner, [reactor, context, response, size = request->size(),
              session = std::move(session)]() mutable {
        absl::StatusOr<uint64_t> buffer = session->Malloc(size);
        session.reset();
        if (buffer.ok()) response->set_buffer(*buffer);
        reactor->Finish(ToGrpcStatus(buffer.status(), context));
      });
  if (!queued.ok()) reactor->Finish(ToGrpcStatus(queued, context));
  return reactor;
}

grpc::ServerUnaryReactor* RuntimeService::Free(
    grpc::CallbackServerContext* context, const v1::FreeRequest* request,
    v1::FreeResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   SessionOf(context, request->session()), ReplyTo(context));
  return Reply(context, session->Free(request->buffer()));
}

grpc::ServerUnaryReactor* RuntimeService::WriteValues(
    grpc::CallbackServerContext* context, const v1::WriteValuesRequest* request,
    v1::WriteValuesResponse* /*response*/) {
  ASSIGN_OR_RETURN(std::string bytes,
                   EncodeWriteValues(*request, limits_.max_values),
                   ReplyTo(context));
  ASSIGN_OR_RETURN(
      TransferTarget target,
      ResolveTransfer(request->session(), request->buffer(), request->offset(),
                      bytes.size(), request->stream(), "values",
                      Caller(context), SessionRoutingKeyOf(context)),
      ReplyTo(context));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Reached, the stream runs nothing else, so its device stream is ours
  // until the callback returns.
  target.stream->WhenReached([context, reactor, buffer = target.buffer,
                              device_stream = target.stream->device_stream(),
                              offset = request->offset(),
                              bytes = std::move(bytes)] {
    absl::Status copied = NoDeviceStream();
    if (device_stream != nullptr) {
      copied = device_stream->CopyToDevice(
          static_cast<char*>(buffer->data()) + offset, bytes.data(),
          bytes.size());
      if (copied.ok()) copied = device_stream->Synchronize();
    }
    reactor->Finish(ToGrpcStatus(copied, context));
  });
  return reactor;
}

grpc::ServerUnaryReactor* RuntimeService::ReadValues(
    grpc::CallbackServerContext* context, const v1::ReadValuesRequest* request,
    v1::ReadValuesResponse* response) {
  ASSIGN_OR_RETURN(ValuesRead read,
                   CheckReadValues(*request, limits_.max_values),
                   ReplyTo(context));
  const uint64_t bytes = read.bytes;
  ASSIGN_OR_RETURN(
      TransferTarget target,
      ResolveTransfer(request->session(), request->buffer(), request->offset(),
                      bytes, request->stream(), "values", Caller(context),
                      SessionRoutingKeyOf(context)),
      ReplyTo(context));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  target.stream->WhenReached([context, reactor, response,
                              buffer = target.buffer,
                              device_stream = target.stream->device_stream(),
                              offset = request->offset(), bytes,
                              count = request->count(), dtype = read.dtype] {
    std::string host(bytes, '\0');
    absl::Status copied = NoDeviceStream();
    if (device_stream != nullptr) {
      copied = device_stream->CopyFromDevice(
          host.data(), static_cast<const char*>(buffer->data()) + offset,
          bytes);
      if (copied.ok()) copied = device_stream->Synchronize();
    }
    if (!copied.ok()) {
      reactor->Finish(ToGrpcStatus(copied, context));
      return;
    }
    std::vector<double> values =
        DecodeValues(dtype, host.data(), static_cast<int64_t>(count));
    response->mutable_values()->Add(values.begin(), values.end());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace opserver
