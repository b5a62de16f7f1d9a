// The connections the client's transfers take, and what ends one that
// stops moving, against a fake opserver that records the peer (the
// client's TCP connection) of every call and can stall one part of a
// transfer for good (a gate no one opens: not a sleep).
//
// Through an HTTP/2 proxy that stalls a whole connection while one
// stream's data cannot move on (HAProxy 2.6), an upload and a download on
// one connection deadlock: each direction's window update waits behind the
// other direction's data (docs/pool.md, "Transfers through a proxy").
// Hence uploads, downloads and the session's other calls each have their
// own connections; and a part that moves nothing for
// ConnectOptions::transfer_idle_timeout is cancelled with
// DEADLINE_EXCEEDED saying so, rather than hanging for wait_timeout.

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "proto/opserver.grpc.pb.h"
#include "testing/fake_runtime_handles.h"

namespace opserver {
namespace {

using remote::Client;
using remote::ConnectOptions;
using ::testing::IsEmpty;

// Which client connection each kind of call came on, and the stall.
struct Record {
  absl::Mutex mu;
  std::set<std::string> session_peers ABSL_GUARDED_BY(mu);
  std::set<std::string> upload_peers ABSL_GUARDED_BY(mu);
  std::set<std::string> download_peers ABSL_GUARDED_BY(mu);
  // An Upload or Download whose range starts here moves one message and
  // then nothing, until the client gives it up (-1: none does).
  std::atomic<int64_t> stall_offset{-1};
  std::atomic<int> stalled{0};
};

// A reactor that finishes once, whichever comes first of its own end and
// the client giving up (OnCancel): gRPC takes one Finish per call.
template <class Reactor>
class FinishingOnce : public Reactor {
 public:
  void OnCancel() override {
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "given up"));
  }
  void OnDone() override { delete this; }

 protected:
  void FinishOnce(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    finished_ = true;
    this->Finish(status);
  }

 private:
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// Takes every message; stalls after the first one when its range starts
// at the stall offset.
class FakeUpload
    : public FinishingOnce<grpc::ServerReadReactor<grpc::ByteBuffer>> {
 public:
  FakeUpload(Record* record, grpc::ByteBuffer* response)
      : record_(record), response_(response) {
    StartRead(&message_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      v1::UploadResponse reply;
      reply.set_bytes_written(written_);
      bool own;
      FinishOnce(grpc::SerializationTraits<v1::UploadResponse>::Serialize(
          reply, response_, &own));
      return;
    }
    v1::UploadRequest request;
    if (!grpc::SerializationTraits<v1::UploadRequest>::Deserialize(&message_,
                                                                   &request)
             .ok()) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
      return;
    }
    written_ += request.data().size();
    if (first_) {
      first_ = false;
      if (static_cast<int64_t>(request.offset()) ==
          record_->stall_offset.load()) {
        record_->stalled.fetch_add(1);
        return;  // Reads no more: OnCancel ends it.
      }
    }
    message_.Clear();
    StartRead(&message_);
  }

 private:
  Record* const record_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer message_;
  uint64_t written_ = 0;
  bool first_ = true;
};

