// OpenDataTransfer, the Runtime service's data path: an Upload or Download
// whose bytes go over a connection of their own (common/data_path.h), and
// the same for the Pipeline channel's data_transfer command. Part of the
// runtime_service library, like transfers.cc.

#include <sys/socket.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data_path.h"
#include "common/status_macros.h"
#include "common/thread_start.h"
#include "kernels/aclnn_status.h"
#include "runtime/deadline_timer.h"
#include "server/grpc_status_util.h"
#include "server/runtime_service.h"
#include "server/transfer_call.h"

namespace opserver {

namespace {

// Moves the bytes of a data-path transfer between the socket `fd` and
// device memory [target, target + size), `limits.chunk_bytes` at a time
// straight into or out of memory the host can address, else through the
// device's staging (DeviceStream::StageUpload / StageDownload) in chunks
// of `limits.staging_chunk_bytes`, which may copy one chunk while the
// socket moves the next. Calls `moved` after each socket call that moved
// bytes (the idle clock: a chunk can take a slow client far longer than
// the idle timeout) and `progress` after each chunk. An upload must end
// with the client's half-close right after its last byte, unless the
// connection is to be kept (`keep`): then the server acknowledges the
// last byte with one byte of its own, and a download ends without the
// server's half-close; what follows on the connection is the next ticket.
// `by_connection`, if set, is set when the error came from the connection
// (its client's side: closed, short, reset), not from the device.
absl::Status MoveDataPathBytes(bool upload, bool keep, int fd, Device* device,
                               DeviceStream* stream, char* target,
                               uint64_t size, const TransferLimits& limits,
                               const std::function<void()>& moved,
                               const std::function<void()>& progress,
                               bool* by_connection = nullptr) {
  auto connection_error = [by_connection](absl::Status status) {
    if (by_connection != nullptr) *by_connection = true;
    return status;
  };
  std::unique_ptr<StagedUpload> staged_upload;
  std::unique_ptr<StagedDownload> staged_download;
  uint64_t chunk = limits.chunk_bytes;
  if (size != 0 && device->HostAddress(target) == nullptr) {
    chunk = limits.staging_chunk_bytes;
    if (stream == nullptr) return NoDeviceStream();
    if (upload) {
      staged_upload = stream->StageUpload(target, size, chunk);
    } else {
      staged_download = stream->StageDownload(target, size, chunk);
    }
  }
  for (uint64_t at = 0; at < size;) {
    const uint64_t n = std::min(chunk, size - at);
    char* host;
    if (staged_upload != nullptr) {
      ASSIGN_OR_RETURN(absl::Span<char> staging, staged_upload->Next());
      host = staging.data();
    } else if (staged_download != nullptr) {
      ASSIGN_OR_RETURN(absl::Span<const char> staging, staged_download->Next());
      host = const_cast<char*>(staging.data());
    } else {
      host = static_cast<char*>(device->HostAddress(target + at));
    }
    if (upload) {
      absl::StatusOr<size_t> got = RecvFull(fd, host, n, moved);
      if (staged_upload != nullptr && (!got.ok() || *got < n)) {
        // As on a device the host addresses, what came stays; a copy's
        // error adds nothing to the upload's.
        staged_upload->End(got.value_or(0)).IgnoreError();
      }
      if (!got.ok()) return connection_error(got.status());
      if (*got < n) {
        return connection_error(absl::InvalidArgumentError(absl::StrCat(
            "upload ended after ", at + *got, " of the ", size,
            " bytes it announced (the data connection was closed)")));
      }
      if (staged_upload != nullptr) RETURN_IF_ERROR(staged_upload->Commit(n));
    } else if (absl::Status sent = SendAll(fd, host, n, moved); !sent.ok()) {
      return connection_error(sent);
    }
    at += n;
    progress();
  }
  if (staged_upload != nullptr) RETURN_IF_ERROR(staged_upload->Finish());
  if (upload && keep) {
    // Every byte is in the device: the transfer has succeeded, which a
    // pipelined one's client learns from this alone.
    if (absl::Status sent = SendAll(fd, &kDataUploadAck, 1); !sent.ok()) {
      return connection_error(sent);
    }
  }
  if (keep) return absl::OkStatus();
  if (!upload) {
    shutdown(fd, SHUT_WR);
    return absl::OkStatus();
  }
  char extra;
  ASSIGN_OR_RETURN(size_t more, RecvFull(fd, &extra, 1));
  if (more != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload sent more than the ", size, " bytes it announced"));
  }
  return absl::OkStatus();
}

}  // namespace

// OpenDataTransfer: an Upload or Download whose bytes go over the data
// path (common/data_path.h). The call is ordered on its stream like the
// others; the bytes move once the work queued before it has run and the
// client's connection has arrived, whichever is last, on a thread of their
// own (blocking socket calls straight into or out of the buffer). That
// thread holds the buffer and the stream's gate until it is done, so an
// abort (shutting the socket down to wake it) never frees or reuses memory
// it still touches.
class RuntimeService::DataTransfer final
    : public grpc::ServerWriteReactor<v1::OpenDataTransferResponse>,
      public Transfer {
 public:
  DataTransfer(RuntimeService* service, grpc::CallbackServerContext* context,
               const v1::OpenDataTransferRequest* request)
      : Transfer(service, context), context_(context) {
    Begin([&]() -> absl::StatusOr<std::shared_ptr<Stream>> {
      absl::StatusOr<std::shared_ptr<Stream>> stream = StartLocked(*request);
      if (stream.ok()) {  // The ticket and port go out at once.
        writing_ = true;
        StartWrite(&event_);
      }
      return stream;
    });
  }

  void OnWriteDone(bool ok) override { EndWrite(ok); }

  void WriteDoneLocked(bool ok) override {
    if (done_) {
      FinishLocked(result_);
    } else if (!abort_.ok()) {
      if (!moving_) FinishLocked(abort_);
    } else if (!ok) {
      AbortLocked(absl::CancelledError(
          "data transfer cancelled: the client went away"));
    }
  }

  void GateReachedLocked() override {
    waiting_ = false;
    if (finished_) return;
    last_progress_ = absl::Now();
    // A revoked call ends on its own soon (OnCancel); no bytes move first.
    if (connection_ != nullptr && !binding_.revoked()) StartMovingLocked();
  }

  void AbortLocked(const absl::Status& why) override {
    if (finished_ || done_ || !abort_.ok()) return;
    abort_ = why;
    // Wakes the mover from its blocking socket call; it reports back.
    if (moving_) shutdown(connection_->get(), SHUT_RDWR);
    // OnWriteDone (or the mover's report) ends the call with `why`; a
    // write a client does not read never completes: such a call is
    // cancelled after a grace.
    if (writing_) CancelLaterLocked();
    if (!moving_ && !writing_) FinishLocked(why);
  }

  void OnCancel() override {
    absl::MutexLock lock(&link_->mu);
    AbortLocked(absl::CancelledError(
        "data transfer cancelled (by the client, or the server is shutting "
        "down)"));
  }

  void OnDone() override {
    Unlink();
    delete this;
  }

 private:
  absl::StatusOr<std::shared_ptr<Stream>> StartLocked(
      const v1::OpenDataTransferRequest& request) {
    DataListener* listener = service_->data_listener_;
    if (listener == nullptr) return NoDataPath();
    ASSIGN_OR_RETURN(upload_, IsUpload(request.direction()));
    keep_ = request.keep_connection();
    ASSIGN_OR_RETURN(TransferTarget target,
                     service_->ResolveTransfer(
                         request.session(), request.buffer(), request.offset(),
                         request.size(), request.stream(),
                         upload_ ? "upload range" : "download range",
                         binding_.caller(), SessionRoutingKeyOf(context_)));
    std::shared_ptr<TransferLink> link = link_;
    // Runs on the listener's thread: hands the connection over under the
    // call's lock, or drops it when the call is gone.
    absl::StatusOr<std::string> ticket =
        listener->Expect([link](UniqueFd connection) {
          absl::MutexLock lock(&link->mu);
          if (link->call != nullptr) {
            // Only a DataTransfer expects connections.
            static_cast<DataTransfer*>(link->call)
                ->ConnectedLocked(std::move(connection));
          }
        });
    if (!ticket.ok()) return ticket.status();
    ticket_ = *ticket;
    session_ = target.session;
    buffer_ = target.buffer;
    device_stream_ = target.stream->device_stream();
    target_ = static_cast<char*>(buffer_->data()) + request.offset();
    size_ = request.size();
    event_.set_ticket(ticket_);
    event_.set_port(static_cast<uint32_t>(listener->port()));
    event_.set_address(listener->advertise());
    event_.set_keeps_connection(keep_);
    return target.stream;
  }

  void ConnectedLocked(UniqueFd connection) {
    if (finished_ || done_ || !abort_.ok() || binding_.revoked()) {
      return;  // Closed here.
    }
    connection_ = std::make_shared<UniqueFd>(std::move(connection));
    last_progress_ = absl::Now();
    // Begin set waiting_ under this lock before the ticket could be
    // presented, so it is clear only once the gate was reached.
    if (!waiting_) StartMovingLocked();
  }

  void StartMovingLocked() {
    moving_ = true;
    // Everything the mover touches is its own reference: it may outlive
    // the call object only until it has reported through the link.
    absl::Status started = service_->StartMover(
        [service = service_, link = link_, connection = connection_,
         gate = gate_, buffer = buffer_, session = session_,
         device_stream = device_stream_, upload = upload_, keep = keep_,
         target = target_, size = size_]() mutable {
          absl::Status status = MoveDataPathBytes(
              upload, keep, connection->get(), buffer->device(),
              device_stream.get(), target, size, service->limits_,
              [&] {
                link->moved_ns.store(absl::GetCurrentTimeNanos(),
                                     std::memory_order_relaxed);
              },
              [&] { session->Touch(); });
          // Released before the report: once reported, the call may end,
          // and with it the server's shutdown, which destroys the sessions
          // (a session this mover still held would outlive its manager).
          // The call holds its own references until it ends.
          connection.reset();
          gate.reset();
          buffer.reset();
          session.reset();
          device_stream.reset();
          absl::MutexLock lock(&link->mu);
          if (link->call != nullptr) {
            static_cast<DataTransfer*>(link->call)->MovedLocked(status);
          }
        });
    if (!started.ok()) {
      // Nothing was moved: close the connection now, not when the reply
      // in flight (if any) is written.
      if (connection_ != nullptr) shutdown(connection_->get(), SHUT_RDWR);
      MovedLocked(started);
    }
  }

  void MovedLocked(const absl::Status& status) {
    moving_ = false;
    done_ = true;
    result_ = abort_.ok() ? status : abort_;
    if (result_.ok()) service_->data_path_count_.Add(size_);
    // Kept only after a transfer that ended well: after any other, what
    // is left on the connection is unknown. The mover no longer touches it.
    if (result_.ok() && keep_ && connection_ != nullptr) {
      service_->data_listener_->Keep(UniqueFd(connection_->release()));
    }
    if (!writing_) FinishLocked(result_);
  }

  void FinishLocked(const absl::Status& status) {
    if (finished_) return;
    finished_ = true;
    if (!ticket_.empty()) service_->data_listener_->Forget(ticket_);
    device_stream_.reset();
    ReleaseHoldsLocked();
    connection_.reset();
    Finish(ToGrpcStatus(status, context_));
  }

  grpc::CallbackServerContext* const context_;
  v1::OpenDataTransferResponse event_;
  std::string ticket_;
  bool upload_ = false;
  // The client asked to keep the connection for its next transfer.
  bool keep_ = false;
  char* target_ = nullptr;
  uint64_t size_ = 0;
  std::shared_ptr<DeviceStream> device_stream_;
  // Set once the client's connection arrived; shared with the mover.
  std::shared_ptr<UniqueFd> connection_;
  bool moving_ = false;
  bool done_ = false;
  absl::Status result_;
};

grpc::ServerWriteReactor<v1::OpenDataTransferResponse>*
RuntimeService::OpenDataTransfer(grpc::CallbackServerContext* context,
                                 const v1::OpenDataTransferRequest* request) {
  return new DataTransfer(this, context, request);
}

// A data_transfer command's transfer: OpenDataTransfer's without its call.
// The command has queued it on its stream and the client's ticket is
// expected; the bytes move, on a mover thread of their own, once the
// stream has reached it and the connection has come (it comes at once:
// the client sends the ticket with the command). What ends it: the
// mover's result, the stream's cancellation (its session closed or it was
// destroyed: the socket is shut down to wake the mover), or no connection
// within the idle time-out once the stream waits for it. A failure is the
// stream's deferred error, recorded while the transfer still holds it.
class RuntimeService::PipelinedTransfer
    : public std::enable_shared_from_this<PipelinedTransfer> {
 public:
  PipelinedTransfer(RuntimeService* service, DataTransfers::Request request)
      : service_(service),
        stream_(std::move(request.stream)),
        buffer_(std::move(request.buffer)),
        device_stream_(stream_->device_stream()),
        target_(static_cast<char*>(buffer_->data()) + request.offset),
        size_(request.size),
        upload_(request.upload),
        ticket_(std::move(request.ticket)),
        owner_(request.owner) {}

  absl::Status Start() {
    DataListener* listener = service_->data_listener_;
    std::shared_ptr<PipelinedTransfer> self = shared_from_this();
    {
      // A gate is no task, so --max_queued_per_stream does not bound
      // these: a session holds at most this many at once.
      absl::MutexLock lock(&service_->pipelined_mu_);
      size_t& held = service_->pipelined_per_owner_[owner_];
      if (held >= kMaxPipelinedTransfersPerSession) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "data transfer: the session already has ",
            kMaxPipelinedTransfersPerSession,
            " data_transfer commands in flight; synchronize before sending "
            "more"));
      }
      ++held;
    }
    if (absl::Status expected = listener->ExpectTicket(
            ticket_, [self](UniqueFd fd) { self->Connected(std::move(fd)); });
        !expected.ok()) {
      absl::MutexLock lock(&service_->pipelined_mu_);
      service_->ReleasePipelinedLocked(owner_);
      return expected;
    }
    {
      absl::MutexLock lock(&service_->pipelined_mu_);
      service_->pipelined_[ticket_] = self;
    }
    std::shared_ptr<Stream::Gate> gate = std::make_shared<Stream::Gate>();
    {
      absl::MutexLock lock(&mu_);
      gate_ = gate;
    }
    // Without mu_: an idle stream calls `reached` at once, on this thread.
    absl::Status held = stream_->Hold(
        gate, [self] { self->Reached(); }, [self] { self->Cancelled(); });
    if (!held.ok()) {
      absl::MutexLock lock(&mu_);
      EndLocked(held);
      return held;
    }
    return absl::OkStatus();
  }

  // Ends the transfer with `why`: now, or once its mover, woken by the
  // socket's shutdown, has returned.
  void Abort(const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    if (!moving_) {
      EndLocked(why);
      return;
    }
    abort_ = why;
    shutdown(connection_->get(), SHUT_RDWR);  // The mover ends with `abort_`.
  }

  // cancel_data_transfer from `owner`.
  void CancelByClient(const void* owner) {
    absl::MutexLock lock(&mu_);
    if (ended_ || owner != owner_) return;
    quiet_ = true;
    // A mover ends when the client shuts its connection down, quietly.
    if (!moving_) {
      EndLocked(absl::CancelledError("data transfer cancelled by the client"));
    }
  }

 private:
  void Cancelled() {
    Abort(absl::CancelledError(
        "data transfer ended: its stream was destroyed or its session "
        "closed"));
  }

  void Connected(UniqueFd fd) {
    absl::MutexLock lock(&mu_);
    if (ended_) return;  // Closed here.
    connection_ = std::make_shared<UniqueFd>(std::move(fd));
    if (reached_) StartMovingLocked();
  }

  void Reached() {
    absl::MutexLock lock(&mu_);
    reached_ = true;
    if (ended_) return;
    if (connection_ != nullptr) {
      StartMovingLocked();
      return;
    }
    std::weak_ptr<PipelinedTransfer> weak = weak_from_this();
    timer_ = DeadlineTimer::Shared().At(
        absl::Now() + service_->limits_.idle_timeout, [weak] {
          if (std::shared_ptr<PipelinedTransfer> self = weak.lock()) {
            self->TimedOut();
          }
        });
  }

  void TimedOut() {
    absl::MutexLock lock(&mu_);
    if (ended_ || moving_) return;
    EndLocked(absl::DeadlineExceededError(absl::StrCat(
        "data transfer: no connection presented its ticket within ",
        absl::FormatDuration(service_->limits_.idle_timeout),
        " (the server's transfer idle time-out)")));
  }

  void StartMovingLocked() {
    moving_ = true;
    DeadlineTimer::Shared().Cancel(timer_);
    absl::Status started = service_->StartMover([self = shared_from_this()] {
      absl::Status status = self->Move();
      absl::MutexLock lock(&self->mu_);
      self->EndLocked(self->abort_.ok() ? status : self->abort_);
    });
    if (!started.ok()) EndLocked(started);
  }

  // On the mover's thread: what the connection, buffer and stream it
  // holds (set before the thread started; released only by EndLocked,
  // after this returns) move.
  absl::Status Move() {
    const absl::Duration idle = service_->limits_.idle_timeout;
    const int fd = connection_->get();
    // A stalled client fails the transfer after the idle time-out, as a
    // gRPC transfer's watchdog ends it.
    timeval limit = absl::ToTimeval(idle);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
    absl::Time moved = absl::Now();
    absl::Status status = MoveDataPathBytes(
        upload_, /*keep=*/true, fd, buffer_->device(), device_stream_.get(),
        target_, size_, service_->limits_, [&] { moved = absl::Now(); }, [] {},
        &by_connection_);
    if (!status.ok() && absl::Now() - moved >= idle) {
      return absl::DeadlineExceededError(absl::StrCat(
          "data transfer: no bytes moved for ", absl::FormatDuration(idle),
          " (the server's transfer idle time-out)"));
    }
    return status;
  }

  // Ends the transfer with `status`: everything it holds is let go, the
  // stream last (work queued after it may then run; a failure is its
  // error first).
  void EndLocked(const absl::Status& status) {
    if (ended_) return;
    ended_ = true;
    DeadlineTimer::Shared().Cancel(timer_);
    DataListener* listener = service_->data_listener_;
    listener->Forget(ticket_);
    {
      absl::MutexLock lock(&service_->pipelined_mu_);
      service_->pipelined_.erase(ticket_);
      service_->ReleasePipelinedLocked(owner_);
    }
    if (status.ok()) {
      service_->data_path_count_.Add(size_);
      // The mover is done with it: the next ticket may follow.
      if (connection_ != nullptr) {
        listener->Keep(UniqueFd(connection_->release()));
      }
    }
    connection_.reset();
    buffer_.reset();
    device_stream_.reset();
    std::shared_ptr<Stream::Gate> gate = std::move(gate_);
    // A broken connection is its client's to report (its copy failed);
    // what the device met is the stream's.
    if (gate != nullptr && !status.ok() && !quiet_ && !by_connection_) {
      gate->Fail(
          kernels::AclnnError(kernels::GetAclnnStatus(status), status.code(),
                              absl::StrCat(upload_ ? "data transfer (upload)"
                                                   : "data transfer "
                                                     "(download)",
                                           ": ", status.message())));
    }
    gate.reset();
    stream_.reset();
  }

  RuntimeService* const service_;
  absl::Mutex mu_;
  std::shared_ptr<Stream> stream_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Buffer> buffer_;
  std::shared_ptr<DeviceStream> device_stream_;
  char* const target_;
  const uint64_t size_;
  const bool upload_;
  const std::string ticket_;
  const void* const owner_;
  std::shared_ptr<Stream::Gate> gate_ ABSL_GUARDED_BY(mu_);
  // Cancelled by its client: its failure is not the stream's.
  bool quiet_ ABSL_GUARDED_BY(mu_) = false;
  // The mover's error came from the connection (set by the mover, read
  // once it has ended).
  bool by_connection_ = false;
  std::shared_ptr<UniqueFd> connection_;
  uint64_t timer_ ABSL_GUARDED_BY(mu_) = 0;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
  bool moving_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status abort_ ABSL_GUARDED_BY(mu_);
};

