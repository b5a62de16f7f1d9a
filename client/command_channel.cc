#include "client/command_channel.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/session_routing.h"
#include "common/status_macros.h"
#include "common/task_position.h"
#include "kernels/aclnn_status.h"

namespace opserver {
namespace remote {
namespace {

// A fence's verdict as the unary call (SynchronizeStream) would have
// returned it.
absl::Status FenceStatus(const v1::FenceResult& result,
                         absl::string_view prefix) {
  if (result.code() == 0) return absl::OkStatus();
  // PipelineReplies checked the code and shortened the message.
  const auto code = static_cast<absl::StatusCode>(result.code());
  const std::string message = absl::StrCat(prefix, result.message());
  const int32_t aclnn = result.aclnn_status() != 0
                            ? result.aclnn_status()
                            : kernels::GetAclnnStatus(absl::Status(code, ""));
  return kernels::AclnnError(aclnn, code, message);
}

// The same for a fence that collects `stream`'s deferred error: a task's
// failure names the stream and the task's position (any number the server
// sends is only reported back, never used).
absl::Status StreamFenceStatus(const v1::FenceResult& result,
                               absl::string_view prefix, uint64_t stream) {
  absl::Status status = FenceStatus(result, prefix);
  if (status.ok() || result.task() == 0) return status;
  return WithTaskPosition(WithDeferredStream(std::move(status), stream),
                          result.task());
}

// The stream `command` queues work on, if it does.
std::optional<uint64_t> WorkStream(const v1::PipelineCommand& command) {
  switch (command.command_case()) {
    case v1::PipelineCommand::kLaunch:
      return command.launch().stream();
    case v1::PipelineCommand::kWrite:
      return command.write().stream();
    case v1::PipelineCommand::kFence:
      // A read waits on the stream and then reads; other fences only wait
      // or ask, and are answered once what they wait for is done.
      if (command.fence().read_size() > 0) return command.fence().stream();
      return std::nullopt;
    case v1::PipelineCommand::kRecordEvent:
      return command.record_event().stream();
    case v1::PipelineCommand::kWaitEvent:
      return command.wait_event().stream();
    case v1::PipelineCommand::kResetEvent:
      return command.reset_event().stream();
    case v1::PipelineCommand::kMemset:
      return command.memset().stream();
    case v1::PipelineCommand::kCopy:
      return command.copy().stream();
    case v1::PipelineCommand::kReplayGraph:
      return command.replay_graph().stream();
    case v1::PipelineCommand::kCallback:
      // The stream is not idle until the server has reached it (and, for
      // a blocking one, until the client released it).
      return command.callback().stream();
    default:
      return std::nullopt;
  }
}

}  // namespace

CommandChannel::CommandChannel(Client& client, ChannelWindow window)
    : client_(client), window_(window) {}

absl::StatusOr<std::unique_ptr<CommandChannel>> CommandChannel::Open(
    Client& client, const std::string& session, const std::string& routing_key,
    ChannelWindow window) {
  window.commands = std::max<uint64_t>(window.commands, 1);
  window.batch_bytes = std::max<uint64_t>(window.batch_bytes, 1);
  std::unique_ptr<CommandChannel> channel(new CommandChannel(client, window));
  client.Authorize(&channel->context_);  // No deadline: the call lasts.
  if (!routing_key.empty()) {
    channel->context_.AddMetadata(kSessionRoutingHeader, routing_key);
  }
  channel->stream_ = client.operators().Pipeline(&channel->context_);
  v1::PipelineRequest open;
  open.set_session(session);
  // A failed write shows as the call's status, read below.
  channel->stream_->Write(open);
  channel->reader_ = std::thread(&CommandChannel::ReadLoop, channel.get());
  absl::Status status;
  {
    absl::MutexLock lock(&channel->mu_);
    CommandChannel* c = channel.get();
    status = c->WaitLocked(
        [c]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return c->opened_; },
        client.options().call_timeout,
        "Pipeline: the server accepting the channel");
  }
  if (!status.ok()) {
    // The destructor cancels the call and joins the reader.
    return status;
  }
  channel->writer_ = std::thread(&CommandChannel::WriteLoop, channel.get());
  return channel;
}

CommandChannel::~CommandChannel() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  context_.TryCancel();
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
}

