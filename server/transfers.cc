// The transfer calls of the Runtime service: Upload, Download and
// OpenDataTransfer (the data path), with what they share: the hold on
// their stream, the idle clock and being ended early. Part of the
// runtime_service library; the classes are RuntimeService's (declared in
// runtime_service.h), defined here so the rest of the service reads on its
// own.

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
#include "common/transfer_framing.h"
#include "runtime/log.h"
#include "server/grpc_status_util.h"
#include "server/raw_message.h"
#include "server/runtime_service.h"
#include "server/upload_parser.h"

namespace opserver {

namespace {

// Moves the bytes of a data-path transfer between the socket `fd` and
// device memory [target, target + size), `chunk` bytes at a time: straight
// into or out of memory the host can address, else through the device's
// staging (DeviceStream::StageUpload / StageDownload), which may copy one
// chunk while the socket moves the next. Calls `moved` after each socket
// call that moved bytes (the idle clock: a chunk can take a slow client far
// longer than the idle timeout) and `progress` after each chunk. An upload
// must end with the client's half-close right after its last byte.
absl::Status MoveDataPathBytes(bool upload, int fd, Device* device,
                               DeviceStream* stream, char* target,
                               uint64_t size, uint64_t chunk,
                               const std::function<void()>& moved,
                               const std::function<void()>& progress) {
  std::unique_ptr<StagedUpload> staged_upload;
  std::unique_ptr<StagedDownload> staged_download;
  if (size != 0 && device->HostAddress(target) == nullptr) {
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
      ASSIGN_OR_RETURN(size_t got, RecvFull(fd, host, n, moved));
      if (got < n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "upload ended after ", at + got, " of the ", size,
            " bytes it announced (the data connection was closed)"));
      }
      if (staged_upload != nullptr) RETURN_IF_ERROR(staged_upload->Commit());
    } else
      RETURN_IF_ERROR(SendAll(fd, host, n, moved));
    at += n;
    progress();
  }
  if (staged_upload != nullptr) RETURN_IF_ERROR(staged_upload->Finish());
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

// What a transfer call shares with those that may end it early: its
// stream's gate callbacks and the idle watchdog, which may run after the
// call is gone. They reach the call only through `call`, under `mu`, which
// is also the call's own lock.
struct RuntimeService::TransferLink {
  absl::Mutex mu;
  Transfer* call ABSL_GUARDED_BY(mu) = nullptr;
  // When a data-path mover last moved bytes (absl::GetCurrentTimeNanos):
  // set after every socket call, so without taking `mu`.
  std::atomic<int64_t> moved_ns{0};
};

// Common to Upload and Download: the hold on the stream (a transfer
// occupies its stream from start to end, so later work on that stream
// waits for it), the idle clock, and being ended early by CloseSession,
// DestroyStream, the idle timeout or cancellation (a stalled transfer must
// not pin a closed session). Members are
// guarded by link_->mu; a session reference is never dropped under it (a
// session's teardown cancels its streams, which takes that lock).
class RuntimeService::Transfer {
 public:
  virtual ~Transfer() = default;

  // The work queued before the transfer has run: move data.
  virtual void GateReachedLocked() = 0;
  // Ends the call with `why`, now or when the operation in flight returns.
  virtual void AbortLocked(const absl::Status& why) = 0;
  // True when the call has waited on its client (not on its stream) for
  // longer than `timeout`.
  bool IdleLocked(absl::Time now, absl::Duration timeout) const {
    const absl::Time moved =
        absl::FromUnixNanos(link_->moved_ns.load(std::memory_order_relaxed));
    return !finished_ && abort_.ok() && !waiting_ &&
           now - std::max(last_progress_, moved) > timeout;
  }
  // The watchdog's second duty: cancels a call whose abort has waited
  // longer than kStuckWriteGrace for a write in flight (see
  // CancelLaterLocked).
  void CancelIfStuckLocked(absl::Time now) {
    if (finished_ || now < cancel_at_) return;
    cancel_at_ = absl::InfiniteFuture();
    context_base_->TryCancel();
  }

