// The clients (C++ and the aclnn C API) against a fake opserver whose
// answers the test controls: a call that does not return until the test
// says so, a message far larger than the protocol needs, lying lengths,
// replayed fence results and a data-path answer without a ticket: a
// hostile or broken server must not hang, crash or exhaust its clients.

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "client/client.h"
#include "client/command_channel.h"
#include "common/data_path.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"
#include "testing/fake_runtime_handles.h"
#include "testing/tcp_forwarder.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// One call the test holds: it signals `entered` and waits for `release`.
struct Gate {
  std::atomic<bool> armed{false};
  absl::Notification entered;
  absl::Notification release;

  void MaybeWait() {
    if (!armed.exchange(false)) return;
    entered.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
  }
};

// Writes `messages` as they are, whatever was asked: raw bytes, so a test
// can send what no protobuf serializer would (a lying length prefix).
class RawWriter : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RawWriter(std::vector<std::string> messages)
      : messages_(std::move(messages)) {
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  void Next() {
    if (next_ == messages_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    grpc::Slice slice(messages_[next_++]);
    buffer_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&buffer_);
  }

  const std::vector<std::string> messages_;
  size_t next_ = 0;
  grpc::ByteBuffer buffer_;
};

class FakeRuntime final
    : public FakeRuntimeHandles<
          v1::Runtime::WithRawCallbackMethod_Download<v1::Runtime::Service>> {
 public:
  grpc::Status Attach(grpc::ServerContext* context, const v1::AttachRequest*,
                      grpc::ServerWriter<v1::AttachEvent>* writer) override {
    v1::AttachEvent event;
    event.set_event("attached");
    writer->Write(event);
    while (!context->IsCancelled() && !stopping_) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return grpc::Status::OK;
  }
  grpc::Status GetDeviceInfo(grpc::ServerContext*,
                             const v1::GetDeviceInfoRequest*,
                             v1::GetDeviceInfoResponse* response) override {
    response->set_name(std::string(device_name_bytes, 'x'));
    return grpc::Status::OK;
  }

  // Download answers with these chunks whatever was asked (a hostile or
  // broken server); each gets an unknown varint field when asked to. Or,
  // when download_raw is set, with those messages byte for byte.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Download(
      grpc::CallbackServerContext*, const grpc::ByteBuffer*) override {
    if (!download_raw.empty()) return new RawWriter(download_raw);
    std::vector<std::string> messages;
    for (const std::string& data : download_chunks) {
      v1::DownloadResponse chunk;
      chunk.set_data(data);
      if (download_unknown_fields) {
        chunk.GetReflection()->MutableUnknownFields(&chunk)->AddVarint(9, 42);
        chunk.GetReflection()->MutableUnknownFields(&chunk)->AddLengthDelimited(
            10, "not data");
      }
      messages.push_back(chunk.SerializeAsString());
    }
    return new RawWriter(std::move(messages));
  }

  // With open_without_ticket, OpenDataTransfer ends OK having sent
  // nothing; with open_address set, it sends a ticket sending the client
  // there and waits for the client to give the call up; otherwise it is
  // UNIMPLEMENTED, as on a server without the data path.
  grpc::Status OpenDataTransfer(
      grpc::ServerContext* context, const v1::OpenDataTransferRequest*,
      grpc::ServerWriter<v1::OpenDataTransferResponse>* writer) override {
    opened.fetch_add(1);
    if (open_without_ticket) return grpc::Status::OK;
    std::string address;
    {
      absl::MutexLock lock(&mu);
      address = open_address;
    }
    if (address.empty()) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no data path");
    }
    v1::OpenDataTransferResponse event;
    event.set_ticket(std::string(kDataTicketBytes, 't'));
    event.set_port(open_port.load());
    event.set_address(address);
    writer->Write(event);
    while (!context->IsCancelled() && !stopping_) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "given up");
  }

  // ReadValues answers read_values_sent values, whatever the count asked.
  grpc::Status ReadValues(grpc::ServerContext*, const v1::ReadValuesRequest*,
                          v1::ReadValuesResponse* response) override {
    for (int i = 0; i < read_values_sent; ++i) response->add_values(i);
    return grpc::Status::OK;
  }

  std::vector<std::string> download_chunks;
  bool download_unknown_fields = false;
  std::atomic<int> read_values_sent{0};
  std::vector<std::string> download_raw;
  std::atomic<bool> open_without_ticket{false};
  absl::Mutex mu;
  std::string open_address ABSL_GUARDED_BY(mu);
  std::atomic<uint32_t> open_port{1};
  std::atomic<int> opened{0};
  std::atomic<bool> stopping_{false};
  // What GetDeviceInfo answers: a hostile server's huge message.
  std::atomic<size_t> device_name_bytes{3};
};