absl::Status CommandChannel::WaitLocked(absl::FunctionRef<bool()> ready,
                                        absl::Duration timeout,
                                        absl::string_view what) {
  struct Args {
    absl::FunctionRef<bool()> ready;
    CommandChannel* channel;
  } args{ready, this};
  const bool done =
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                 return !a->channel->broken_.ok() || a->ready();
                               },
                               &args),
                           timeout);
  if (!broken_.ok()) return broken_;
  if (!done) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": Deadline Exceeded (waited ",
                     absl::FormatDuration(timeout), ")"));
  }
  return absl::OkStatus();
}

absl::Status CommandChannel::Send(v1::PipelineCommand command) {
  return SendAll(absl::MakeSpan(&command, 1));
}

absl::Status CommandChannel::SendAll(absl::Span<v1::PipelineCommand> commands) {
  std::vector<uint64_t> sizes;
  sizes.reserve(commands.size());
  uint64_t bytes = 0;
  for (const v1::PipelineCommand& command : commands) {
    sizes.push_back(command.ByteSizeLong());
    bytes += sizes.back();
  }
  const uint64_t count = commands.size();
  // More commands than the window holds wait for it to be empty.
  const uint64_t window = std::max<uint64_t>(window_.commands, count);
  absl::MutexLock lock(&mu_);
  absl::Status room = WaitLocked(
      [this, bytes, count, window]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return issued_ - replies_.acknowledged() + count <= window &&
               (unacked_bytes_ == 0 || unacked_bytes_ + bytes <= window_.bytes);
      },
      client_.options().wait_timeout, "Pipeline: room in the command window");
  if (!room.ok()) return room;
  for (size_t i = 0; i < commands.size(); ++i) {
    const std::optional<uint64_t> work = WorkStream(commands[i]);
    queue_.push_back(std::move(commands[i]));
    ++issued_;
    if (work.has_value()) last_work_[*work] = issued_;
    unacked_.emplace_back(issued_, sizes[i]);
    unacked_bytes_ += sizes[i];
  }
  return absl::OkStatus();
}

absl::Status CommandChannel::Drain() {
  absl::MutexLock lock(&mu_);
  if (issued_ == replies_.acknowledged()) return broken_;
  const uint64_t target = issued_;
  return WaitLocked(
      [this, target]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return replies_.acknowledged() >= target;
      },
      client_.options().wait_timeout,
      "Pipeline: the server applying the queued commands");
}

bool CommandChannel::Idle() {
  absl::MutexLock lock(&mu_);
  return broken_.ok() && issued_ == replies_.acknowledged();
}

absl::StatusOr<uint64_t> CommandChannel::SendFence(
    v1::PipelineCommand command, const ReadTarget* read, uint64_t answer_bytes,
    v1::PipelineCommand* before) {
  uint64_t id;
  {
    // Awaited before it is queued: its result may come as soon as it is
    // written, and a result for a fence not awaited ends the channel.
    absl::MutexLock lock(&mu_);
    id = next_fence_++;
    replies_.Await(id, read != nullptr ? read->size : answer_bytes);
    if (read != nullptr) reads_[id] = *read;
  }
  command.mutable_fence()->set_id(id);
  absl::Status sent;
  if (before != nullptr) {
    v1::PipelineCommand both[] = {std::move(*before), std::move(command)};
    sent = SendAll(absl::MakeSpan(both));
  } else {
    sent = Send(std::move(command));
  }
  if (absl::Status s = std::move(sent); !s.ok()) {
    absl::MutexLock lock(&mu_);
    reads_.erase(id);
    replies_.Withdraw(id);  // Never sent, so never answered.
    return s;
  }
  return id;
}

