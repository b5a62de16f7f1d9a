#include "server/pipeline.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"
#include "server/event.h"
#include "server/launch.h"
#include "server/log.h"
#include "server/memory_ops.h"
#include "server/metrics.h"
#include "server/stream.h"

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

CommandPipeline::CommandPipeline(const SessionLimits& limits, size_t max_fences,
                                 FenceDone fence_done, Metrics* metrics)
    : limits_(limits),
      max_fences_(std::max<size_t>(1, max_fences)),
      fence_done_([done = std::move(fence_done), metrics](
                      uint64_t id, absl::Status status, std::string data) {
        if (!status.ok() && metrics != nullptr) metrics->DeferredError();
        done(id, std::move(status), std::move(data));
      }),
      metrics_(metrics) {}

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
  if (metrics_ != nullptr) metrics_->PipelineCommand(command.command_case());
  switch (command.command_case()) {
    case v1::PipelineCommand::kPlan:
      Plan(session, command.plan());
      return true;
    case v1::PipelineCommand::kLaunch: {
      // A fast client waits for a full stream rather than losing launches
      // to its limit: the launch is retried once the stream has run what it
      // holds.
      absl::StatusOr<std::shared_ptr<Stream>> stream =
          session.GetStream(command.launch().stream());
      if (stream.ok() && (*stream)->CheckRoom().code() ==
                             absl::StatusCode::kResourceExhausted) {
        (*stream)->WhenReached(resume);
        return false;
      }
      Launch(session, command.launch());
      return true;
    }
    case v1::PipelineCommand::kDestroyExecutor: {
      const uint64_t id = command.destroy_executor();
      if (std::optional<absl::Status> refused = session.TakeRefusedPlan(id)) {
        // A refused plan not reported yet (by a launch or a session fence)
        // is reported now, once.
        if (!refused->ok()) FailSession(*std::move(refused));
        return true;
      }
      if (absl::Status s = session.DestroyExecutor(id); !s.ok()) {
        FailSessionLazily(
            [&] { return Deferred(s, absl::StrCat("DestroyExecutor ", id)); });
      }
      return true;
    }
    case v1::PipelineCommand::kSetExecutorRepeatable: {
      const uint64_t id = command.set_executor_repeatable();
      // Its launches report the plan's error.
      if (session.RefusedPlan(id, /*launch=*/false).has_value()) return true;
      if (absl::Status s = session.SetExecutorRepeatable(id); !s.ok()) {
        FailSessionLazily([&] {
          return Deferred(s, absl::StrCat("SetExecutorRepeatable ", id));
        });
      }
      return true;
    }
    case v1::PipelineCommand::kFree:
      if (absl::Status s = session.Free(command.free()); !s.ok()) {
        FailSessionLazily(
            [&] { return Deferred(s, absl::StrCat("Free ", command.free())); });
      }
      return true;
    case v1::PipelineCommand::kFence: {
      const v1::FenceCommand& fence = command.fence();
      // What a read fence holds once read, counted from now on (a read
      // over the limit holds nothing: it is refused).
      // A query's answer is one byte.
      const uint64_t read = fence.query() ? 1
                            : fence.event() == 0 && !fence.session() &&
                                    fence.read_size() <= kMaxCommandBytes
                                ? fence.read_size()
                                : 0;
      absl::MutexLock lock(&mu_);
      if (fences_held_ >= max_fences_ ||
          (read_bytes_held_ > 0 && read_bytes_held_ + read > kMaxHeldBytes)) {
        fence_waiter_ = resume;
        return false;
      }
      ++fences_held_;
      read_bytes_held_ += read;
    }
      Fence(session, command.fence());
      return true;
    case v1::PipelineCommand::kWrite: {
      // Like a launch, a write waits for room on its stream, and for the
      // channel's queued writes to shrink below kMaxHeldBytes.
      absl::StatusOr<std::shared_ptr<Stream>> stream =
          session.GetStream(command.write().stream());
      if (stream.ok() && (*stream)->CheckRoom().code() ==
                             absl::StatusCode::kResourceExhausted) {
        (*stream)->WhenReached(resume);
        return false;
      }
      {
        absl::MutexLock lock(&writes_->mu);
        if (writes_->held > 0 &&
            writes_->held + command.write().data().size() > kMaxHeldBytes) {
          writes_->waiter = resume;
          return false;
        }
      }
      Write(session, command.write());
      return true;
    }
    case v1::PipelineCommand::kCreateEvent: {
      const v1::CreateEventCommand& create = command.create_event();
      if (absl::Status s =
              session.CreateEventAs(create.event(), create.flags());
          !s.ok()) {
        FailSessionLazily([&] {
          return Deferred(s, absl::StrCat("CreateEvent ", create.event()));
        });
      }
      return true;
    }
    case v1::PipelineCommand::kRecordEvent:
      OnEvent(
          session, command.record_event().event(),
          command.record_event().stream(), "RecordEvent",
          [](Event& event, Stream& stream) { return event.Record(stream); });
      return true;
    case v1::PipelineCommand::kWaitEvent:
      OnEvent(session, command.wait_event().event(),
              command.wait_event().stream(), "StreamWaitEvent",
              [](Event& event, Stream& stream) { return event.Wait(stream); });
      return true;
    case v1::PipelineCommand::kResetEvent:
      OnEvent(session, command.reset_event().event(),
              command.reset_event().stream(), "ResetEvent",
              [](Event& event, Stream& stream) { return event.Reset(stream); });
      return true;
    case v1::PipelineCommand::kDestroyEvent: {
      const uint64_t id = command.destroy_event();
      if (absl::Status s = session.DestroyEvent(id); !s.ok()) {
        FailSessionLazily(
            [&] { return Deferred(s, absl::StrCat("DestroyEvent ", id)); });
      }
      return true;
    }
    case v1::PipelineCommand::kMemset:
    case v1::PipelineCommand::kCopy: {
      const bool memset =
          command.command_case() == v1::PipelineCommand::kMemset;
      // Like a launch, it waits for room on a full stream.
      absl::StatusOr<std::shared_ptr<Stream>> stream = session.GetStream(
          memset ? command.memset().stream() : command.copy().stream());
      if (stream.ok() && (*stream)->CheckRoom().code() ==
                             absl::StatusCode::kResourceExhausted) {
        (*stream)->WhenReached(resume);
        return false;
      }
      const absl::string_view what = memset ? "Memset" : "CopyDeviceToDevice";
      if (!stream.ok()) {
        FailSessionLazily([&] { return Deferred(stream.status(), what); });
        return true;
      }
      absl::Status s = memset ? QueueMemset(session, **stream, command.memset())
                              : QueueCopy(session, **stream, command.copy());
      if (!s.ok()) (*stream)->Fail(Deferred(s, what));
      return true;
    }
    case v1::PipelineCommand::COMMAND_NOT_SET:
      break;
  }
  FailSession(absl::InvalidArgumentError(
      "an empty or unknown Pipeline command (this server knows plan, "
      "launch, destroy_executor, set_executor_repeatable, free, fence, "
      "write, create_event, record_event, wait_event, reset_event, "
      "destroy_event, memset and copy)"));
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