class FakeOperators final : public v1::Operators::Service {
 public:
  grpc::Status GetWorkspaceSize(
      grpc::ServerContext*, const v1::GetWorkspaceSizeRequest*,
      v1::GetWorkspaceSizeResponse* response) override {
    plan.MaybeWait();
    response->set_executor(++next_);
    return grpc::Status::OK;
  }
  grpc::Status Execute(grpc::ServerContext*, const v1::ExecuteRequest*,
                       v1::ExecuteResponse*) override {
    execute.MaybeWait();
    return grpc::Status::OK;
  }

  // Without pipeline_on, UNIMPLEMENTED (the clients then make unary calls,
  // which the gates hold). With it, a Pipeline that applies every command
  // and answers every fence, but first sends again the result of each
  // fence it answered before (with 64 KiB of data), or with unasked_fence
  // set, a result for a fence never sent. With honest set, it answers each
  // fence once, and keeps every batch it received (Batches()).
  grpc::Status Pipeline(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::PipelineEvent, v1::PipelineRequest>* stream)
      override {
    if (!pipeline_on) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no Pipeline");
    }
    v1::PipelineRequest request;
    if (!stream->Read(&request)) return grpc::Status::OK;
    stream->Write(v1::PipelineEvent());  // Accepted.
    uint64_t applied = 0;
    std::vector<uint64_t> answered;
    while (stream->Read(&request)) {
      if (honest) {
        absl::MutexLock lock(&batches_mu_);
        batches_.push_back(request);
      }
      v1::PipelineEvent event;
      for (const v1::PipelineCommand& command : request.commands()) {
        ++applied;
        if (!command.has_fence()) continue;
        if (honest) {
          event.add_fences()->set_id(command.fence().id());
          continue;
        }
        for (uint64_t id : answered) {
          v1::FenceResult* replay = event.add_fences();
          replay->set_id(id);
          replay->set_data(std::string(64 << 10, 'r'));
        }
        if (unasked_fence) event.add_fences()->set_id(1000);
        event.add_fences()->set_id(command.fence().id());
        answered.push_back(command.fence().id());
      }
      event.set_acknowledged(applied);
      if (!stream->Write(event)) break;
    }
    return grpc::Status::OK;
  }

  Gate plan;
  Gate execute;
  std::atomic<uint64_t> next_{100};
  std::atomic<bool> pipeline_on{false};
  std::atomic<bool> unasked_fence{false};
  std::atomic<bool> honest{false};

  std::vector<v1::PipelineRequest> Batches() {
    absl::MutexLock lock(&batches_mu_);
    return batches_;
  }

 private:
  absl::Mutex batches_mu_;
  std::vector<v1::PipelineRequest> batches_ ABSL_GUARDED_BY(batches_mu_);
};

class FakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.SetMaxSendMessageSize(-1);
    builder.RegisterService(&runtime_);
    builder.RegisterService(&operators_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port_);
  }
  void TearDown() override {
    runtime_.stopping_ = true;
    for (Gate* gate : {&operators_.plan, &operators_.execute}) {
      if (!gate->release.HasBeenNotified()) gate->release.Notify();
    }
    session_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  // client_ and session_ on the fake server, unary calls only unless
  // `options` says otherwise (most tests script the answers themselves).
  void OpenSession(ConnectOptions options = Unary()) {
    auto client = Client::Connect(address_, options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("hostile", /*attach=*/false);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }
  static ConnectOptions Unary() {
    ConnectOptions options;
    options.pipeline = false;
    return options;
  }

  FakeRuntime runtime_;
  FakeOperators operators_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<remote::Session> session_;
};

// The first review, finding 16 (the client accepted messages of any
// size): a server's message is bounded by what the protocol needs (the
// server's --max_message_bytes, 64 MiB by default), not accepted whatever
// its size.
TEST_F(FakeServerTest, OversizedMessagesAreRefused) {
  runtime_.device_name_bytes = 80 << 20;
  auto client = Client::Connect(address_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetDeviceInfo();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kResourceExhausted)
      << info.status();
  // A client told that its server sends larger messages takes them.
  ConnectOptions options;
  options.max_message_bytes = 96 << 20;
  auto trusting = Client::Connect(address_, options);
  ASSERT_TRUE(trusting.ok()) << trusting.status();
  auto big = (*trusting)->GetDeviceInfo();
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->name().size(), size_t{80} << 20);
}

// Download parses the server's chunks itself, straight into the caller's
// memory: it takes what a well-formed server may send (empty chunks,
// unknown fields, any split) and refuses more or fewer bytes than asked
// for without writing past the caller's range.
TEST_F(FakeServerTest, DownloadChecksWhatTheServerSends) {
  OpenSession();
  struct Case {
    std::vector<std::string> chunks;
    bool unknown_fields;
    uint64_t size;
    bool ok;
  };
  const std::string a(5000, 'a'), b(3, 'b');
  for (const Case& c : std::vector<Case>{
           {{}, false, 0, true},
           {{""}, false, 0, true},
           {{"", a, "", b}, false, a.size() + b.size(), true},
           {{a, b}, true, a.size() + b.size(), true},
           {{a}, false, a.size() + b.size(), false},         // Too few.
           {{a, b}, false, a.size() + b.size() - 1, false},  // One too many.
           {{a, b}, false, a.size() - 1, false},  // Past the end mid-stream.
           {{"x"}, true, 0, false},
       }) {
    SCOPED_TRACE(testing::PrintToString(c.size));
    runtime_.download_chunks = c.chunks;
    runtime_.download_unknown_fields = c.unknown_fields;
    std::string out(c.size + 8, '#');
    absl::Status status = session_->Download(1, 0, out.data(), c.size);
    if (c.ok) {
      ASSERT_TRUE(status.ok()) << status;
      std::string expected;
      for (const std::string& chunk : c.chunks) expected += chunk;
      EXPECT_EQ(out.substr(0, c.size), expected);
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    }
    EXPECT_EQ(out.substr(c.size), std::string(8, '#'))
        << "wrote past the range asked for";
  }
}

// The third review, finding 1: a Download with 2 GiB or more left, answered
// with a data length of 2^31 or more, made a negative copy size and
// crashed the client. Refused before any byte is copied: the 3 GiB
// destination is reserved, never touched (its pages stay unbacked).
TEST_F(FakeServerTest, ALyingChunkLengthIsRefusedBeforeAnyCopy) {
  OpenSession();
  constexpr uint64_t kSize = uint64_t{3} << 30;
  void* out = mmap(nullptr, kSize, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(out, MAP_FAILED);
  for (const std::string& length :
       {std::string("\x80\x80\x80\x80\x08"),  // 2^31
        std::string("\xff\xff\xff\xff\x0f"),  // 2^32 - 1
        std::string("\x41")}) {               // 65: one past the message
    SCOPED_TRACE(testing::PrintToString(length));
    runtime_.download_raw = {"\x0a" + length + std::string(64, 'A')};
    absl::Status status = session_->Download(1, 0, out, kSize);
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    EXPECT_THAT(status.message(),
                HasSubstr("Download: after 0 of 3221225472 bytes, the server "
                          "sent a message that is not a DownloadResponse: its "
                          "data claims "));
    EXPECT_THAT(status.message(), HasSubstr("but only 64 follow"));
    EXPECT_EQ(static_cast<const char*>(out)[0], 0) << "copied before refusing";
  }
  munmap(out, kSize);
}

// ReadValues returns what the server sent: a count other than the one
// asked for would have callers read past the end, or see too few.
TEST_F(FakeServerTest, ReadValuesChecksTheServersCount) {
  OpenSession();
  for (const int sent : {0, 3, 5, 1000}) {
    runtime_.read_values_sent = sent;
    auto values = session_->ReadValues(1, 0, kernels::DType::kFloat, 4);
    EXPECT_EQ(values.status().code(), absl::StatusCode::kInternal)
        << values.status();
    EXPECT_EQ(values.status().message(),
              absl::StrCat("ReadValues: the server sent ", sent,
                           " values for a read of 4"));
  }
  runtime_.read_values_sent = 4;
  auto values = session_->ReadValues(1, 0, kernels::DType::kFloat, 4);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::vector<double>{0, 1, 2, 3}));
}