absl::StatusOr<uint64_t> CommandChannel::SendCallback(uint64_t stream,
                                                      bool block,
                                                      CallbackReached reached) {
  uint64_t id;
  {
    // Registered before it is queued: its notice may come as soon as it is
    // written. A broken channel calls no callback any more.
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    id = next_callback_++;
    replies_.AwaitCallback(id);
    callbacks_[id] = std::move(reached);
  }
  v1::PipelineCommand command;
  command.mutable_callback()->set_id(id);
  command.mutable_callback()->set_stream(stream);
  command.mutable_callback()->set_block(block);
  if (absl::Status s = Send(std::move(command)); !s.ok()) {
    absl::MutexLock lock(&mu_);
    replies_.WithdrawCallback(id);
    // Told already (the channel ended meanwhile): its error reached the
    // callback's runner, so the launch itself went through.
    if (callbacks_.erase(id) == 0) return id;
    return s;
  }
  return id;
}

absl::Status CommandChannel::ReleaseCallback(uint64_t id) {
  v1::PipelineCommand command;
  command.set_release_callback(id);
  return Send(std::move(command));
}

void CommandChannel::EndCallbacks() {
  absl::flat_hash_map<uint64_t, CallbackReached> ended;
  absl::Status why;
  {
    absl::MutexLock lock(&mu_);
    ended.swap(callbacks_);
    why = broken_.ok() ? absl::CancelledError("the channel ended") : broken_;
  }
  std::vector<uint64_t> ids;
  for (const auto& entry : ended) ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());  // In the order they were sent.
  for (uint64_t id : ids) {
    ended[id](id, absl::Status(why.code(),
                               absl::StrCat("callback ", id,
                                            " will not run: ", why.message())));
  }
}

absl::StatusOr<v1::FenceResult> CommandChannel::TakeFence(
    uint64_t id, absl::string_view what,
    std::optional<absl::Duration> timeout) {
  absl::MutexLock lock(&mu_);
  absl::Status waited = WaitLocked(
      [this, id]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return replies_.Has(id); },
      timeout.value_or(client_.options().wait_timeout), what);
  std::optional<v1::FenceResult> result = replies_.Take(id);
  if (!result.has_value()) {
    // Given up on (the wait timed out, or the channel broke): its result
    // is dropped when it comes, not held for nobody.
    replies_.Forget(id);
    return waited;
  }
  return *std::move(result);
}

absl::Status CommandChannel::Fence(uint64_t stream, bool session) {
  v1::PipelineCommand command;
  command.mutable_fence()->set_stream(stream);
  command.mutable_fence()->set_session(session);
  ASSIGN_OR_RETURN(uint64_t id, SendFence(std::move(command)));
  ASSIGN_OR_RETURN(v1::FenceResult result,
                   TakeFence(id, session ? "waiting for the session's work"
                                         : "SynchronizeStream"));
  if (session) return FenceStatus(result, "deferred error of the session: ");
  return StreamFenceStatus(result, "SynchronizeStream: ", stream);
}

absl::Status CommandChannel::SendThenFence(v1::PipelineCommand command,
                                           uint64_t stream) {
  v1::PipelineCommand fence;
  fence.mutable_fence()->set_stream(stream);
  ASSIGN_OR_RETURN(uint64_t id,
                   SendFence(std::move(fence), nullptr, 0, &command));
  ASSIGN_OR_RETURN(v1::FenceResult result, TakeFence(id, "SynchronizeStream"));
  return StreamFenceStatus(result, "SynchronizeStream: ", stream);
}

absl::Status CommandChannel::FenceEvent(uint64_t event) {
  return FenceEvent(event, client_.options().wait_timeout);
}

