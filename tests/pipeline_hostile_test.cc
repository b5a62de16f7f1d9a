// A hostile client of Operators.Pipeline: batches too large to parse on the
// server's callback threads, too many channels, and a channel whose client
// never reads while its session is closed. Each must cost the server a
// bounded amount and nothing of other clients.

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/tensor_desc.h"

namespace opserver {
namespace remote {
namespace {

using ::testing::HasSubstr;

class PipelineHostileTest : public ::testing::Test {
 protected:
  void Start(const opserver::Options& base) {
    opserver::Options options = base;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    auto server = opserver::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ConnectOptions connect;
    connect.pipeline = false;  // This test speaks the channel by hand.
    auto client = Client::Connect(server_->address(), connect);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("hostile", /*attach=*/false);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  // Opens a channel on the session and waits for its first acknowledgement.
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::PipelineRequest, v1::PipelineEvent>>
  Open(grpc::ClientContext* context) {
    auto stream = client_->operators().Pipeline(context);
    v1::PipelineRequest open;
    open.set_session(session_->token());
    EXPECT_TRUE(stream->Write(open));
    return stream;
  }

  // Polls until `done` holds, for at most 20 s (a bounded wait, not a
  // timing assertion: the test fails only if it never holds).
  static bool Eventually(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return done();
  }

  std::unique_ptr<opserver::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

// One message larger than --max_pipeline_batch_bytes ends its channel
// before anything parses it; the session is unharmed.
TEST_F(PipelineHostileTest, OversizedBatchEndsTheChannel) {
  opserver::Options options;
  options.session_limits.max_pipeline_batch_bytes = 64 << 10;
  Start(options);
  grpc::ClientContext context;
  auto stream = Open(&context);
  v1::PipelineRequest batch;
  batch.add_commands()->mutable_plan()->mutable_request()->set_op(
      std::string(100 << 10, 'x'));
  stream->Write(batch);
  v1::PipelineEvent event;
  while (stream->Read(&event)) {
  }
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_pipeline_batch_bytes"));
  EXPECT_TRUE(session_->Malloc(64).ok());
}

TEST_F(PipelineHostileTest, BatchWithTooManyCommandsEndsTheChannel) {
  opserver::Options options;
  options.session_limits.max_pipeline_batch_commands = 100;
  Start(options);
  grpc::ClientContext context;
  auto stream = Open(&context);
  v1::PipelineRequest batch;
  for (int i = 0; i < 101; ++i) batch.add_commands()->set_free(12345);
  stream->Write(batch);
  v1::PipelineEvent event;
  while (stream->Read(&event)) {
    EXPECT_EQ(event.acknowledged(), 0u) << "nothing of the batch is applied";
  }
  grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("--max_pipeline_batch_commands"));
}

TEST_F(PipelineHostileTest, ChannelsPerSessionAreLimited) {
  opserver::Options options;
  options.session_limits.max_pipelines_per_session = 2;
  Start(options);
  v1::PipelineEvent event;
  grpc::ClientContext first_context, second_context;
  auto first = Open(&first_context);
  auto second = Open(&second_context);
  ASSERT_TRUE(first->Read(&event));
  ASSERT_TRUE(second->Read(&event));
  {
    grpc::ClientContext context;
    auto third = Open(&context);
    EXPECT_FALSE(third->Read(&event));
    grpc::Status status = third->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("--max_pipelines_per_session"));
  }
  // A channel that ends gives its place back.
  first->WritesDone();
  while (first->Read(&event)) {
  }
  EXPECT_TRUE(first->Finish().ok());
  grpc::ClientContext again_context;
  auto again = Open(&again_context);
  EXPECT_TRUE(again->Read(&event));
  again->WritesDone();
  while (again->Read(&event)) {
  }
  EXPECT_TRUE(again->Finish().ok());
  second->WritesDone();
  while (second->Read(&event)) {
  }
  EXPECT_TRUE(second->Finish().ok());
}

// A channel whose client stops reading while its batch waits for room for
// fence results used to hold its session after CloseSession answered: the
// session's buffers (and stream threads) stayed until the client cancelled.
// Now CloseSession ends the channel and everything goes at once.
TEST_F(PipelineHostileTest, UnreadChannelDoesNotPinItsClosedSession) {
  opserver::Options options;
  options.session_limits.max_pending_replies = 4;
  Start(options);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(session_->CreateStream().ok());
  auto buffer = session_->Malloc(32 << 20);
  ASSERT_TRUE(buffer.ok());
  const uint64_t handle = buffer->handle();
  buffer->Release();  // The server keeps it until the session goes.
  // A connection whose receive window stays small (no BDP probing), so
  // that what the server writes and nobody reads soon fills it and the
  // channel's fence results stay unwritten, as with a stalled client.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 10);
  auto stub = v1::Operators::NewStub(grpc::CreateCustomChannel(
      server_->address(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext context;
  auto stream = stub->Pipeline(&context);
  v1::PipelineRequest batch;
  batch.set_session(session_->token());
  constexpr uint64_t kId = uint64_t{1} << 62;
  v1::PlanCommand* plan = batch.add_commands()->mutable_plan();
  plan->set_executor(kId);
  plan->mutable_request()->set_op("ThresholdBackward");
  // A view past its buffer: the plan is refused, and each launch fails.
  for (const char* name : {"gradOutput", "self", "out"}) {
    (*plan->mutable_request()->mutable_tensors())[name] =
        Desc(handle, v1::FLOAT, {int64_t{1} << 30});
  }
  for (int i = 0; i < 20000; ++i) {
    batch.add_commands()->mutable_launch()->set_executor(kId);
    batch.add_commands()->mutable_fence()->set_id(static_cast<uint64_t>(i));
  }
  ASSERT_TRUE(stream->Write(batch));
  // Nothing is read. The batch stops once the window is full and 4 fence
  // results wait.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(server_->sessions().accounting().buffers.load(), 1u);
  ASSERT_TRUE(session_->Close().ok());
  EXPECT_TRUE(Eventually([&] {
    return server_->sessions().accounting().buffers.load() == 0;
  })) << "the closed session's buffer is still held";
  EXPECT_EQ(server_->sessions().accounting().bytes.load(), 0u);
  context.TryCancel();
  stream->Finish();
}

}  // namespace
}  // namespace remote
}  // namespace opserver