// The third review, finding 9: OpenDataTransfer ended OK without a ticket
// counted as a finished transfer, though no byte moved. It is a malformed
// answer: INTERNAL, and the destination is left as it was.
TEST_F(FakeServerTest, ADataPathAnswerWithoutATicketIsAnError) {
  runtime_.open_without_ticket = true;
  ConnectOptions options = Unary();
  options.data_path_bytes = 1;
  OpenSession(options);
  std::string out(64 << 10, '\xab');
  absl::Status download = session_->Download(1, 0, out.data(), out.size());
  EXPECT_EQ(download.code(), absl::StatusCode::kInternal) << download;
  EXPECT_EQ(download.message(),
            "Download: the server ended OpenDataTransfer without a data-path "
            "ticket, so nothing was moved");
  EXPECT_EQ(out, std::string(64 << 10, '\xab'));
  absl::Status upload = session_->Upload(1, 0, out.data(), out.size());
  EXPECT_EQ(upload.code(), absl::StatusCode::kInternal) << upload;
  EXPECT_THAT(upload.message(), HasSubstr("Upload: the server ended"));
}

// Issue 33: the address a server sends clients to for the data path
// (OpenDataTransferResponse.address) is the server's word, checked like
// every byte from the wire. One the client cannot use is refused before
// anything is dialed: the transfer goes through gRPC, and so do the next
// ones, without asking for the data path again. The trap listens where
// the port field and the wildcard addresses lead (connecting to 0.0.0.0
// reaches this machine), and nobody may connect to it.
TEST_F(FakeServerTest, AHostileDataPathAddressSendsTransfersThroughGrpc) {
  auto trap = TcpForwarder::Start("127.0.0.1");
  ASSERT_TRUE(trap.ok()) << trap.status();
  const std::string port = std::to_string((*trap)->port());
  runtime_.open_port = (*trap)->port();
  const std::string hostile[] = {
      "0.0.0.0:" + port,
      "[::]:" + port,
      "127.0.0.1:" + port + "\n",
      "evil\n\x1b[2J:" + port,
      "[fe80::1%lo]:" + port,
      "::1:" + port,
      "localhost:0",
      "no-port",
      std::string(1 << 16, 'a') + ":" + port,
  };
  runtime_.download_chunks = {"abcd"};
  for (const std::string& address : hostile) {
    SCOPED_TRACE(absl::CHexEscape(address.substr(0, 40)));
    {
      absl::MutexLock lock(&runtime_.mu);
      runtime_.open_address = address;
    }
    session_.reset();
    client_.reset();
    ConnectOptions options = Unary();
    options.data_path_bytes = 1;
    OpenSession(options);
    const int opened = runtime_.opened.load();
    for (int round = 0; round < 2; ++round) {
      std::string out(4, '\0');
      absl::Status download = session_->Download(1, 0, out.data(), out.size());
      ASSERT_TRUE(download.ok()) << download;
      EXPECT_EQ(out, "abcd");
    }
    EXPECT_EQ(runtime_.opened.load(), opened + 1);
  }
  EXPECT_EQ((*trap)->accepted(), 0u);
}