absl::Status CommandChannel::FenceEvent(uint64_t event,
                                        absl::Duration timeout) {
  v1::PipelineCommand command;
  command.mutable_fence()->set_event(event);
  ASSIGN_OR_RETURN(uint64_t id, SendFence(std::move(command)));
  ASSIGN_OR_RETURN(v1::FenceResult result,
                   TakeFence(id, "SynchronizeEvent", timeout));
  return FenceStatus(result, "SynchronizeEvent: ");
}

absl::StatusOr<bool> CommandChannel::QueryStream(uint64_t stream) {
  v1::PipelineCommand command;
  command.mutable_fence()->set_stream(stream);
  command.mutable_fence()->set_query(true);
  ASSIGN_OR_RETURN(uint64_t id,
                   SendFence(std::move(command), nullptr, /*answer_bytes=*/1));
  ASSIGN_OR_RETURN(v1::FenceResult result, TakeFence(id, "StreamQuery"));
  RETURN_IF_ERROR(FenceStatus(result, "StreamQuery: "));
  // PipelineReplies took only a result of exactly one byte.
  const char busy = result.data()[0];
  if (busy != 0 && busy != 1) {
    return absl::InternalError(absl::StrCat("StreamQuery: the server answered ",
                                            static_cast<int>(busy),
                                            ", neither 0 (idle) nor 1 (busy)"));
  }
  return busy == 1;
}

uint64_t CommandChannel::Issued() {
  absl::MutexLock lock(&mu_);
  return issued_;
}

uint64_t CommandChannel::LastWorkOn(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  auto it = last_work_.find(stream);
  return it != last_work_.end() ? it->second : 0;
}

void CommandChannel::ForgetStream(uint64_t stream) {
  absl::MutexLock lock(&mu_);
  last_work_.erase(stream);
}

absl::StatusOr<uint64_t> CommandChannel::SendRead(uint64_t stream,
                                                  uint64_t buffer,
                                                  uint64_t offset,
                                                  uint64_t size, void* data) {
  v1::PipelineCommand command;
  v1::FenceCommand& fence = *command.mutable_fence();
  fence.set_stream(stream);
  fence.set_read_buffer(buffer);
  fence.set_read_offset(offset);
  fence.set_read_size(size);
  const ReadTarget target{data, size, stream};
  return SendFence(std::move(command), &target);
}

void CommandChannel::ForgetRead(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (reads_.erase(id) == 0) return;
  replies_.Forget(id);
}

size_t CommandChannel::HeldResults() {
  absl::MutexLock lock(&mu_);
  return replies_.stored();
}

absl::Status CommandChannel::WaitRead(uint64_t id) {
  ReadTarget target{nullptr, 0, 0};
  {
    absl::MutexLock lock(&mu_);
    auto it = reads_.find(id);
    if (it == reads_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no pipelined read ", id, " is waiting"));
    }
    target = it->second;
    reads_.erase(it);
  }
  ASSIGN_OR_RETURN(v1::FenceResult result, TakeFence(id, "a pipelined read"));
  RETURN_IF_ERROR(
      StreamFenceStatus(result, "SynchronizeStream: ", target.stream));
  // PipelineReplies took only a result of exactly target.size bytes.
  if (target.size > 0) {
    std::memcpy(target.data, result.data().data(), target.size);
  }
  return absl::OkStatus();
}

void CommandChannel::WriteLoop() {
  for (;;) {
    v1::PipelineRequest request;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CommandChannel* c) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !c->queue_.empty() || c->closing_ || c->read_done_;
          },
          this));
      if (closing_ || read_done_) return;
      // Everything queued goes in one message, up to batch_bytes.
      uint64_t bytes = 0;
      while (!queue_.empty()) {
        const uint64_t size = queue_.front().ByteSizeLong();
        if (request.commands_size() > 0 && bytes + size > window_.batch_bytes) {
          break;
        }
        bytes += size;
        *request.add_commands() = std::move(queue_.front());
        queue_.pop_front();
      }
      // Counted before the write: the server may apply and acknowledge
      // them before Write returns.
      written_ += request.commands_size();
      writing_ = true;
    }
    const bool written = stream_->Write(request);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!written) return;  // The reader reports why.
  }
}