void CommandPipeline::Plan(Session& session, const v1::PlanCommand& plan) {
  absl::StatusOr<std::shared_ptr<Executor>> executor =
      PlanExecutor(plan.request(), session, limits_.max_launch_elements);
  absl::Status status =
      executor.ok()
          ? session.AddExecutorAs(plan.executor(), *std::move(executor))
          : executor.status();
  if (status.ok()) return;
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
    return;
  }
  // Past the handle limit the refusal is the session's error at once, and
  // its launches fail as launches of an unknown executor.
  if (absl::Status kept = session.AddRefusedPlan(plan.executor(), status);
      !kept.ok()) {
    FailSession(std::move(status));
  }
}

void CommandPipeline::Launch(Session& session,
                             const v1::ExecuteRequest& launch) {
  absl::Status status;
  if (std::optional<absl::Status> refused =
          session.RefusedPlan(launch.executor(), /*launch=*/true)) {
    status = *std::move(refused);
  }
  if (status.ok()) {
    status = LaunchExecutor(launch, session);
    if (status.ok()) return;
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
}

void CommandPipeline::Fence(Session& session, const v1::FenceCommand& fence) {
  const uint64_t id = fence.id();
  if (fence.event() != 0) {
    absl::StatusOr<std::shared_ptr<Event>> event =
        session.GetEvent(fence.event());
    absl::Status status = event.status();
    if (status.ok()) {
      // Answered by the record's completion or the event's destruction,
      // both of which come (a stream always reaches its records, even
      // cancelled), so the channel never waits for it forever.
      status = (*event)->WhenComplete([this, id](absl::Status done) {
        fence_done_(id, std::move(done), std::string());
      });
    }
    if (!status.ok()) fence_done_(id, std::move(status), std::string());
    return;
  }
  if (fence.query()) {
    absl::StatusOr<std::shared_ptr<Stream>> stream =
        session.GetStream(fence.stream());
    if (!stream.ok()) {
      {
        // Its answer byte was counted as held; an error carries none.
        absl::MutexLock lock(&mu_);
        read_bytes_held_ -= std::min<uint64_t>(read_bytes_held_, 1);
      }
      fence_done_(id, stream.status(), std::string());
      return;
    }
    fence_done_(id, absl::OkStatus(),
                std::string(1, (*stream)->busy() ? '\1' : '\0'));
    return;
  }
  if (!fence.session()) {
    const uint64_t size = fence.read_size();
    absl::StatusOr<std::shared_ptr<Stream>> stream =
        session.GetStream(fence.stream());
    absl::StatusOr<std::shared_ptr<Buffer>> buffer = std::shared_ptr<Buffer>();
    if (stream.ok() && size > 0) {
      buffer = CheckRange(session, fence.read_buffer(), fence.read_offset(),
                          size, "read");
    }
    if (!stream.ok() || !buffer.ok()) {
      FinishRead(id, !stream.ok() ? stream.status() : buffer.status(), nullptr,
                 nullptr, 0, size);
      return;
    }
    (*stream)->Synchronize([this, id, buffer = *std::move(buffer),
                            stream = *stream, offset = fence.read_offset(),
                            size](absl::Status status) {
      FinishRead(id, std::move(status), buffer, stream, offset, size);
    });
    return;
  }
  // Refused plans nobody launched are reported by the next session fence.
  if (absl::Status refused = session.TakeUnreportedRefusal(); !refused.ok()) {
    FailSession(std::move(refused));
  }
  std::vector<std::shared_ptr<Stream>> streams = session.AllStreams();
  auto remaining = std::make_shared<std::atomic<size_t>>(streams.size());
  for (const std::shared_ptr<Stream>& stream : streams) {
    stream->WhenReached([this, id, remaining] {
      if (remaining->fetch_sub(1) == 1) {
        fence_done_(id, TakeSessionError(), std::string());
      }
    });
  }
}

absl::StatusOr<std::shared_ptr<Buffer>> CommandPipeline::CheckRange(
    Session& session, uint64_t buffer, uint64_t offset, uint64_t size,
    absl::string_view what) {
  if (size > kMaxCommandBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pipelined ", what, " of ", size, " bytes is over the limit of ",
        kMaxCommandBytes, ": use ", what == "read" ? "Download" : "Upload"));
  }
  absl::StatusOr<std::shared_ptr<Buffer>> found = session.GetBuffer(buffer);
  if (!found.ok()) return found.status();
  const uint64_t capacity = (*found)->size();
  if (offset > capacity || size > capacity - offset) {
    return absl::OutOfRangeError(absl::StrCat(
        what, " of [", offset, ", ", offset, " + ", size,
        ") is outside buffer ", buffer, " of ", capacity, " bytes"));
  }
  return found;
}