// The third review, finding 2: a server that sent again the results of
// fences the client had already taken had them stored again, without
// bound. A result for a fence the client did not send, or already took,
// ends the channel with a clear error, and no result is held for nobody.
TEST_F(FakeServerTest, FenceResultsNotAwaitedEndTheChannel) {
  OpenSession();  // Unary: the test opens the channel itself.
  operators_.pipeline_on = true;
  for (const bool unasked : {false, true}) {
    SCOPED_TRACE(unasked ? "a fence never sent" : "replayed results");
    operators_.unasked_fence = unasked;
    auto channel = remote::CommandChannel::Open(*client_, session_->token(),
                                                session_->routing_key(), {});
    ASSERT_TRUE(channel.ok()) << channel.status();
    int fenced = 0;
    absl::Status ended;
    for (int i = 0; i < 10 && ended.ok(); ++i) {
      ended = (*channel)->Fence(0, /*session=*/false);
      if (ended.ok()) ++fenced;
    }
    // The first fence has nothing to replay; the second's answer comes
    // after the replay of the first.
    EXPECT_EQ(fenced, unasked ? 0 : 1);
    EXPECT_EQ(ended.code(), absl::StatusCode::kInternal) << ended;
    EXPECT_EQ(ended.message(),
              absl::StrCat("Pipeline: the server sent a result for fence ",
                           unasked ? 1000 : 1,
                           ", which this client did not send, already took, "
                           "or already has (a broken or hostile server); the "
                           "channel is closed"));
    EXPECT_EQ((*channel)->HeldResults(), 0u);
    // Every later call says why.
    EXPECT_EQ((*channel)->Fence(0, false), ended);
  }
}