void CommandChannel::ReadLoop() {
  ReadUntilEnd();
  // broken_ says why now: every callback still waiting learns it, so a
  // thread waiting to run one wakes (a lost server, a closed session).
  EndCallbacks();
}

void CommandChannel::ReadUntilEnd() {
  v1::PipelineEvent event;
  while (stream_->Read(&event)) {
    if (!ApplyEvent(event)) break;
  }
  EndCall();
}

bool CommandChannel::ApplyEvent(const v1::PipelineEvent& event) {
  // Callbacks reached, told outside the lock.
  std::vector<std::pair<CallbackReached, v1::CallbackNotice>> reached;
  {
    absl::MutexLock lock(&mu_);
    opened_ = true;
    // A reply the protocol does not allow (an acknowledgement beyond
    // what was written, a result for a fence not awaited or already
    // taken, a notice for no callback) ends the channel: what else such
    // a server says cannot be trusted, and held results stay bounded by
    // the fences awaited.
    if (absl::Status s = replies_.Apply(event, written_); !s.ok()) {
      broken_ = absl::InternalError(
          absl::StrCat("Pipeline: ", s.message(),
                       " (a broken or hostile server); the channel is closed"));
      context_.TryCancel();
      return false;
    }
    while (!unacked_.empty() &&
           unacked_.front().first <= replies_.acknowledged()) {
      unacked_bytes_ -= unacked_.front().second;
      unacked_.pop_front();
    }
    for (v1::CallbackNotice& notice : replies_.TakeNotices()) {
      auto it = callbacks_.find(notice.id());
      if (it == callbacks_.end()) continue;  // Withdrawn meanwhile.
      reached.emplace_back(std::move(it->second), std::move(notice));
      callbacks_.erase(it);
    }
  }
  for (auto& [callback, notice] : reached) {
    absl::Status status;
    if (notice.code() != 0) {
      status = absl::Status(static_cast<absl::StatusCode>(notice.code()),
                            notice.message());
    }
    callback(notice.id(), std::move(status));
  }
  return true;
}

void CommandChannel::EndCall() {
  // The call is over: whatever its end, every waiter learns it. The writer
  // stops at its next Write (the call is done) or at once when closing.
  {
    absl::MutexLock lock(&mu_);
    read_done_ = true;
    // The call is over, so a Write in flight returns promptly (false);
    // Finish must not run beside it.
    mu_.Await(absl::Condition(
        +[](bool* writing) { return !*writing; }, &writing_));
  }
  grpc::Status status = stream_->Finish();
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return;  // The server broke the protocol.
  if (closing_) {
    broken_ = absl::CancelledError("the session was closed");
    return;
  }
  const absl::Status ended =
      status.ok() ? absl::UnavailableError("the server ended the call")
                  : client_.CallStatus(status, context_, "Pipeline");
  if (!opened_) {
    // Never opened (e.g. UNIMPLEMENTED from a server without it): as is.
    broken_ = ended;
    return;
  }
  if (IsConnectionLoss(status, context_)) {
    // Not the server's doing: it (or the way to it) is gone, and the
    // session with it.
    broken_ = client_.WentAway(
        absl::StrCat(status.error_message(),
                     "; the session and everything in it are lost: create "
                     "a new session once it is back"));
    return;
  }
  // The channel's order cannot be recovered (commands may be lost), and a
  // server that ended it freed the session (a restarted server knows
  // none): later calls say so, as they would on any session the server
  // does not know.
  broken_ = absl::NotFoundError(absl::StrCat(
      "no session: its command channel ended (", ended.message(),
      "), so the server freed the session and everything in it; create a "
      "new session"));
}

}  // namespace remote
}  // namespace opserver