 protected:
  Transfer(RuntimeService* service, grpc::ServerContextBase* context)
      : service_(service),
        context_base_(context),
        link_(std::make_shared<TransferLink>()),
        binding_(service->authenticator_, context) {}

  // How long an abort waits for the write in flight before cancelling the
  // call. The call is ended by the reaction to that write, with the abort's
  // reason: cancelling at once raced the write's completion, and a client
  // that had already received the message got gRPC's "Cancelled on the
  // server side" instead of the reason. Only a write the client does not
  // read (its flow-control window full) never completes: that call is
  // cancelled once this grace has passed.
  static constexpr absl::Duration kStuckWriteGrace = absl::Seconds(3);
  // For an abort that must wait on a write in flight: the watchdog cancels
  // the call if it is still there after kStuckWriteGrace.
  void CancelLaterLocked() {
    cancel_at_ = std::min(cancel_at_, absl::Now() + kStuckWriteGrace);
  }

  // Makes the call reachable by the watchdog and the stream callbacks.
  // From the derived constructor's body: only then is the object whole.
  void Link() {
    {
      absl::MutexLock lock(&link_->mu);
      link_->call = this;
    }
    service_->AddTransfer(link_);
  }

  // From the body of a constructor that takes its request whole (Download,
  // OpenDataTransfer): links the call, resolves what it touches with
  // `start`, under the call's lock, and queues its gate on the stream
  // `start` returns. A refusal ends the call through AbortLocked.
  void Begin(
      const std::function<absl::StatusOr<std::shared_ptr<Stream>>()>& start) {
    Link();
    std::shared_ptr<Stream> stream;
    std::shared_ptr<Stream::Gate> gate;
    {
      absl::MutexLock lock(&link_->mu);
      absl::StatusOr<std::shared_ptr<Stream>> target = start();
      if (!target.ok()) {
        AbortLocked(target.status());
        return;
      }
      stream = *std::move(target);
      gate = gate_ = std::make_shared<Stream::Gate>();
      waiting_ = true;
    }
    // Nothing gRPC does for the call reaches the reactor before its
    // constructor has returned it, so the call stays valid.
    absl::Status held = HoldStream(*stream, gate);
    if (!held.ok()) {
      absl::MutexLock lock(&link_->mu);
      AbortLocked(held);
    }
  }

  // From OnDone: no callback reaches the call after this.
  void Unlink() {
    {
      absl::MutexLock lock(&link_->mu);
      link_->call = nullptr;
    }
    service_->RemoveTransfer(link_);
  }

  // Queues the gate that orders the transfer on `stream` and holds it until
  // `gate` is gone. Called without link_->mu (the gate may be reached at
  // once, on this thread).
  absl::Status HoldStream(Stream& stream,
                          const std::shared_ptr<Stream::Gate>& gate) {
    std::shared_ptr<TransferLink> link = link_;
    return stream.Hold(
        gate,
        [link] {
          absl::MutexLock lock(&link->mu);
          if (link->call != nullptr) link->call->GateReachedLocked();
        },
        [link] {
          absl::MutexLock lock(&link->mu);
          if (link->call != nullptr) {
            link->call->AbortLocked(absl::CancelledError(
                "transfer ended: its stream was destroyed or its session "
                "closed"));
          }
        });
  }

  RuntimeService* const service_;
  grpc::ServerContextBase* const context_base_;
  const std::shared_ptr<TransferLink> link_;
  // Whose sessions the transfer may name; revoking the token ends the call
  // (and forgets a data-path ticket with it).
  const TokenBoundCall binding_;
  bool finished_ = false;
  // Waiting for the work queued before it: not idle.
  bool waiting_ = false;
  absl::Time last_progress_ = absl::Now();
  // When the watchdog cancels an aborted call still waiting on its write.
  absl::Time cancel_at_ = absl::InfiniteFuture();
  // Why the call is being ended, once an abort waits for an operation.
  absl::Status abort_;
  std::shared_ptr<Stream::Gate> gate_;
  std::shared_ptr<Session> session_;
  std::shared_ptr<Buffer> buffer_;