absl::Status RuntimeService::StartMover(std::function<void()> move) {
  std::shared_ptr<DataMovers> movers = movers_;
  {
    absl::MutexLock lock(&movers->mu);
    ++movers->count;
  }
  std::function<void()> counted(
      [this, movers, move = std::move(move)]() mutable {
        move();
        move = nullptr;  // What it holds goes before it is counted out.
        // The service waits for the count, so it is still here.
        if (limits_.after_mover_report) limits_.after_mover_report();
        // Shared, so the count outlives a service that stops waiting now.
        absl::MutexLock lock(&movers->mu);
        --movers->count;
      });
  // No thread (RLIMIT_NPROC, a pids limit) must fail the transfer, not
  // the server: this runs on the listener's thread, a gate callback or a
  // pipeline's, where an escaping exception is std::terminate.
  try {
    if (limits_.start_thread) {
      limits_.start_thread(std::move(counted));
    } else {
      NewThread(std::move(counted)).detach();
    }
  } catch (const std::system_error& e) {
    absl::MutexLock lock(&movers->mu);
    --movers->count;
    return absl::ResourceExhaustedError(absl::StrCat(
        "data transfer: cannot start a thread to move the bytes: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status RuntimeService::Start(DataTransfers::Request request) {
  if (data_listener_ == nullptr) return NoDataPath();
  return std::make_shared<PipelinedTransfer>(this, std::move(request))->Start();
}

void RuntimeService::Refuse(const std::string& ticket) {
  if (data_listener_ != nullptr) data_listener_->Refuse(ticket);
}

void RuntimeService::ReleasePipelinedLocked(const void* owner) {
  auto it = pipelined_per_owner_.find(owner);
  if (it != pipelined_per_owner_.end() && --it->second == 0) {
    pipelined_per_owner_.erase(it);
  }
}

void RuntimeService::AbortPipelinedTransfers(const absl::Status& why) {
  std::vector<std::shared_ptr<PipelinedTransfer>> live;
  {
    absl::MutexLock lock(&pipelined_mu_);
    for (const auto& [ticket, weak] : pipelined_) {
      if (std::shared_ptr<PipelinedTransfer> transfer = weak.lock()) {
        live.push_back(std::move(transfer));
      }
    }
  }
  for (const std::shared_ptr<PipelinedTransfer>& transfer : live) {
    transfer->Abort(why);
  }
}

void RuntimeService::Cancel(const void* owner, const std::string& ticket) {
  std::shared_ptr<PipelinedTransfer> transfer;
  {
    absl::MutexLock lock(&pipelined_mu_);
    auto it = pipelined_.find(ticket);
    if (it == pipelined_.end()) return;
    transfer = it->second.lock();
  }
  if (transfer != nullptr) transfer->CancelByClient(owner);
}

}  // namespace opserver
