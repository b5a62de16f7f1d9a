// The remote Session: its lifetime, memory, streams, synchronization and
// values (client.h).

#include "client/client.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client_calls.h"
#include "client/dial_address.h"
#include "common/data_path.h"
#include "common/event_flags.h"
#include "common/listen_address.h"
#include "common/malloc_tuning.h"
#include "common/op_call.h"
#include "common/session_routing.h"
#include "common/status_macros.h"
#include "common/trailers.h"
#include "common/task_position.h"
#include "grpcpp/grpcpp.h"
#include "kernels/aclnn_status.h"
#include "kernels/validate.h"

namespace opserver {
namespace remote {

// ---------------------------------------------------------------- Session

Session::Session(Client* client, std::string token, std::string routing_key)
    : client_(client),
      token_(std::move(token)),
      routing_key_(std::move(routing_key)) {}

void Session::Route(grpc::ClientContext* context) const {
  context->AddMetadata(kSessionRoutingHeader, routing_key_);
}

Session::~Session() { Close().IgnoreError(); }

void Session::StartAttach() {
  attach_context_ = std::make_unique<grpc::ClientContext>();
  client_->Authorize(attach_context_.get());  // No deadline: it lasts.
  Route(attach_context_.get());
  v1::AttachRequest request;
  request.set_session(token_);
  // Read on a background thread until the server ends the call or Close()
  // cancels it; nothing else is ever sent.
  attach_thread_ = std::thread([this, request,
                                reader = client_->runtime().Attach(
                                    attach_context_.get(), request)]() mutable {
    v1::AttachEvent event;
    std::string last;
    while (reader->Read(&event)) last = event.event();
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (!status.ok() && IsConnectionLoss(status, *attach_context_)) {
      // Not the server's doing: it (or the way to it) is gone, and the
      // session with it.
      lost_ = client_->WentAway(
          absl::StrCat(status.error_message(),
                       "; the session and everything in it are lost"));
      return;
    }
    // The server freed the session (this went unnoticed
    // and later calls failed with a bare "no session", or not at all).
    std::string why =
        status.ok() ? "the server ended it" : status.error_message();
    if (!last.empty() && last != "attached") why = last;
    if (why.size() > 256) why.resize(256);  // A hostile server's text.
    lost_ = absl::NotFoundError(absl::StrCat(
        "the session was lost: its Attach call ended (", why,
        "), so the server freed the session and everything in it"));
  });
}

absl::Status Session::Lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

absl::Status Session::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    closed_ = true;
    // An UploadAsync or DownloadAsync still moving is queued work like any
    // other: it ends (or fails) on its own, bounded by the wait deadline.
    mu_.Await(absl::Condition(
        +[](int* copies) { return *copies == 0; }, &background_copies_));
  }
  // Everything queued is delivered, and an error still pending is reported,
  // before the session goes.
  absl::Status deferred = Flush();
  channel_.reset();
  v1::CloseSessionRequest request;
  request.set_session(token_);
  v1::CloseSessionResponse response;
  absl::Status status =
      Unary(*client_, routing_key_, &v1::Runtime::Stub::CloseSession, request,
            &response, "CloseSession");
  if (attach_context_ != nullptr) {
    attach_context_->TryCancel();
    attach_thread_.join();
  }
  return deferred.ok() ? status : deferred;
}

absl::Status Session::Flush() {
  if (channel_ == nullptr) return absl::OkStatus();
  return channel_->Fence(0, /*session=*/true);
}

absl::Status Session::Ordered() {
  if (channel_ == nullptr) return absl::OkStatus();
  return channel_->Drain();
}

absl::StatusOr<Executor> Session::PlanLocally(
    v1::GetWorkspaceSizeRequest request) {
  // Same text as the server's, with the prefix the unary call gets.
  auto fail = [&](const absl::Status& s) {
    return kernels::AclnnError(
        kernels::GetAclnnStatus(s), s.code(),
        absl::StrCat(request.op(), " GetWorkspaceSize: ", s.message()));
  };
  uint64_t id;
  absl::StatusOr<kernels::ValidCall> valid;
  {
    absl::MutexLock lock(&handles_mu_);
    // Buffers are checked by size; the address is a stand-in that nothing
    // dereferences (the views' bounds are all that matter here).
    auto lookup = [&](uint64_t handle) -> absl::StatusOr<DeviceBytes> {
      auto it = buffer_sizes_.find(handle);
      if (it == buffer_sizes_.end()) {
        return UnknownHandle("", "buffer", handle);
      }
      return DeviceBytes{reinterpret_cast<void*>(uintptr_t{1} << 44),
                         it->second};
    };
    absl::StatusOr<kernels::OpCall> call = ToOpCall(request, lookup);
    if (!call.ok()) return fail(call.status());
    valid = kernels::Validate(*call);
    if (!valid.ok()) return fail(valid.status());
    id = next_executor_++;
    v1::PipelineCommand command;
    command.mutable_plan()->set_executor(id);
    request.clear_session();  // The channel's session.
    *command.mutable_plan()->mutable_request() = std::move(request);
    // Queued under the same lock that chose the id: the server accepts ids
    // only in increasing order (so it never has to remember used ones).
    RETURN_IF_ERROR(channel_->Send(std::move(command)));
    executors_[id] = LocalExecutor{valid->workspace_size, false};
  }
  return Executor(this, id, valid->workspace_size);
}

