// The Pipeline channel's fences (stream, event, query and session fences,
// and the reads a stream fence carries), the room their replies hold, the
// waits a channel that ends forgets, and the session's deferred error.
#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/command_pipeline.h"
#include "runtime/event.h"
#include "runtime/stream.h"

namespace opserver {

bool CommandPipeline::Fence(Session& session, const v1::FenceCommand& fence,
                            const Resume& resume) {
  // What a read fence holds once read, counted from now on (a read over
  // the limit holds nothing: it is refused); a query's answer is one byte.
  const uint64_t read = fence.query() ? 1
                        : fence.event() == 0 && !fence.session() &&
                                fence.read_size() <= kMaxCommandBytes
                            ? fence.read_size()
                            : 0;
  if (!TakeReplyRoom(read, resume)) return false;
  if (fence.query()) {
    QueryFence(session, fence);
  } else if (fence.event() != 0) {
    EventFence(session, fence.id(), fence.event());
  } else if (!fence.session()) {
    StreamFence(session, fence);
  } else {
    SessionFence(session, fence.id());
  }
  return true;
}

bool CommandPipeline::TakeReplyRoom(uint64_t read, const Resume& resume) {
  absl::MutexLock lock(&mu_);
  if (fences_held_ >= max_fences_ ||
      (read_bytes_held_ > 0 && read_bytes_held_ + read > kMaxHeldBytes)) {
    fence_waiter_ = resume;
    return false;
  }
  ++fences_held_;
  read_bytes_held_ += read;
  return true;
}

void CommandPipeline::EventFence(Session& session, uint64_t id,
                                 uint64_t event_id) {
  absl::StatusOr<std::shared_ptr<Event>> event = session.GetEvent(event_id);
  absl::Status status = event.status();
  if (status.ok()) {
    // Answered by the record's completion or the event's destruction, or
    // forgotten when the channel ends first (ForgetWaits).
    const uint64_t key = AddWait(id, 0);
    absl::StatusOr<uint64_t> ticket = (*event)->WhenCompleteOrForgotten(
        [this, id, key](absl::Status done) {
          DropWait(key);
          fence_done_(id, std::move(done), std::string());
        });
    status = ticket.status();
    if (!ticket.ok()) {
      DropWait(key);
    } else if (*ticket != 0) {
      SetForget(key, [event = *event, ticket = *ticket] {
        return event->Forget(ticket);
      });
    }
  }
  if (!status.ok()) fence_done_(id, std::move(status), std::string());
}

void CommandPipeline::QueryFence(Session& session,
                                 const v1::FenceCommand& fence) {
  absl::StatusOr<std::shared_ptr<Stream>> stream =
      session.GetStream(fence.stream());
  if (!stream.ok()) {
    {
      // Its answer byte was counted as held; an error carries none.
      absl::MutexLock lock(&mu_);
      read_bytes_held_ -= std::min<uint64_t>(read_bytes_held_, 1);
    }
    fence_done_(fence.id(), stream.status(), std::string());
    return;
  }
  fence_done_(fence.id(), absl::OkStatus(),
              std::string(1, (*stream)->busy() ? '\1' : '\0'));
}

void CommandPipeline::StreamFence(Session& session,
                                  const v1::FenceCommand& fence) {
  const uint64_t id = fence.id();
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
  const uint64_t key = AddWait(id, size);
  const uint64_t ticket = (*stream)->SynchronizeOrForget(
      [this, id, key, buffer = *std::move(buffer), stream = *stream,
       offset = fence.read_offset(), size](absl::Status status) {
        DropWait(key);
        FinishRead(id, std::move(status), buffer, stream, offset, size);
      });
  if (ticket != 0) {
    SetForget(key,
              [stream = *stream, ticket] { return stream->Forget(ticket); });
  }
}

void CommandPipeline::SessionFence(Session& session, uint64_t id) {
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
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> found, session.GetBuffer(buffer));
  const uint64_t capacity = found->size();
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
  // Nothing more is written: a batch waiting for write room stops too,
  // and fences stop waiting.
  if (count == SIZE_MAX) {
    writes_->Release(0);
    ForgetWaits();
  }
}

uint64_t CommandPipeline::AddWait(uint64_t id, uint64_t read_size) {
  absl::MutexLock lock(&waits_mu_);
  const uint64_t key = ++next_wait_;
  waits_[key] = Wait{id, read_size, nullptr};
  return key;
}

void CommandPipeline::DropWait(uint64_t key) {
  absl::MutexLock lock(&waits_mu_);
  waits_.erase(key);
}

void CommandPipeline::SetForget(uint64_t key, std::function<bool()> forget) {
  Wait wait;
  {
    absl::MutexLock lock(&waits_mu_);
    auto it = waits_.find(key);
    if (it == waits_.end()) return;  // Answered meanwhile.
    if (!forgetting_) {
      it->second.forget = std::move(forget);
      return;
    }
    // The channel ended while this wait was starting.
    wait = std::move(it->second);
    waits_.erase(it);
  }
  if (forget()) AnswerForgotten(wait.id, wait.read_size);
}

void CommandPipeline::ForgetWaits() {
  std::vector<Wait> waits;
  {
    absl::MutexLock lock(&waits_mu_);
    forgetting_ = true;
    // A wait whose forget is still null is starting: it stays, and
    // SetForget, seeing forgetting_, forgets it.
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (it->second.forget == nullptr) {
        ++it;
        continue;
      }
      waits.push_back(std::move(it->second));
      waits_.erase(it++);
    }
  }
  for (Wait& wait : waits) {
    if (wait.forget()) AnswerForgotten(wait.id, wait.read_size);
  }
}

void CommandPipeline::AnswerForgotten(uint64_t id, uint64_t read_size) {
  FinishRead(id,
             absl::CancelledError("the channel ended before the fence was "
                                  "answered"),
             nullptr, nullptr, 0, read_size);
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