// A step that replays a graph and waits for it (ReplayGraphAndSynchronize)
// sends the replay and its fence in one Pipeline message, whatever the
// writer thread was doing: the server reads and wakes once per step. Also
// with a window of one command, which two commands sent together must not
// wait on for ever.
TEST_F(FakeServerTest, AReplayAndItsSynchronizeLeaveAsOneMessage) {
  operators_.pipeline_on = true;
  operators_.honest = true;
  for (const uint64_t window : {uint64_t{8192}, uint64_t{1}}) {
    SCOPED_TRACE(window);
    ConnectOptions options;
    options.pipeline_window.commands = window;
    OpenSession(options);
    ASSERT_TRUE(session_->pipelined());
    auto buffer = session_->Malloc(64);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    auto memset = session_->MemsetCommand(buffer->handle(), 0, 64, 7, 0);
    ASSERT_TRUE(memset.ok()) << memset.status();
    std::vector<v1::PipelineCommand> tasks = {*memset};
    auto graph = session_->DefineGraph(std::move(tasks));
    ASSERT_TRUE(graph.ok()) << graph.status();
    ASSERT_TRUE(session_->Flush().ok());
    const size_t before = operators_.Batches().size();
    constexpr int kSteps = 20;
    for (int i = 0; i < kSteps; ++i) {
      ASSERT_TRUE(session_->ReplayGraphAndSynchronize(*graph, 0).ok());
    }
    std::vector<v1::PipelineRequest> batches = operators_.Batches();
    ASSERT_EQ(batches.size(), before + kSteps);
    for (size_t i = before; i < batches.size(); ++i) {
      const v1::PipelineRequest& batch = batches[i];
      ASSERT_EQ(batch.commands_size(), 2) << batch.DebugString();
      EXPECT_EQ(batch.commands(0).replay_graph().graph(), *graph);
      EXPECT_TRUE(batch.commands(1).has_fence()) << batch.DebugString();
      EXPECT_EQ(batch.commands(1).fence().stream(), 0u);
      EXPECT_FALSE(batch.commands(1).fence().session());
    }
    // Refused before anything is sent: an unknown graph.
    EXPECT_EQ(session_->ReplayGraphAndSynchronize(*graph + 1, 0).code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(operators_.Batches().size(), before + kSteps);
    EXPECT_TRUE(buffer->Free().ok());  // Before its session goes.
    session_.reset();
  }
}

// The same through the C API: aclmdlRIExecute waiting for ever sends the
// replay and its synchronize as one message.
TEST_F(FakeServerTest, AclmdlRIExecuteSendsTheReplayAndItsWaitAsOneMessage) {
  operators_.pipeline_on = true;
  operators_.honest = true;
  setenv("OPSERVER_ADDRESS", address_.c_str(), 1);
  setenv("OPSERVER_TIMEOUT_MS", "20000", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << aclGetRecentErrMsg();
  void* data = nullptr;
  ASSERT_EQ(aclrtMalloc(&data, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS) << aclGetRecentErrMsg();
  ASSERT_EQ(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
            ACL_SUCCESS)
      << aclGetRecentErrMsg();
  ASSERT_EQ(aclrtMemsetAsync(data, 64, 7, 64, stream), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  aclmdlRI model = nullptr;
  ASSERT_EQ(aclmdlRICaptureEnd(stream, &model), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  constexpr int kSteps = 5;
  for (int i = 0; i < kSteps; ++i) {
    ASSERT_EQ(aclmdlRIExecute(model, -1), ACL_SUCCESS) << aclGetRecentErrMsg();
  }
  int replays = 0;
  for (const v1::PipelineRequest& batch : operators_.Batches()) {
    for (int i = 0; i < batch.commands_size(); ++i) {
      if (!batch.commands(i).has_replay_graph()) continue;
      ++replays;
      ASSERT_LT(i + 1, batch.commands_size()) << batch.DebugString();
      EXPECT_TRUE(batch.commands(i + 1).has_fence()) << batch.DebugString();
      EXPECT_EQ(batch.commands(i + 1).fence().stream(),
                batch.commands(i).replay_graph().stream());
    }
  }
  EXPECT_EQ(replays, kSteps);
  EXPECT_EQ(aclmdlRIDestroy(model), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS) << aclGetRecentErrMsg();
  EXPECT_EQ(aclrtFree(data), ACL_SUCCESS);
  aclrtResetDevice(0);
  aclFinalize();
}

// The first review, finding 16 (the C API's lock held across calls to the
// server): a thread blocked in an operator call (planning, then launching)
// does not stop other threads' API calls.
TEST_F(FakeServerTest, OperatorCallsDoNotHoldTheGlobalLock) {
  setenv("OPSERVER_ADDRESS", address_.c_str(), 1);
  setenv("OPSERVER_TIMEOUT_MS", "20000", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << aclGetRecentErrMsg();
  void* data = nullptr;
  ASSERT_EQ(aclrtMalloc(&data, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  int64_t shape[] = {16};
  aclTensor* t = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND,
                                 shape, 1, data);

  for (Gate* gate : {&operators_.plan, &operators_.execute}) {
    const bool planning = gate == &operators_.plan;
    aclOpExecutor* executor = nullptr;
    uint64_t ws = 0;
    if (!planning) {
      ASSERT_EQ(aclnnHardswishBackwardGetWorkspaceSize(t, t, t, &ws, &executor),
                ACLNN_SUCCESS);
    }
    gate->armed = true;
    std::atomic<bool> blocked_call_done{false};
    std::thread blocked([&] {
      // Each thread binds its device (context) first, as in CANN.
      ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << aclGetRecentErrMsg();
      if (planning) {
        aclOpExecutor* planned = nullptr;
        uint64_t size = 0;
        EXPECT_EQ(
            aclnnHardswishBackwardGetWorkspaceSize(t, t, t, &size, &planned),
            ACLNN_SUCCESS);
      } else {
        EXPECT_EQ(aclnnHardswishBackward(nullptr, 0, executor, nullptr),
                  ACLNN_SUCCESS);
      }
      blocked_call_done = true;
    });
    gate->entered.WaitForNotification();
    // While that call waits on the server, this thread's calls go on.
    void* other = nullptr;
    EXPECT_EQ(aclrtMalloc(&other, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
        << aclGetRecentErrMsg();
    EXPECT_FALSE(blocked_call_done.load())
        << (planning ? "planning" : "launching")
        << " held the lock other threads need";
    gate->release.Notify();
    blocked.join();
    EXPECT_EQ(aclrtFree(other), ACL_SUCCESS);
  }
  aclDestroyTensor(t);
  aclrtFree(data);
  aclrtResetDevice(0);
  aclFinalize();
}

}  // namespace
}  // namespace opserver