  // Called as the call finishes: it lets go of its stream, session and
  // buffer then, not when gRPC deletes it (OnDone), which may come after
  // the server and its devices are gone; a device stream outliving its
  // device would be torn down on freed memory.
  void ReleaseHoldsLocked() {
    gate_.reset();
    session_.reset();
    buffer_.reset();
  }
};

// Upload: the header is taken from the first message; data is copied from
// the received wire slices straight into the buffer, message by message,
// after the work queued on the stream before the upload, which the upload
// holds until its last byte is in.
class RuntimeService::Uploader final
    : public grpc::ServerReadReactor<grpc::ByteBuffer>,
      public Transfer {
 public:
  Uploader(RuntimeService* service, grpc::CallbackServerContext* context,
           grpc::ByteBuffer* response)
      : Transfer(service, context), context_(context), response_(response) {
    Link();
    absl::MutexLock lock(&link_->mu);
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    std::shared_ptr<Stream> stream;
    std::shared_ptr<Stream::Gate> gate;
    {
      absl::MutexLock lock(&link_->mu);
      if (finished_) return;
      last_progress_ = absl::Now();
      if (!ok) {
        FinishLocked(EndOfInput());
        return;
      }
      if (buffer_ != nullptr) {
        WriteAndReadOnLocked();
        return;
      }
      absl::StatusOr<std::shared_ptr<Stream>> target = StartFromHeaderLocked();
      if (!target.ok()) {
        FinishLocked(target.status());
        return;
      }
      stream = *std::move(target);
      gate = gate_ = std::make_shared<Stream::Gate>();
      waiting_ = true;
    }
    // The gate callback writes this message's data and reads on. The call
    // cannot end while this reaction runs, so `this` stays valid.
    absl::Status held = HoldStream(*stream, gate);
    if (!held.ok()) {
      absl::MutexLock lock(&link_->mu);
      FinishLocked(held);
    }
  }

  void GateReachedLocked() override {
    waiting_ = false;
    if (finished_) return;
    last_progress_ = absl::Now();
    WriteAndReadOnLocked();
  }

  // A read may be pending: finishing ends it too (gRPC completes it).
  void AbortLocked(const absl::Status& why) override { FinishLocked(why); }

  void OnCancel() override {
    absl::MutexLock lock(&link_->mu);
    FinishLocked(absl::CancelledError(
        "upload cancelled (by the client, or the server is shutting down)"));
  }

  void OnDone() override {
    Unlink();
    delete this;
  }

 private:
  void FinishLocked(const absl::Status& status) {
    if (finished_) return;
    finished_ = true;
    // The last byte is in (or never will be): the stream goes on.
    const uint64_t written = writer_ ? writer_->written() : 0;
    writer_.reset();
    ReleaseHoldsLocked();
    if (status.ok()) {
      v1::UploadResponse response;
      response.set_bytes_written(written);
      service_->grpc_count_.Add(response.bytes_written());
      bool own_buffer;
      grpc::Status serialized =
          grpc::SerializationTraits<v1::UploadResponse>::Serialize(
              response, response_, &own_buffer);
      Finish(serialized);
      return;
    }
    Finish(ToGrpcStatus(status, context_));
  }

  void WriteAndReadOnLocked() {
    absl::Status status = WriteLocked();
    if (!status.ok()) {
      FinishLocked(status);
    } else {
      message_.Clear();
      StartRead(&message_);
    }
  }

  // Resolves the header (the first message) and returns the stream to
  // order the upload on.
  absl::StatusOr<std::shared_ptr<Stream>> StartFromHeaderLocked() {
    ASSIGN_OR_RETURN(v1::UploadRequest header, ParseUploadHeader(&message_));
    CallLog::NoteSession(context_, header.session());
    ASSIGN_OR_RETURN(TransferTarget target,
                     service_->ResolveTransfer(
                         header.session(), header.buffer(), header.offset(),
                         header.size(), header.stream(), "upload range",
                         binding_.caller(), SessionRoutingKeyOf(context_)));
    session_ = target.session;
    buffer_ = target.buffer;
    writer_.emplace(buffer_->device(), target.stream->device_stream(),
                    static_cast<char*>(buffer_->data()) + header.offset(),
                    header.size(), service_->limits_.chunk_bytes);
    return target.stream;
  }

  // Copies the data of `message_` into the buffer.
  absl::Status WriteLocked() {
    absl::Status status = writer_->Write(&message_);
    session_->Touch();
    return status;
  }

  absl::Status EndOfInput() {
    if (context_->IsCancelled()) {
      return absl::CancelledError("upload cancelled by the client");
    }
    if (buffer_ == nullptr) {
      return absl::InvalidArgumentError(
          "upload ended before its first message (the header)");
    }
    return writer_->Finish();
  }

  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer message_;
  // Set with the header; copies every message's data into the buffer.
  std::optional<UploadWriter> writer_;
};

