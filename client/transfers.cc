// The client's transfers: Session::Upload and Download, over the server's
// data path, split over several connections, or as one gRPC call whose
// messages are framed by hand so the data is never copied into a message.
// Part of the client library (client.h declares them).

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/server_replies.h"
#include "common/data_path.h"
#include "common/listen_address.h"
#include "common/status_macros.h"
#include "common/transfer_framing.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace opserver {
namespace remote {
namespace {

// The Upload and Download methods, called with raw messages so the client
// serializes and parses their data itself (the stub's `bytes` fields would
// cost a copy each way). Built from the generated service name so a rename
// in the .proto cannot leave them behind.
const std::string& UploadMethodName() {
  static const std::string* name = new std::string(
      absl::StrCat("/", v1::Runtime::service_full_name(), "/Upload"));
  return *name;
}
const std::string& DownloadMethodName() {
  static const std::string* name = new std::string(
      absl::StrCat("/", v1::Runtime::service_full_name(), "/Download"));
  return *name;
}

// Slices of the caller's memory lent to gRPC for one Upload. gRPC may hold a
// slice after the Write that took it returns (the sync API's Write completes
// when the message is handed to the transport, not when it is on the wire),
// so Upload waits in WaitUntilReturned() until gRPC has dropped every one:
// nothing refers to the caller's memory once Upload returns.
class LentSlices {
 public:
  LentSlices() = default;
  LentSlices(const LentSlices&) = delete;
  LentSlices& operator=(const LentSlices&) = delete;
  ~LentSlices() { WaitUntilReturned(); }

  grpc::Slice Lend(const char* data, size_t size) {
    {
      absl::MutexLock lock(&mu_);
      ++out_;
    }
    // gRPC never writes through a slice it sends.
    return grpc::Slice(const_cast<char*>(data), size, &LentSlices::Returned,
                       this);
  }

  void WaitUntilReturned() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int64_t* out) { return *out == 0; }, &out_));
  }

 private:
  // gRPC's destroy callback: the last reference to one lent slice is gone.
  static void Returned(void* self) {
    auto* lent = static_cast<LentSlices*>(self);
    absl::MutexLock lock(&lent->mu_);
    --lent->out_;
  }

  absl::Mutex mu_;
  int64_t out_ ABSL_GUARDED_BY(mu_) = 0;
};

// The bytes that precede a chunk's data in its UploadRequest: `header`
// (the serialized fields other than data, possibly none) and the data
// field's tag and length. The data itself follows as its own slice.
std::string UploadPrefix(std::string header, uint64_t data_size) {
  if (data_size == 0) return header;  // proto3 leaves an empty field out.
  return header + UploadDataPrefix(data_size);
}

// Parses one DownloadResponse from gRPC's slices straight into
// out[at, capacity) (ParseDownloadChunk's checks, on the message as it
// came).
absl::StatusOr<uint64_t> ParseDownloadMessage(grpc::ByteBuffer* message,
                                              char* out, uint64_t at,
                                              uint64_t capacity) {
  grpc::ProtoBufferReader reader(message);
  if (!reader.status().ok()) {
    return absl::InternalError(
        "the server sent a message that is not a DownloadResponse");
  }
  return ParseDownloadChunk(&reader, message->Length(), out, at, capacity);
}

}  // namespace

absl::Status Session::Upload(uint64_t buffer, uint64_t offset, const void* data,
                             uint64_t size, uint64_t stream) {
  RETURN_IF_ERROR(Ordered());
  const char* bytes = static_cast<const char*>(data);
  // Only read: Transfer's `data` is written by downloads alone.
  return Transfer(
      true, buffer, offset, const_cast<char*>(bytes), size, stream,
      [&](grpc::Channel* channel, uint64_t at, uint64_t n, uint64_t on,
          IdleWatch idle_watch) {
        return UploadCall(channel, buffer, offset + at, bytes + at, n, on,
                          idle_watch);
      });
}