absl::StatusOr<v1::SessionStats> Session::Stats() {
  RETURN_IF_ERROR(Ordered());
  v1::GetSessionStatsRequest request;
  request.set_session(token_);
  v1::SessionStats response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Runtime::Stub::GetSessionStats, request, &response,
                        "GetSessionStats"));
  return response;
}

absl::StatusOr<DeviceBuffer> Session::Malloc(uint64_t size) {
  RETURN_IF_ERROR(Ordered());
  v1::MallocRequest request;
  request.set_session(token_);
  request.set_size(size);
  v1::MallocResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::Malloc,
                        request, &response, "Malloc"));
  if (channel_ != nullptr) {
    absl::MutexLock lock(&handles_mu_);
    buffer_sizes_[response.buffer()] = size;
  }
  return DeviceBuffer(this, response.buffer(), size);
}

absl::Status Session::FreeBuffer(uint64_t buffer) {
  if (channel_ != nullptr) {
    {
      absl::MutexLock lock(&handles_mu_);
      if (buffer_sizes_.erase(buffer) == 0) {
        return UnknownHandle("Free: ", "buffer", buffer);
      }
    }
    v1::PipelineCommand command;
    command.set_free(buffer);
    return channel_->Send(std::move(command));
  }
  v1::FreeRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  v1::FreeResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::Free, request,
               &response, "Free");
}

absl::StatusOr<Stream> Session::CreateStream() {
  RETURN_IF_ERROR(Ordered());
  v1::CreateStreamRequest request;
  request.set_session(token_);
  v1::CreateStreamResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_,
                        &v1::Runtime::Stub::CreateStream, request, &response,
                        "CreateStream"));
  if (channel_ != nullptr) {
    absl::MutexLock lock(&handles_mu_);
    streams_.insert(response.stream());
  }
  return Stream(this, response.stream());
}

absl::Status Session::DestroyStream(uint64_t stream) {
  RETURN_IF_ERROR(Ordered());
  std::optional<uint64_t> probe;
  {
    absl::MutexLock lock(&handles_mu_);
    streams_.erase(stream);
    marks_.erase(stream);
    if (channel_ != nullptr) channel_->ForgetStream(stream);
    if (auto it = probes_.find(stream); it != probes_.end()) {
      probe = it->second;
      probes_.erase(it);
    }
  }
  // Its probe goes with it (an error here is the session's, reported by
  // whoever flushes it).
  if (probe.has_value()) DestroyEvent(*probe).IgnoreError();
  v1::DestroyStreamRequest request;
  request.set_session(token_);
  request.set_stream(stream);
  v1::DestroyStreamResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::DestroyStream,
               request, &response, "DestroyStream", /*wait=*/true);
}

absl::Status Session::Synchronize(uint64_t stream) {
  // Only copies that reported their end ran on it since a synchronize
  // found it idle: no round trip (an idle synchronize still asks).
  if (KnownIdle(stream, /*clean=*/true) && Lost().ok()) {
    absl::MutexLock lock(&handles_mu_);
    auto it = marks_.find(stream);
    if (it != marks_.end() &&
        std::exchange(it->second.copied_since_sync, false)) {
      return absl::OkStatus();
    }
  }
  // Every command sent up to now is ordered before the fence or the unary
  // call below (commands other threads send meanwhile may not be).
  const uint64_t issued = channel_ != nullptr ? channel_->Issued() : 0;
  absl::Status status;
  // With nothing in flight on the channel, the unary call is already in
  // order, and it reports the same deferred error (the server keeps it on
  // the stream); it saves the channel's two thread hand-offs (an idle
  // synchronize: 175 -> ~105 us on loopback).
  if (channel_ != nullptr && !channel_->Idle()) {
    status = channel_->Fence(stream, /*session=*/false);
  } else {
    v1::SynchronizeStreamRequest request;
    request.set_session(token_);
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    status =
        Unary(*client_, routing_key_, &v1::Runtime::Stub::SynchronizeStream,
              request, &response, "SynchronizeStream", /*wait=*/true);
    // The stream's deferred error names the stream, as a fence's does; a
    // failed call (lost, timed out) collected nothing.
    if (kernels::GetAclnnStatus(status) != 0 && TaskPositionOf(status) != 0) {
      status = WithDeferredStream(std::move(status), stream);
    }
  }
  if (status.ok()) NoteIdle(stream, issued, /*clean=*/true);
  return status;
}