// Download: after the work queued on the stream before it, streams the
// range in chunks. Each DownloadResponse is built by hand on the wire: a
// few header bytes followed by a slice that points into the device buffer
// itself, so no copy of the data is made before the socket write. Each
// such slice holds the buffer and the stream's gate: the stream stays held
// until gRPC is done with the last view of the buffer.
class RuntimeService::Downloader final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
      public Transfer {
 public:
  Downloader(RuntimeService* service, grpc::CallbackServerContext* context,
             const grpc::ByteBuffer* request)
      : Transfer(service, context), context_(context) {
    Begin([&] { return StartLocked(request); });
  }

  void OnWriteDone(bool ok) override {
    if (service_->limits_.before_write_done) {
      service_->limits_.before_write_done();
    }
    absl::MutexLock lock(&link_->mu);
    writing_ = false;
    // The write is done: nothing to cancel it for.
    cancel_at_ = absl::InfiniteFuture();
    if (finished_) return;
    if (!abort_.ok()) {
      FinishLocked(abort_);
      return;
    }
    if (!ok) {
      FinishLocked(absl::CancelledError("download cancelled by the client"));
      return;
    }
    last_progress_ = absl::Now();
    WriteNextLocked();
  }

  void GateReachedLocked() override {
    waiting_ = false;
    if (finished_) return;
    last_progress_ = absl::Now();
    WriteNextLocked();
  }

  void AbortLocked(const absl::Status& why) override {
    if (finished_ || !abort_.ok()) return;
    if (!writing_) {
      FinishLocked(why);
      return;
    }
    // OnWriteDone ends the call with `why`. A write a client does not read
    // never completes, and a status could only follow it: such a call is
    // cancelled after a grace, which completes the write.
    abort_ = why;
    CancelLaterLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&link_->mu);
    AbortLocked(absl::CancelledError(
        "download cancelled (by the client, or the server is shutting "
        "down)"));
  }

  void OnDone() override {
    Unlink();
    delete this;
  }

 private:
  // What a zero-copy slice keeps alive until gRPC is done with it.
  struct SliceHold {
    std::shared_ptr<Buffer> buffer;
    std::shared_ptr<Stream::Gate> gate;
  };
  static void ReleaseSlice(void* hold) { delete static_cast<SliceHold*>(hold); }

  void FinishLocked(const absl::Status& status) {
    if (finished_) return;
    finished_ = true;
    // Slices still in gRPC's hands keep holding the stream. The staging
    // goes first: its copies run on the device stream.
    staged_.reset();
    device_stream_.reset();
    ReleaseHoldsLocked();
    Finish(ToGrpcStatus(status, context_));
  }

  absl::StatusOr<std::shared_ptr<Stream>> StartLocked(
      const grpc::ByteBuffer* raw) {
    v1::DownloadRequest request;
    RETURN_IF_ERROR(
        ParseRaw(*raw, &request, "malformed DownloadRequest message"));
    CallLog::NoteSession(context_, request.session());
    ASSIGN_OR_RETURN(TransferTarget target,
                     service_->ResolveTransfer(
                         request.session(), request.buffer(), request.offset(),
                         request.size(), request.stream(), "download range",
                         binding_.caller(), SessionRoutingKeyOf(context_)));
    session_ = target.session;
    buffer_ = target.buffer;
    device_stream_ = target.stream->device_stream();
    start_ = next_ = request.offset();
    end_ = request.offset() + request.size();
    return target.stream;
  }

  void WriteNextLocked() {
    if (next_ == end_) {
      service_->grpc_count_.Add(end_ - start_);
      FinishLocked(absl::OkStatus());
      return;
    }
    if (context_->IsCancelled()) {
      FinishLocked(absl::CancelledError("download cancelled by the client"));
      return;
    }
    const uint64_t n = std::min(end_ - next_, service_->limits_.chunk_bytes);
    const std::string header = DownloadDataPrefix(n);
    char* source = static_cast<char*>(buffer_->data()) + next_;
    grpc::Slice data_slice;
    if (void* host = buffer_->device()->HostAddress(source); host != nullptr) {
      data_slice = grpc::Slice(host, n, &Downloader::ReleaseSlice,
                               new SliceHold{buffer_, gate_});
    } else {
      // The gate holds the stream, so its device stream is this call's.
      // The staging copies the next chunk while gRPC sends this one.
      if (staged_ == nullptr && device_stream_ != nullptr) {
        staged_ = device_stream_->StageDownload(source, end_ - next_,
                                                service_->limits_.chunk_bytes);
      }
      absl::StatusOr<absl::Span<const char>> staging =
          staged_ == nullptr
              ? absl::FailedPreconditionError("the stream has no device stream")
              : staged_->Next();
      if (!staging.ok()) {
        FinishLocked(staging.status());
        return;
      }
      data_slice = grpc::Slice(staging->data(), staging->size());  // A copy.
    }
    grpc::Slice slices[] = {grpc::Slice(header), std::move(data_slice)};
    message_ = grpc::ByteBuffer(slices, 2);
    next_ += n;
    session_->Touch();
    writing_ = true;
    StartWrite(&message_);
  }

  grpc::CallbackServerContext* const context_;
  uint64_t start_ = 0;
  uint64_t next_ = 0;
  uint64_t end_ = 0;
  bool writing_ = false;
  grpc::ByteBuffer message_;
  // For devices the host cannot address: the staging copies' stream, and
  // the staging (made at the first chunk).
  std::shared_ptr<DeviceStream> device_stream_;
  std::unique_ptr<StagedDownload> staged_;
};

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

  void OnWriteDone(bool ok) override {
    if (service_->limits_.before_write_done) {
      service_->limits_.before_write_done();
    }
    absl::MutexLock lock(&link_->mu);
    writing_ = false;
    // The write is done: nothing to cancel it for.
    cancel_at_ = absl::InfiniteFuture();
    if (finished_) return;
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
    if (listener == nullptr) {
      return absl::UnimplementedError(
          "this server has no data path (it is off with TLS and with "
          "--data_port=-1): use Upload and Download");
    }
    using Request = v1::OpenDataTransferRequest;
    if (request.direction() != Request::DIRECTION_HOST_TO_DEVICE &&
        request.direction() != Request::DIRECTION_DEVICE_TO_HOST) {
      return absl::InvalidArgumentError(
          "direction: DIRECTION_HOST_TO_DEVICE or DIRECTION_DEVICE_TO_HOST");
    }
    upload_ = request.direction() == Request::DIRECTION_HOST_TO_DEVICE;
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
    std::shared_ptr<DataMovers> movers = service_->movers_;
    {
      absl::MutexLock lock(&movers->mu);
      ++movers->count;
    }
    // Everything the mover touches is its own reference: it may outlive
    // the call object only until it has reported through the link.
    std::function<void()> move(
        [service = service_, movers = std::move(movers), link = link_,
         connection = connection_, gate = gate_, buffer = buffer_,
         session = session_, device_stream = device_stream_, upload = upload_,
         target = target_, size = size_]() mutable {
          absl::Status status = MoveDataPathBytes(
              upload, connection->get(), buffer->device(), device_stream.get(),
              target, size, service->limits_.chunk_bytes,
              [&] {
                link->moved_ns.store(absl::GetCurrentTimeNanos(),
                                     std::memory_order_relaxed);
              },
              [&] { session->Touch(); });
          {
            absl::MutexLock lock(&link->mu);
            if (link->call != nullptr) {
              static_cast<DataTransfer*>(link->call)->MovedLocked(status);
            }
          }
          // The memory and the stream are released before the service may go.
          connection.reset();
          gate.reset();
          buffer.reset();
          session.reset();
          device_stream.reset();
          // Shared, so the count outlives a service that stops waiting now.
          absl::MutexLock lock(&movers->mu);
          --movers->count;
        });
    // No thread (RLIMIT_NPROC, a pids limit) must fail this transfer, not
    // the server: this runs on the listener's thread or a gate callback,
    // where an escaping exception is std::terminate.
    try {
      if (service_->limits_.start_thread) {
        service_->limits_.start_thread(std::move(move));
      } else {
        NewThread(std::move(move)).detach();
      }
    } catch (const std::system_error& e) {
      {
        absl::MutexLock lock(&service_->movers_->mu);
        --service_->movers_->count;
      }
      // Nothing was moved: close the connection now, not when the reply
      // in flight (if any) is written.
      if (connection_ != nullptr) shutdown(connection_->get(), SHUT_RDWR);
      MovedLocked(absl::ResourceExhaustedError(absl::StrCat(
          "data transfer: cannot start a thread to move the bytes: ",
          e.what())));
    }
  }

  void MovedLocked(const absl::Status& status) {
    moving_ = false;
    done_ = true;
    result_ = abort_.ok() ? status : abort_;
    if (result_.ok()) service_->data_path_count_.Add(size_);
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
  char* target_ = nullptr;
  uint64_t size_ = 0;
  std::shared_ptr<DeviceStream> device_stream_;
  bool writing_ = false;
  // Set once the client's connection arrived; shared with the mover.
  std::shared_ptr<UniqueFd> connection_;
  bool moving_ = false;
  bool done_ = false;
  absl::Status result_;
};