void CommandPipeline::FinishRead(uint64_t id, absl::Status status,
                                 const std::shared_ptr<Buffer>& buffer,
                                 const std::shared_ptr<Stream>& stream,
                                 uint64_t offset, uint64_t size) {
  std::string data;
  if (status.ok() && size > 0) {
    // The stream reached the fence and runs nothing else meanwhile: its
    // device stream is free for the copy.
    const std::shared_ptr<DeviceStream>& device = stream->device_stream();
    if (device == nullptr) {
      status = absl::FailedPreconditionError("the stream has no device");
    } else {
      data.resize(size);
      status = device->CopyFromDevice(
          data.data(), static_cast<const char*>(buffer->data()) + offset, size);
      if (status.ok()) status = device->Synchronize();
    }
    if (!status.ok()) data.clear();
  }
  const uint64_t unused = size <= kMaxCommandBytes ? size - data.size() : 0;
  if (unused > 0) {
    absl::MutexLock lock(&mu_);
    read_bytes_held_ -= std::min(read_bytes_held_, unused);
  }
  fence_done_(id, std::move(status), std::move(data));
}

void CommandPipeline::Write(Session& session, const v1::WriteCommand& write) {
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

void CommandPipeline::FencesWritten(size_t count, uint64_t data_bytes) {
  Resume waiter;
  {
    absl::MutexLock lock(&mu_);
    fences_held_ -= std::min(fences_held_, count);
    read_bytes_held_ -= std::min(read_bytes_held_, data_bytes);
    if (count == SIZE_MAX) read_bytes_held_ = 0;
    if (fences_held_ < max_fences_) {
      waiter = std::move(fence_waiter_);
      fence_waiter_ = nullptr;
    }
  }
  if (waiter) waiter();
  // Nothing more is written: a batch waiting for write room stops too.
  if (count == SIZE_MAX) writes_->Release(0);
}

void CommandPipeline::FailSession(absl::Status error) {
  absl::MutexLock lock(&mu_);
  if (session_error_.ok()) session_error_ = std::move(error);
}

absl::Status CommandPipeline::TakeSessionError() {
  absl::MutexLock lock(&mu_);
  return std::exchange(session_error_, absl::OkStatus());
}

}  // namespace opserver