void Session::NoteIdle(uint64_t stream, uint64_t issued, bool clean) {
  if (channel_ == nullptr) return;
  absl::MutexLock lock(&handles_mu_);
  if (stream != 0 && !streams_.contains(stream)) return;
  StreamMarks& marks = marks_[stream];
  marks.idle_at = std::max(marks.idle_at.value_or(0), issued);
  if (clean) {
    marks.clean_at = std::max(marks.clean_at.value_or(0), issued);
    marks.copied_since_sync = false;
  }
}

bool Session::KnownIdle(uint64_t stream, bool clean) {
  if (channel_ == nullptr) return false;
  std::optional<uint64_t> idle_after;
  {
    absl::MutexLock lock(&handles_mu_);
    auto it = marks_.find(stream);
    if (it == marks_.end() || it->second.copies_moving > 0) return false;
    idle_after = clean ? it->second.clean_at : it->second.idle_at;
  }
  return idle_after.has_value() && channel_->LastWorkOn(stream) <= *idle_after;
}

void Session::CopyStarted(uint64_t stream) {
  absl::MutexLock lock(&handles_mu_);
  ++marks_[stream].copies_moving;
}

void Session::CopyEnded(uint64_t stream, bool ok) {
  absl::MutexLock lock(&handles_mu_);
  auto it = marks_.find(stream);
  if (it == marks_.end()) return;  // Destroyed meanwhile.
  StreamMarks& marks = it->second;
  --marks.copies_moving;
  marks.copied_since_sync = ok;
  if (!ok) marks.clean_at.reset();
}