namespace {

// Where to connect for the transfer `event` opened: the address the
// server advertises (--data_advertise), or else its port on the host this
// client dialed. Every field is the server's word, checked before use; an
// error sends the transfer through gRPC.
absl::StatusOr<ListenAddress> DataPathTarget(
    const v1::OpenDataTransferResponse& event, const std::string& dialed_host,
    const char* what) {
  if (event.ticket().size() != kDataTicketBytes) {
    return absl::InternalError(
        absl::StrCat(what, ": the server's data-path ticket is malformed"));
  }
  if (!event.address().empty()) {
    absl::StatusOr<ListenAddress> advertised =
        ParseConnectAddress(event.address());
    if (!advertised.ok()) {
      return absl::InternalError(
          absl::StrCat(what, ": the server's data-path address is unusable: ",
                       advertised.status().message()));
    }
    return advertised;
  }
  if (event.port() == 0 || event.port() > 65535) {
    return absl::InternalError(
        absl::StrCat(what, ": the server's data-path port is malformed"));
  }
  if (dialed_host.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": the server advertises no data-path address, and the address "
        "dialed is not HOST:PORT"));
  }
  return ListenAddress{dialed_host, static_cast<int>(event.port())};
}

// True when the peer has closed or reset `fd` (without waiting).
bool PeerClosed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 &&
         (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

Session::DataPathAttempt Session::MoveOverDataPath(int fd,
                                                   const std::string& ticket,
                                                   bool upload, bool keep,
                                                   char* data, uint64_t size,
                                                   const char* what) {
  absl::Status sent = SendAll(fd, ticket.data(), ticket.size());
  if (upload) {
    if (sent.ok()) sent = SendAll(fd, data, size);
    // A server that took the ticket closes the connection only after the
    // half-close that ends the bytes (or, kept, after its acknowledgement):
    // closed before, it did not take it (or its transfer failed, which a
    // retry cannot make worse).
    if (!sent.ok()) return {sent, PeerClosed(fd)};
    if (keep) return AwaitUploadAck(fd, what);
    if (PeerClosed(fd)) {
      return {absl::UnavailableError(absl::StrCat(
                  what, ": the server closed the data connection early")),
              true};
    }
    shutdown(fd, SHUT_WR);
    // The server closes once it has read the end of the bytes; a reset
    // says it closed without reading them.
    char byte;
    ssize_t n;
    do {
      n = recv(fd, &byte, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == ECONNRESET || errno == EPIPE)) {
      return {absl::UnavailableError(
                  absl::StrCat(what, ": the server reset the data connection")),
              true};
    }
    return {absl::OkStatus(), false};  // The call says how it went.
  }
  if (!sent.ok()) return {sent, PeerClosed(fd)};
  bool any = false;  // Once a byte came, the server had taken the ticket.
  absl::StatusOr<size_t> got = RecvFull(fd, data, size, [&] { any = true; });
  if (!got.ok()) return {got.status(), !any && PeerClosed(fd)};
  if (*got != size) {
    return {absl::InternalError(absl::StrCat(
                what, ": the server's data connection ended after ", *got,
                " of the ", size, " bytes")),
            *got == 0};
  }
  return {absl::OkStatus(), false, keep};
}

Session::DataPathAttempt Session::AwaitUploadAck(int fd, const char* what) {
  char ack;
  ssize_t n;
  do {
    n = recv(fd, &ack, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n == 1 && ack == kDataUploadAck) return {absl::OkStatus(), false, true};
  if (n == 1) {
    return {absl::InternalError(absl::StrCat(
                what, ": the server answered the upload's last byte with ",
                static_cast<int>(static_cast<unsigned char>(ack)),
                ", not its acknowledgement")),
            false};
  }
  // Closed without the acknowledgement: the server read not all the bytes,
  // so it may not have taken the ticket at all (a kept connection it
  // closed while idle), or its transfer failed; the call tells which.
  if (n == 0 || errno == ECONNRESET || errno == EPIPE) {
    return {absl::UnavailableError(
                absl::StrCat(what,
                             ": the server closed the data connection before "
                             "acknowledging the upload")),
            true};
  }
  return {
      absl::UnavailableError(absl::StrCat(
          what, ": no acknowledgement of the upload: ", std::strerror(errno))),
      false};
}

struct Session::DataPathCall {
  bool upload = false;
  char* data = nullptr;
  uint64_t size = 0;
  const char* what = "";
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::OpenDataTransferResponse>> reader;
  v1::OpenDataTransferResponse event;
  ListenAddress target;
  // The server keeps the connection (keep_connection, agreed to).
  bool keep = false;
  // Sent as a data_transfer command (no call: `reader` is null).
  bool pipelined = false;
  UniqueFd connection;  // The next to use; taken by CompleteDataPath.
  // The connection CompleteDataPath is moving bytes on (-1: none), and
  // whether Cancel() came: a cancelled call opens no new connection.
  absl::Mutex mu;
  int moving_fd ABSL_GUARDED_BY(mu) = -1;
  bool cancelled ABSL_GUARDED_BY(mu) = false;

  // Gives the call up: what it moves stops soon (the server ends its
  // mover, if the ticket was taken, before it releases the stream).
  void Cancel() {
    {
      absl::MutexLock lock(&mu);
      cancelled = true;
      if (moving_fd >= 0) shutdown(moving_fd, SHUT_RDWR);
    }
    context.TryCancel();
  }
  // Cancels the call and reads it to its end.
  void Abandon() {
    Cancel();
    if (reader == nullptr) return;
    while (reader->Read(&event)) {
    }
    reader->Finish().IgnoreError();
  }
};

absl::StatusOr<std::shared_ptr<Session::DataPathCall>> Session::OpenDataPath(
    bool upload, uint64_t buffer, uint64_t offset, char* data, uint64_t size,
    uint64_t stream) {
  if (!client_->DataPathOn() || size < client_->options().data_path_bytes) {
    return nullptr;
  }
  auto call = std::make_shared<DataPathCall>();
  call->upload = upload;
  call->data = data;
  call->size = size;
  call->what = upload ? "Upload" : "Download";
  client_->SetWaitDeadline(&call->context);
  Route(&call->context);
  v1::OpenDataTransferRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_stream(stream);
  request.set_direction(
      upload ? v1::OpenDataTransferRequest::DIRECTION_HOST_TO_DEVICE
             : v1::OpenDataTransferRequest::DIRECTION_DEVICE_TO_HOST);
  request.set_keep_connection(client_->options().keep_data_connections);
  call->reader = client_->runtime().OpenDataTransfer(&call->context, request);
  if (!call->reader->Read(&call->event)) {
    absl::Status status = client_->CallStatus(call->reader->Finish(),
                                              call->context, call->what);
    // A server without the data path (or one older than it): nothing was
    // queued.
    if (absl::IsUnimplemented(status)) {
      client_->DisableDataPath(status);
      return nullptr;
    }
    if (!status.ok()) return status;
    // OK without a ticket claims a transfer that moved nothing: a broken
    // or hostile server. Reported, not retried over gRPC: such a server's
    // word on what it queued cannot be trusted either, and success must
    // never be claimed for bytes that did not move.
    return absl::InternalError(
        absl::StrCat(call->what,
                     ": the server ended OpenDataTransfer without a data-path "
                     "ticket, so nothing was moved"));
  }
  absl::StatusOr<ListenAddress> target =
      DataPathTarget(call->event, client_->DialedHost(), call->what);
  call->keep = client_->options().keep_data_connections &&
               call->event.keeps_connection();
  if (call->keep && target.ok()) client_->NoteKeptDataTarget(*target);
  absl::StatusOr<UniqueFd> connection = UniqueFd();
  if (!target.ok()) {
    connection = target.status();
  } else if (call->keep) {
    connection = client_->TakeDataConnection(*target);
  }
  if (connection.ok() && !connection->valid()) {
    connection = ConnectTcp(target->host, target->port,
                            client_->options().connect_timeout,
                            client_->options().wait_timeout);
  }
  if (!connection.ok()) {
    // Nothing moves without the connection: cancelled, the call leaves
    // nothing behind.
    call->Abandon();
    client_->DisableDataPath(connection.status());
    return nullptr;
  }
  call->target = *target;
  call->connection = *std::move(connection);
  return call;
}

absl::StatusOr<std::shared_ptr<Session::DataPathCall>>
Session::OpenPipelinedDataPath(bool upload, uint64_t buffer, uint64_t offset,
                               char* data, uint64_t size, uint64_t stream) {
  const ConnectOptions& options = client_->options();
  if (channel_ == nullptr || !options.pipelined_data_transfers ||
      !options.keep_data_connections || !client_->DataPathOn() ||
      size < options.data_path_bytes) {
    return nullptr;
  }
  std::optional<ListenAddress> target = client_->KeptDataTarget();
  if (!target.has_value()) return nullptr;
  // Refused here, as the server would refuse it (the connection stays).
  RETURN_IF_ERROR(CheckLocalRange(buffer, offset, size, stream));
  UniqueFd connection = client_->TakeDataConnection(*target);
  if (!connection.valid()) return nullptr;
  absl::StatusOr<std::string> ticket = RandomBytes(kDataTicketBytes);
  if (!ticket.ok()) return nullptr;
  auto call = std::make_shared<DataPathCall>();
  call->upload = upload;
  call->data = data;
  call->size = size;
  call->what = upload ? "Upload" : "Download";
  call->pipelined = true;
  call->keep = true;
  call->target = *target;
  call->event.set_ticket(*ticket);
  call->connection = std::move(connection);
  v1::PipelineCommand command;
  v1::DataTransferCommand& transfer = *command.mutable_data_transfer();
  transfer.set_buffer(buffer);
  transfer.set_offset(offset);
  transfer.set_size(size);
  transfer.set_stream(stream);
  transfer.set_direction(
      upload ? v1::OpenDataTransferRequest::DIRECTION_HOST_TO_DEVICE
             : v1::OpenDataTransferRequest::DIRECTION_DEVICE_TO_HOST);
  transfer.set_ticket(*std::move(ticket));
  RETURN_IF_ERROR(channel_->Send(std::move(command)));
  return call;
}

std::optional<absl::Status> Session::CompleteDataPath(DataPathCall& call,
                                                       bool may_fall_back) {
  // A connection the server closes before taking the ticket (it may drop
  // waiting connections when flooded) is tried again with the same ticket:
  // a ticket claims one connection at most, so a retry cannot move the
  // bytes twice.
  // (A kept connection the server has closed is dropped so, too.)
  constexpr int kConnections = 3;
  DataPathAttempt attempt;
  UniqueFd connection;  // The last one tried: kept if the transfer ended OK.
  for (int i = 0; i < kConnections; ++i) {
    // A new connection's ticket must be expected already (only a kept
    // one waits for its command): the command is acknowledged first.
    if (i > 0 && call.pipelined) {
      absl::Status drained = channel_->Drain();
      if (!drained.ok()) {
        attempt = {drained, false};
        break;
      }
    }
    if (i > 0) {
      absl::StatusOr<UniqueFd> again =
          ConnectTcp(call.target.host, call.target.port,
                     client_->options().connect_timeout,
                     client_->options().wait_timeout);
      if (!again.ok()) {
        // As when the first connection failed: the data path is not
        // usable from here.
        call.Abandon();
        client_->DisableDataPath(again.status());
        if (may_fall_back) return std::nullopt;
        return absl::UnavailableError(
            absl::StrCat(call.what, ": ", again.status().message()));
      }
      call.connection = *std::move(again);
    }
    connection = std::move(call.connection);
    {
      absl::MutexLock lock(&call.mu);
      if (call.cancelled) {
        attempt = {absl::CancelledError(
                       absl::StrCat(call.what, ": cancelled")),
                   false};
        break;
      }
      call.moving_fd = connection.get();
    }
    attempt =
        MoveOverDataPath(connection.get(), call.event.ticket(), call.upload,
                         call.keep, call.data, call.size, call.what);
    {
      // Before the descriptor closes, so Cancel() never shuts down another.
      absl::MutexLock lock(&call.mu);
      call.moving_fd = -1;
    }
    if (!attempt.dropped) break;
  }
  // Closed before the call's end is read, as that ends the server's side
  // of a transfer that broke; only one that ended as a kept one ends stays.
  if (!attempt.reusable) connection.reset();
  if (call.pipelined) return EndPipelined(call, attempt, std::move(connection));
  if (attempt.dropped) {
    // The server kept closing the connection. Cancelled, the call moves
    // nothing more: the server ends its mover, if the ticket was taken at
    // all, before it releases the stream, and a gRPC transfer the caller
    // makes now is ordered on that stream after it, so the two never
    // write the same bytes at once.
    call.Abandon();
    if (may_fall_back) {
      client_->NoteDataPathFallback(attempt.moved);
      return std::nullopt;
    }
    return absl::UnavailableError(absl::StrCat(
        call.what, ": the server kept closing the data connection (",
        attempt.moved.message(), ")"));
  }
  const absl::Status moved = attempt.moved;
  if (!moved.ok()) call.context.TryCancel();
  while (call.reader->Read(&call.event)) {
  }
  // The server's verdict first: it says why a connection broke.
  absl::Status status =
      client_->CallStatus(call.reader->Finish(), call.context, call.what);
  if (!status.ok() && !(absl::IsCancelled(status) && !moved.ok())) {
    return status;
  }
  if (status.ok() && moved.ok() && attempt.reusable) {
    client_->KeepDataConnection(call.target, std::move(connection));
  }
  return moved;
}

std::optional<absl::Status> Session::DataPathTransfer(bool upload,
                                                      uint64_t buffer,
                                                      uint64_t offset,
                                                      char* data, uint64_t size,
                                                      uint64_t stream) {
  absl::StatusOr<std::shared_ptr<DataPathCall>> call =
      OpenDataPath(upload, buffer, offset, data, size, stream);
  if (!call.ok()) return call.status();
  if (*call == nullptr) return std::nullopt;
  return CompleteDataPath(**call, /*may_fall_back=*/true);
}

UniqueFd Client::TakeDataConnection(const ListenAddress& target) {
  const std::string where = target.ToString();
  absl::MutexLock lock(&kept_mu_);
  // The newest first: the least likely to have been closed as idle.
  for (size_t i = kept_data_connections_.size(); i-- > 0;) {
    if (kept_data_connections_[i].first != where) continue;
    UniqueFd fd = std::move(kept_data_connections_[i].second);
    kept_data_connections_.erase(kept_data_connections_.begin() + i);
    // Nothing may have come since the last transfer: a close, a reset or
    // stray bytes each make it unusable.
    pollfd p{fd.get(), POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) == 0) return fd;
  }
  return UniqueFd();
}

void Client::KeepDataConnection(const ListenAddress& target,
                                UniqueFd connection) {
  absl::MutexLock lock(&kept_mu_);
  if (kept_data_connections_.size() >= kMaxKeptDataConnections) {
    kept_data_connections_.erase(kept_data_connections_.begin());
  }
  kept_data_connections_.emplace_back(target.ToString(), std::move(connection));
}

absl::StatusOr<PendingRead> Session::UploadAsync(uint64_t buffer,
                                                 uint64_t offset,
                                                 const void* data,
                                                 uint64_t size,
                                                 uint64_t stream) {
  // Only read, as by Upload.
  char* bytes = const_cast<char*>(static_cast<const char*>(data));
  CopyStarted(stream);
  return StartCopy(stream,
                   OpenAsyncDataPath(true, buffer, offset, bytes, size, stream),
                   [&] { return Upload(buffer, offset, data, size, stream); });
}

absl::StatusOr<PendingRead> Session::DownloadAsync(uint64_t buffer,
                                                   uint64_t offset, void* data,
                                                   uint64_t size,
                                                   uint64_t stream) {
  char* bytes = static_cast<char*>(data);
  CopyStarted(stream);
  return StartCopy(
      stream, OpenAsyncDataPath(false, buffer, offset, bytes, size, stream),
      [&] { return StreamDownload(buffer, offset, data, size, stream); });
}

absl::StatusOr<std::shared_ptr<Session::DataPathCall>>
Session::OpenAsyncDataPath(bool upload, uint64_t buffer, uint64_t offset,
                           char* data, uint64_t size, uint64_t stream) {
  // A data_transfer command stands in the channel's order by itself; a
  // call is ordered after the commands sent before only once the server
  // has them all.
  absl::StatusOr<std::shared_ptr<DataPathCall>> call =
      OpenPipelinedDataPath(upload, buffer, offset, data, size, stream);
  if (!call.ok() || *call != nullptr) return call;
  RETURN_IF_ERROR(Ordered());
  return OpenDataPath(upload, buffer, offset, data, size, stream);
}

absl::Status Session::EndPipelined(const DataPathCall& call,
                                   const DataPathAttempt& attempt,
                                   UniqueFd connection) {
  if (attempt.dropped || !attempt.moved.ok()) {
    // Given up: the server ends the transfer now (if it still waits for a
    // connection) instead of holding the stream until its idle time-out.
    v1::PipelineCommand cancel;
    cancel.set_cancel_data_transfer(call.event.ticket());
    channel_->Send(std::move(cancel)).IgnoreError();
  }
  if (attempt.dropped) {
    return absl::UnavailableError(absl::StrCat(
        call.what, ": the server kept closing the data connection (",
        attempt.moved.message(),
        "); if it refused the transfer, the stream's deferred error says "
        "why"));
  }
  if (attempt.moved.ok() && attempt.reusable) {
    client_->KeepDataConnection(call.target, std::move(connection));
  }
  return attempt.moved;
}

std::optional<ListenAddress> Client::KeptDataTarget() {
  absl::MutexLock lock(&kept_mu_);
  return kept_target_;
}

void Client::NoteKeptDataTarget(const ListenAddress& target) {
  absl::MutexLock lock(&kept_mu_);
  kept_target_ = target;
}

absl::StatusOr<PendingRead> Session::StartCopy(
    uint64_t stream, absl::StatusOr<std::shared_ptr<DataPathCall>> call,
    absl::FunctionRef<absl::Status()> without_data_path) {
  if (!call.ok()) {
    CopyEnded(stream, /*ok=*/false);
    return call.status();
  }
  if (*call == nullptr) {
    absl::Status done = without_data_path();
    CopyEnded(stream, done.ok());
    return PendingRead(std::move(done));
  }
  return CompleteInBackground(*std::move(call), stream);
}

PendingRead Session::CompleteInBackground(std::shared_ptr<DataPathCall> call,
                                          uint64_t stream) {
  {
    absl::MutexLock lock(&mu_);
    ++background_copies_;
  }
  std::function<void()> cancel = [call] { call->Cancel(); };
  std::function<absl::Status()> complete = [this, call, stream]() mutable {
    absl::Status moved = *CompleteDataPath(*call, /*may_fall_back=*/false);
    call.reset();
    CopyEnded(stream, moved.ok());
    absl::MutexLock lock(&mu_);
    --background_copies_;
    return moved;
  };
  call.reset();
  absl::StatusOr<std::unique_ptr<BackgroundCopy>> started =
      BackgroundCopy::Start(complete, std::move(cancel));
  // No thread: the bytes move here instead.
  if (!started.ok()) return PendingRead(complete());
  return PendingRead(*std::move(started));
}

absl::Status Session::Transfer(bool upload, uint64_t buffer, uint64_t offset,
                               char* data, uint64_t size, uint64_t stream,
                               const TransferPart& part_call) {
  CopyStarted(stream);
  const absl::Status moved = [&] {
    std::optional<absl::Status> direct =
        DataPathTransfer(upload, buffer, offset, data, size, stream);
    if (direct.has_value()) return *direct;
    std::optional<absl::Status> split =
        Split(upload, buffer, offset, size, stream, part_call);
    if (split.has_value()) return *split;
    return part_call(client_->TransferChannel(upload, 0), 0, size, stream,
                     IdleWatch::kAfterFirstMessage);
  }();
  CopyEnded(stream, moved.ok());
  return moved;
}

std::optional<absl::Status> Session::Split(bool upload, uint64_t buffer,
                                           uint64_t offset, uint64_t size,
                                           uint64_t stream,
                                           const TransferPart& part_call) {
  const ConnectOptions& options = client_->options();
  if (options.transfer_connections == 1 ||
      size < options.transfer_split_bytes) {
    return std::nullopt;
  }
  {
    // Split only a range the server will accept whole: a refused transfer
    // must write nothing, and a part is refused only once the others may
    // have landed. Buffer sizes are known in pipelined sessions only.
    absl::MutexLock lock(&handles_mu_);
    auto it = buffer_sizes_.find(buffer);
    if (it == buffer_sizes_.end() || offset > it->second ||
        size > it->second - offset) {
      return std::nullopt;
    }
  }
  absl::StatusOr<std::vector<grpc::Channel*>> channels =
      client_->TransferChannels(upload);
  if (!channels.ok()) return std::nullopt;
  // A stream per extra part, for this transfer only: kept, they would
  // count against the session's stream cap for good. Destroyed, they no
  // longer count once DestroyStream has returned.
  std::vector<Stream> streams;
  for (size_t i = 1; i < channels->size(); ++i) {
    absl::StatusOr<Stream> made = CreateStream();
    if (!made.ok()) return std::nullopt;  // E.g. the session's stream cap.
    streams.push_back(*std::move(made));
  }
  // The parts go out on other streams than `stream`, so first an empty
  // transfer on `stream`: the server answers it once the work queued there
  // before is done (without taking that work's errors, which stay for the
  // next Synchronize), and only then may any part land. It moves nothing
  // while it waits, for as long as that work takes.
  RETURN_IF_ERROR(
      part_call((*channels)[0], 0, 0, stream, IdleWatch::kNever));
  // Equal parts, each a whole number of upload messages (downloads come in
  // the server's --chunk_bytes messages; the rounding only evens parts).
  // No part waits for other work: each must move data from the start.
  const uint64_t k = channels->size();
  const uint64_t chunk = std::max<uint64_t>(1, options.upload_chunk_bytes);
  const uint64_t per_part = size / k + (size % k != 0);  // Rounded up.
  const uint64_t part = (per_part + chunk - 1) / chunk * chunk;
  std::vector<absl::Status> results(k);
  std::vector<std::thread> threads;
  for (uint64_t i = 1; i < k && i * part < size; ++i) {
    const uint64_t at = i * part;
    threads.emplace_back([&, i, at] {
      results[i] = part_call((*channels)[i], at, std::min(part, size - at),
                             streams[i - 1].handle(), IdleWatch::kFromTheStart);
    });
  }
  results[0] = part_call((*channels)[0], 0, std::min(part, size), stream,
                         IdleWatch::kFromTheStart);
  for (std::thread& thread : threads) thread.join();
  for (absl::Status& result : results) {
    if (!result.ok()) return result;
  }
  return absl::OkStatus();
}

absl::Status Session::UploadCall(grpc::Channel* channel, uint64_t buffer,
                                 uint64_t offset, const char* bytes,
                                 uint64_t size, uint64_t stream,
                                 IdleWatch idle_watch) {
  // Declared before the call so it outlives it: its destructor waits until
  // gRPC has returned every slice of `data` (also on early returns).
  LentSlices lent;
  absl::Status status;
  {
    grpc::ClientContext context;
    client_->SetWaitDeadline(&context);
    Route(&context);
    // An upload cannot tell its stream's earlier work from a stall.
    std::optional<TransferWatchdog::Watch> watch;
    if (idle_watch == IdleWatch::kFromTheStart) {
      watch.emplace(&client_->transfer_watchdog(), &context);
    }
    grpc::ByteBuffer response;
    // Each message is an UploadRequest serialized by hand: a few header
    // bytes plus a slice pointing into `data`, so the client copies nothing
    // before the socket (the stub's set_data would copy every chunk).
    std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
            channel,
            grpc::internal::RpcMethod(
                UploadMethodName().c_str(),
                grpc::internal::RpcMethod::CLIENT_STREAMING),
            &context, &response));
    const uint64_t chunk =
        std::max<uint64_t>(1, client_->options().upload_chunk_bytes);
    v1::UploadRequest header;
    header.set_session(token_);
    header.set_buffer(buffer);
    header.set_offset(offset);
    header.set_size(size);
    header.set_stream(stream);
    std::string first_header = header.SerializeAsString();
    uint64_t at = 0;
    bool first = true;
    // Set once the message carrying the end-of-stream flag was written, even
    // if that write failed: the call is half-closed then, and a second
    // half-close (WritesDone) aborts the process in gRPC.
    bool half_closed = false;
    while (first || at < size) {
      const uint64_t n = std::min(chunk, size - at);
      // Only the first message carries the header fields.
      std::string prefix =
          UploadPrefix(first ? std::move(first_header) : std::string(), n);
      grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice()};
      size_t count = 1;
      if (n > 0) slices[count++] = lent.Lend(bytes + at, n);
      grpc::ByteBuffer message(slices, count);
      // The last message may go out with the end-of-stream flag.
      grpc::WriteOptions options;
      if (at + n == size) {
        options.set_last_message();
        half_closed = true;
      }
      if (!writer->Write(message, options)) break;  // Finish() says why.
      if (watch.has_value()) watch->Progress();
      at += n;
      first = false;
    }
    if (!half_closed) writer->WritesDone();
    status = client_->CallStatus(writer->Finish(), context, "Upload");
    // Cancelled by the watchdog (a call that ended well meanwhile stands).
    if (!status.ok() && watch.has_value() && watch->expired()) {
      status = client_->transfer_watchdog().IdleError("Upload");
    }
  }  // The call is gone; what gRPC still holds of `data` is being released.
  lent.WaitUntilReturned();
  return status;
}