// Sends the range asked for in 64 KiB chunks; stalls after the first one
// when the range starts at the stall offset.
class FakeDownload
    : public FinishingOnce<grpc::ServerWriteReactor<grpc::ByteBuffer>> {
 public:
  FakeDownload(Record* record, const grpc::ByteBuffer* raw) : record_(record) {
    v1::DownloadRequest request;
    grpc::ByteBuffer copy = *raw;
    if (!grpc::SerializationTraits<v1::DownloadRequest>::Deserialize(&copy,
                                                                     &request)
             .ok()) {
      FinishOnce(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad"));
      return;
    }
    left_ = request.size();
    stall_ =
        static_cast<int64_t>(request.offset()) == record_->stall_offset.load();
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    if (stall_) {
      record_->stalled.fetch_add(1);
      return;  // Sends no more: OnCancel ends it.
    }
    Next();
  }

 private:
  void Next() {
    if (left_ == 0) {
      FinishOnce(grpc::Status::OK);
      return;
    }
    const uint64_t n = std::min<uint64_t>(left_, 64 << 10);
    left_ -= n;
    v1::DownloadResponse chunk;
    chunk.set_data(std::string(n, 'd'));
    bool own;
    message_.Clear();  // Serialize refuses a buffer that holds a message.
    grpc::SerializationTraits<v1::DownloadResponse>::Serialize(chunk, &message_,
                                                               &own)
        .IgnoreError();
    StartWrite(&message_);
  }

  Record* const record_;
  uint64_t left_ = 0;
  bool stall_ = false;
  grpc::ByteBuffer message_;
};

class FakeRuntime final
    : public FakeRuntimeHandles<v1::Runtime::WithRawCallbackMethod_Upload<
          v1::Runtime::WithRawCallbackMethod_Download<v1::Runtime::Service>>> {
 public:
  explicit FakeRuntime(Record* record) : record_(record) {}

  grpc::Status CreateSession(grpc::ServerContext* context,
                             const v1::CreateSessionRequest* request,
                             v1::CreateSessionResponse* response) override {
    Note(&record_->session_peers, context->peer());
    return FakeRuntimeHandles::CreateSession(context, request, response);
  }
  grpc::Status Malloc(grpc::ServerContext* context,
                      const v1::MallocRequest* request,
                      v1::MallocResponse* response) override {
    Note(&record_->session_peers, context->peer());
    return FakeRuntimeHandles::Malloc(context, request, response);
  }
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(
      grpc::CallbackServerContext* context,
      grpc::ByteBuffer* response) override {
    Note(&record_->upload_peers, context->peer());
    return new FakeUpload(record_, response);
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override {
    Note(&record_->download_peers, context->peer());
    return new FakeDownload(record_, request);
  }

 private:
  void Note(std::set<std::string>* peers, const std::string& peer) {
    absl::MutexLock lock(&record_->mu);
    peers->insert(peer);
  }

  Record* const record_;
};

// A Pipeline that applies every command and answers every fence (the
// pipelined session, whose buffer sizes the client knows, splits).
class FakeOperators final : public v1::Operators::Service {
 public:
  grpc::Status Pipeline(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::PipelineEvent, v1::PipelineRequest>* stream)
      override {
    v1::PipelineRequest request;
    if (!stream->Read(&request)) return grpc::Status::OK;
    stream->Write(v1::PipelineEvent());  // Accepted.
    uint64_t applied = 0;
    while (stream->Read(&request)) {
      v1::PipelineEvent event;
      for (const v1::PipelineCommand& command : request.commands()) {
        ++applied;
        if (command.has_fence()) {
          event.add_fences()->set_id(command.fence().id());
        }
      }
      event.set_acknowledged(applied);
      if (!stream->Write(event)) break;
    }
    return grpc::Status::OK;
  }
};

class TransferRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&runtime_);
    builder.RegisterService(&operators_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    session_.reset();
    client_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  // Split over kConnections from kSplitBytes, in 64 KiB messages; no data
  // path (the fake has none, and these are gRPC's transfers).
  static constexpr int kConnections = 3;
  static constexpr uint64_t kSplitBytes = 1 << 20;
  static ConnectOptions Options() {
    ConnectOptions options;
    options.data_path = false;
    options.transfer_connections = kConnections;
    options.transfer_split_bytes = kSplitBytes;
    options.upload_chunk_bytes = 64 << 10;
    return options;
  }
  // Where the second part of a split transfer of `size` starts: the
  // client's parts are size / kConnections, rounded up to whole messages.
  static uint64_t SecondPart(uint64_t size) {
    constexpr uint64_t kMessage = 64 << 10;
    const uint64_t per_part = size / kConnections + (size % kConnections != 0);
    return (per_part + kMessage - 1) / kMessage * kMessage;
  }
  void Open(const ConnectOptions& options) {
    auto client =
        Client::Connect("127.0.0.1:" + std::to_string(port_), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("routes", /*attach=*/false);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  Record record_;
  FakeRuntime runtime_{&record_};
  FakeOperators operators_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<Client> client_;
  std::unique_ptr<remote::Session> session_;
};

std::set<std::string> Both(const std::set<std::string>& a,
                           const std::set<std::string>& b) {
  std::set<std::string> both;
  for (const std::string& x : a) {
    if (b.count(x) != 0) both.insert(x);
  }
  return both;
}

// Split and whole, uploads and downloads: the uploads' connections carry
// no download and none of the session's other calls, and the other way
// round; a split transfer uses transfer_connections of its own direction.
TEST_F(TransferRoutesTest, UploadsAndDownloadsHaveConnectionsOfTheirOwn) {
  Open(Options());
  const uint64_t size = 4 * kSplitBytes;
  auto buffer = session_->Malloc(size);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<char> data(size, 'u');
  for (const uint64_t n : {size, uint64_t{1000}}) {  // Split, then whole.
    SCOPED_TRACE(n);
    ASSERT_TRUE(session_->Upload(buffer->handle(), 0, data.data(), n).ok());
    absl::Status download =
        session_->Download(buffer->handle(), 0, data.data(), n);
    ASSERT_TRUE(download.ok()) << download;
  }
  absl::MutexLock lock(&record_.mu);
  EXPECT_EQ(record_.upload_peers.size(), size_t{kConnections});
  EXPECT_EQ(record_.download_peers.size(), size_t{kConnections});
  EXPECT_THAT(Both(record_.upload_peers, record_.download_peers), IsEmpty());
  EXPECT_THAT(Both(record_.upload_peers, record_.session_peers), IsEmpty());
  EXPECT_THAT(Both(record_.download_peers, record_.session_peers), IsEmpty());
}

// One part of a split upload is never read past its first message (the
// server, or a proxy, stopped taking it): the transfer fails with
// DEADLINE_EXCEEDED naming the idle time and the option, once the idle
// time has passed, instead of waiting out wait_timeout (ten minutes).
TEST_F(TransferRoutesTest, ASplitUploadPartThatStallsEndsTheTransfer) {
  ConnectOptions options = Options();
  options.transfer_idle_timeout = absl::Milliseconds(300);
  Open(options);
  const uint64_t size = 8 * kSplitBytes;  // Parts far beyond any window.
  auto buffer = session_->Malloc(size);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  record_.stall_offset = static_cast<int64_t>(SecondPart(size));
  std::vector<char> data(size, 'u');
  const absl::Status status =
      session_->Upload(buffer->handle(), 0, data.data(), size);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(kernels::GetAclnnStatus(status), kernels::kAclnnErrRuntimeError);
  EXPECT_EQ(status.message(),
            "Upload: no data moved for 300ms "
            "(ConnectOptions::transfer_idle_timeout), so the call was "
            "cancelled: the server, or a proxy between, stopped forwarding "
            "it");
  EXPECT_EQ(record_.stalled.load(), 1);
}

// The same for a download part that sends one chunk and then nothing, and
// for a whole download that does (a download is watched from its first
// message on: before, the server may be waiting for its stream's work).
TEST_F(TransferRoutesTest, ADownloadThatStallsEndsWithDeadlineExceeded) {
  ConnectOptions options = Options();
  options.transfer_idle_timeout = absl::Milliseconds(300);
  Open(options);
  const uint64_t size = 8 * kSplitBytes;
  auto buffer = session_->Malloc(size);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const uint64_t part = SecondPart(size);
  std::vector<char> out(size);
  int stalled = 0;
  for (const auto& [offset, n] :
       {std::pair<uint64_t, uint64_t>{0, size},  // Split: stalls part 2.
        std::pair<uint64_t, uint64_t>{part, kSplitBytes / 2}}) {  // Whole.
    SCOPED_TRACE(n);
    record_.stall_offset = static_cast<int64_t>(part);
    const absl::Status status =
        session_->Download(buffer->handle(), offset, out.data(), n);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_EQ(kernels::GetAclnnStatus(status), kernels::kAclnnErrRuntimeError);
    EXPECT_EQ(status.message(),
              "Download: no data moved for 300ms "
              "(ConnectOptions::transfer_idle_timeout), so the call was "
              "cancelled: the server, or a proxy between, stopped "
              "forwarding it");
    EXPECT_EQ(record_.stalled.load(), ++stalled);
  }
}

TEST_F(TransferRoutesTest, TheIdleTimeoutMustBePositive) {
  for (const absl::Duration timeout :
       {absl::ZeroDuration(), -absl::Seconds(1)}) {
    ConnectOptions options = Options();
    options.transfer_idle_timeout = timeout;
    auto client =
        Client::Connect("127.0.0.1:" + std::to_string(port_), options);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(client.status().message(),
              "transfer_idle_timeout must be positive");
  }
}

}  // namespace
}  // namespace opserver