absl::Status Session::CheckLocalStream(absl::string_view what,
                                       uint64_t stream) {
  if (channel_ == nullptr || stream == 0) return absl::OkStatus();
  absl::MutexLock lock(&handles_mu_);
  if (!streams_.contains(stream)) {
    return UnknownHandle(absl::StrCat(what, ": "), "stream", stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Session::StreamBusy(uint64_t stream) {
  RETURN_IF_ERROR(CheckLocalStream("StreamQuery", stream));
  if (channel_ != nullptr) {
    if (KnownIdle(stream)) return false;
    const uint64_t issued = channel_->Issued();
    absl::StatusOr<bool> busy = channel_->QueryStream(stream);
    if (busy.ok() && !*busy) NoteIdle(stream, issued);
    return busy;
  }
  // Unpipelined (a debugging mode): a record of the stream's probe event,
  // then its status; two round trips.
  ASSIGN_OR_RETURN(uint64_t probe, Probe(stream));
  RETURN_IF_ERROR(RecordEvent(probe, stream));
  ASSIGN_OR_RETURN(bool complete, QueryEvent(probe));
  return !complete;
}

absl::StatusOr<uint64_t> Session::Probe(uint64_t stream) {
  {
    absl::MutexLock lock(&handles_mu_);
    if (auto it = probes_.find(stream); it != probes_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(uint64_t event, CreateEvent(0));
  absl::MutexLock lock(&handles_mu_);
  // Another thread may have made one meanwhile: either serves, the one
  // kept is destroyed with the stream (the other with the session).
  return probes_.try_emplace(stream, event).first->second;
}

absl::Status Session::WaitStream(uint64_t stream, absl::Duration timeout) {
  RETURN_IF_ERROR(CheckLocalStream("SynchronizeStream", stream));
  ASSIGN_OR_RETURN(uint64_t probe, Probe(stream));
  RETURN_IF_ERROR(RecordEvent(probe, stream));
  return SynchronizeEventFor(probe, timeout);
}

absl::Status Session::SynchronizeEventFor(uint64_t event,
                                          absl::Duration timeout) {
  if (channel_ != nullptr) {
    RETURN_IF_ERROR(CheckLocalEvent("SynchronizeEvent", event, std::nullopt));
    return channel_->FenceEvent(event, timeout);
  }
  // The server drops an abandoned call's wait at once.
  v1::SynchronizeEventRequest request;
  request.set_session(token_);
  request.set_event(event);
  v1::SynchronizeEventResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::SynchronizeEvent,
               request, &response, "SynchronizeEvent", /*wait=*/true, timeout);
}

absl::Status Session::CheckLocalRange(uint64_t buffer, uint64_t offset,
                                      uint64_t size, uint64_t stream) {
  absl::MutexLock lock(&handles_mu_);
  if (stream != 0 && !streams_.contains(stream)) {
    return UnknownHandle("", "stream", stream);
  }
  auto it = buffer_sizes_.find(buffer);
  if (it == buffer_sizes_.end()) {
    return UnknownHandle("", "buffer", buffer);
  }
  if (offset > it->second || size > it->second - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "[", offset, ", ", offset, " + ", size, ") is outside buffer ", buffer,
        " of ", it->second, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status Session::WriteAsync(uint64_t buffer, uint64_t offset,
                                 const void* data, uint64_t size,
                                 uint64_t stream) {
  if (channel_ == nullptr || size > kMaxPipelinedBytes) {
    return Upload(buffer, offset, data, size, stream);
  }
  ASSIGN_OR_RETURN(v1::PipelineCommand command,
                   WriteCommand(buffer, offset, data, size, stream));
  return channel_->Send(std::move(command));
}

absl::StatusOr<PendingRead> Session::ReadAsync(uint64_t buffer, uint64_t offset,
                                               void* data, uint64_t size,
                                               uint64_t stream) {
  if (channel_ == nullptr || size > kMaxPipelinedBytes) {
    // Ordered on its stream by the server; a session-wide fence would also
    // wait for the other streams (another copy lane's transfer, say).
    RETURN_IF_ERROR(Ordered());
    return PendingRead(StreamDownload(buffer, offset, data, size, stream));
  }
  RETURN_IF_ERROR(CheckLocalRange(buffer, offset, size, stream));
  ASSIGN_OR_RETURN(uint64_t id,
                   channel_->SendRead(stream, buffer, offset, size, data));
  return PendingRead(this, id);
}

PendingRead& PendingRead::operator=(PendingRead&& other) noexcept {
  if (this != &other) {
    if (session_ != nullptr && session_->channel_ != nullptr) {
      session_->channel_->ForgetRead(id_);
    }
    session_ = std::exchange(other.session_, nullptr);
    id_ = std::exchange(other.id_, 0);
    done_ = std::move(other.done_);
    background_ = std::move(other.background_);  // Cancels ours, if any.
  }
  return *this;
}

PendingRead::~PendingRead() {
  if (session_ != nullptr && session_->channel_ != nullptr) {
    session_->channel_->ForgetRead(id_);
  }
}

absl::Status PendingRead::Wait() {
  if (background_ != nullptr) {
    absl::Status moved = background_->Wait();
    background_.reset();
    return moved;
  }
  if (session_ == nullptr) return std::exchange(done_, absl::OkStatus());
  Session* session = std::exchange(session_, nullptr);
  if (session->channel_ == nullptr) {
    return absl::FailedPreconditionError(
        "the session was closed before the read was waited for");
  }
  return session->channel_->WaitRead(id_);
}

absl::Status Session::WriteValues(uint64_t buffer, uint64_t offset,
                                  kernels::DType dtype,
                                  const std::vector<double>& values,
                                  uint64_t stream) {
  RETURN_IF_ERROR(Ordered());
  v1::WriteValuesRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_dtype(ToProtoDType(dtype));
  request.set_stream(stream);
  request.mutable_values()->Add(values.begin(), values.end());
  v1::WriteValuesResponse response;
  return Unary(*client_, routing_key_, &v1::Runtime::Stub::WriteValues, request,
               &response, "WriteValues");
}

absl::StatusOr<std::vector<double>> Session::ReadValues(uint64_t buffer,
                                                        uint64_t offset,
                                                        kernels::DType dtype,
                                                        uint64_t count,
                                                        uint64_t stream) {
  // Device->host: after all work issued before, reporting the session's
  // deferred errors.
  RETURN_IF_ERROR(Flush());
  v1::ReadValuesRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_dtype(ToProtoDType(dtype));
  request.set_count(count);
  request.set_stream(stream);
  v1::ReadValuesResponse response;
  RETURN_IF_ERROR(Unary(*client_, routing_key_, &v1::Runtime::Stub::ReadValues,
                        request, &response, "ReadValues"));
  // Callers index the values by what they asked for: a server's other
  // count would have them read past the end, or see too few.
  if (static_cast<uint64_t>(response.values_size()) != count) {
    return absl::InternalError(absl::StrCat("ReadValues: the server sent ",
                                            response.values_size(),
                                            " values for a read of ", count));
  }
  return std::vector<double>(response.values().begin(),
                             response.values().end());
}

}  // namespace remote
}  // namespace opserver