absl::Status Session::Download(uint64_t buffer, uint64_t offset, void* data,
                               uint64_t size, uint64_t stream) {
  // Device->host: after all work issued before, reporting the session's
  // deferred errors.
  RETURN_IF_ERROR(Flush());
  return StreamDownload(buffer, offset, data, size, stream);
}

absl::Status Session::StreamDownload(uint64_t buffer, uint64_t offset,
                                     void* data, uint64_t size,
                                     uint64_t stream) {
  char* bytes = static_cast<char*>(data);
  return Transfer(
      false, buffer, offset, bytes, size, stream,
      [&](grpc::Channel* channel, uint64_t at, uint64_t n, uint64_t on,
          IdleWatch idle_watch) {
        return DownloadCall(channel, buffer, offset + at, bytes + at, n, on,
                            idle_watch);
      });
}

absl::Status Session::DownloadCall(grpc::Channel* channel, uint64_t buffer,
                                   uint64_t offset, char* bytes, uint64_t size,
                                   uint64_t stream, IdleWatch idle_watch) {
  grpc::ClientContext context;
  client_->SetWaitDeadline(&context);
  Route(&context);
  std::optional<TransferWatchdog::Watch> watch;
  if (idle_watch == IdleWatch::kFromTheStart) {
    watch.emplace(&client_->transfer_watchdog(), &context);
  }
  v1::DownloadRequest request;
  request.set_session(token_);
  request.set_buffer(buffer);
  request.set_offset(offset);
  request.set_size(size);
  request.set_stream(stream);
  // Responses arrive raw and are parsed by ParseDownloadChunk, which copies
  // the data from gRPC's slices to its place in `data` (the generated
  // reader would copy it into a string first).
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
          channel,
          grpc::internal::RpcMethod(
              DownloadMethodName().c_str(),
              grpc::internal::RpcMethod::SERVER_STREAMING),
          &context, request));
  uint64_t at = 0;
  grpc::ByteBuffer chunk;
  absl::Status bad_chunk;
  while (reader->Read(&chunk)) {
    // The server sends once the work queued before is done: from the
    // first message on, a pause is a stall.
    if (watch.has_value()) {
      watch->Progress();
    } else if (idle_watch == IdleWatch::kAfterFirstMessage) {
      watch.emplace(&client_->transfer_watchdog(), &context);
    }
    absl::StatusOr<uint64_t> n = ParseDownloadMessage(&chunk, bytes, at, size);
    chunk.Clear();
    if (!n.ok()) {
      bad_chunk = n.status();
      context.TryCancel();
      break;
    }
    at += *n;
  }
  absl::Status status =
      client_->CallStatus(reader->Finish(), context, "Download");
  if (!status.ok() && watch.has_value() && watch->expired()) {
    return client_->transfer_watchdog().IdleError("Download");
  }
  if (!bad_chunk.ok()) {
    return absl::InternalError(absl::StrCat(
        "Download: after ", at, " of ", size, " bytes, ", bad_chunk.message()));
  }
  if (!status.ok()) return status;
  if (at != size) {
    return absl::InternalError(
        absl::StrCat("Download: server sent ", at, " of the ", size, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace remote
}  // namespace opserver
