// The Pipeline channel's reactor driven through a fake gRPC stream: the
// test calls its reactions in an order that a real call produces only
// sometimes (gRPC may deliver a cancellation before a read that had
// already completed), and sees what the reactor asks of the stream.
#include <optional>
#include <string>

#include "devices/testing/fake_device.h"
#include "gtest/gtest.h"
#include "proto/opserver.pb.h"
#include "runtime/session_manager.h"
#include "runtime/work_pool.h"
#include "server/operator_service.h"
#include "server/raw_message.h"

namespace opserver {
namespace {

using Reactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// Records what the reactor asks for; delivers nothing by itself.
class FakeStream final
    : public grpc::ServerCallbackReaderWriter<grpc::ByteBuffer,
                                              grpc::ByteBuffer> {
 public:
  void Bind(Reactor* reactor) {
    reactor_ = reactor;
    BindReactor(reactor);
  }

  void Finish(grpc::Status s) override {
    ++finishes;
    status = std::move(s);
  }
  void SendInitialMetadata() override {}
  void Read(grpc::ByteBuffer* message) override { read = message; }
  void Write(const grpc::ByteBuffer*, grpc::WriteOptions) override { ++writes; }
  void WriteAndFinish(const grpc::ByteBuffer*, grpc::WriteOptions,
                      grpc::Status s) override {
    ++writes;
    Finish(std::move(s));
  }

  int finishes = 0;
  int writes = 0;
  std::optional<grpc::Status> status;
  grpc::ByteBuffer* read = nullptr;  // The read the reactor started.

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  Reactor* reactor_ = nullptr;
};

class CommandChannelReactorTest : public ::testing::Test {
 protected:
  FakeDevice device_;
  SessionManager sessions_{&device_, SessionLimits()};
  WorkPool workers_{WorkPool::Options()};
  OperatorService service_{&device_, &sessions_, TransferLimits(), &workers_};
};

// A read that completes after the call was cancelled must still end the
// call: the cancellation found the read pending and left the ending to
// it. Before, the channel ignored that read and never called Finish, so
// grpc::Server::Shutdown waited for it forever (a fairness_bench run in
// four hung at exit after its giant-batch attackers were killed).
TEST_F(CommandChannelReactorTest,
       AReadCompletingAfterTheCancellationEndsTheCall) {
  grpc::CallbackServerContext context;
  FakeStream stream;
  Reactor* reactor = service_.Pipeline(&context);
  stream.Bind(reactor);
  ASSERT_NE(stream.read, nullptr);  // The channel waits for its first batch.

  reactor->OnCancel();
  // The batch had arrived before the cancellation reached the reactor.
  v1::PipelineRequest batch;
  batch.set_session("0123456789abcdef0123456789abcdef");
  batch.add_commands()->set_free(1);
  ASSERT_TRUE(SerializeRaw(batch, stream.read).ok());
  reactor->OnReadDone(true);

  EXPECT_EQ(stream.finishes, 1);
  ASSERT_TRUE(stream.status.has_value());
  EXPECT_EQ(stream.status->error_code(), grpc::StatusCode::CANCELLED);
  reactor->OnDone();
}

// A cancellation after the call ended asks for no second Finish.
TEST_F(CommandChannelReactorTest, ACancellationAfterTheEndFinishesNothingMore) {
  grpc::CallbackServerContext context;
  FakeStream stream;
  Reactor* reactor = service_.Pipeline(&context);
  stream.Bind(reactor);
  reactor->OnReadDone(false);  // The client closed its side, sent nothing.
  ASSERT_EQ(stream.finishes, 1);
  EXPECT_TRUE(stream.status->ok());
  reactor->OnCancel();
  EXPECT_EQ(stream.finishes, 1);
  reactor->OnDone();
}

}  // namespace
}  // namespace opserver
