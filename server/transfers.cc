// The transfer calls of the Runtime service over gRPC: Upload and Download,
// and the watchdog that ends idle transfers (OpenDataTransfer, the data
// path, is in data_transfer.cc; what they share in transfer_call.h). Part of
// the runtime_service library; the classes are RuntimeService's (declared in
// runtime_service.h), defined here so the rest of the service reads on its
// own.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/transfer_framing.h"
#include "server/grpc_status_util.h"
#include "server/raw_message.h"
#include "server/runtime_service.h"
#include "server/transfer_call.h"
#include "server/upload_parser.h"

namespace opserver {

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

  void OnWriteDone(bool ok) override { EndWrite(ok); }

  void WriteDoneLocked(bool ok) override {
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
  grpc::ByteBuffer message_;
  // For devices the host cannot address: the staging copies' stream, and
  // the staging (made at the first chunk).
  std::shared_ptr<DeviceStream> device_stream_;
  std::unique_ptr<StagedDownload> staged_;
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

}  // namespace opserver