void RuntimeService::AddTransfer(std::shared_ptr<TransferLink> link) {
  absl::MutexLock lock(&mu_);
  transfers_.insert(std::move(link));
}

void RuntimeService::RemoveTransfer(const std::shared_ptr<TransferLink>& link) {
  absl::MutexLock lock(&mu_);
  transfers_.erase(link);
}

void RuntimeService::WatchTransfers() {
  const absl::Duration timeout = limits_.idle_timeout;
  const absl::Duration tick =
      std::clamp(timeout / 4, absl::Milliseconds(10), absl::Seconds(1));
  const absl::Status expired = absl::DeadlineExceededError(absl::StrCat(
      "transfer ended: no data moved for ", absl::FormatDuration(timeout),
      " (--transfer_idle_timeout_s); the client stopped sending or reading"));
  absl::MutexLock lock(&mu_);
  for (;;) {
    mu_.AwaitWithTimeout(absl::Condition(&destroying_), tick);
    if (destroying_) return;
    std::vector<std::shared_ptr<TransferLink>> links(transfers_.begin(),
                                                     transfers_.end());
    // Transfers are ended outside mu_: ending one takes its own lock and
    // its stream's.
    mu_.Unlock();
    const absl::Time now = absl::Now();
    for (const std::shared_ptr<TransferLink>& link : links) {
      absl::MutexLock call_lock(&link->mu);
      if (link->call == nullptr) continue;
      if (link->call->IdleLocked(now, timeout)) {
        link->call->AbortLocked(expired);
      }
      link->call->CancelIfStuckLocked(now);
    }
    links.clear();
    mu_.Lock();
  }
}

grpc::ServerReadReactor<grpc::ByteBuffer>* RuntimeService::Upload(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new Uploader(this, context, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RuntimeService::Download(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new Downloader(this, context, request);
}

grpc::ServerWriteReactor<v1::OpenDataTransferResponse>*
RuntimeService::OpenDataTransfer(grpc::CallbackServerContext* context,
                                 const v1::OpenDataTransferRequest* request) {
  return new DataTransfer(this, context, request);
}

}  // namespace opserver
