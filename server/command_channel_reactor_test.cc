// The Pipeline channel's reactor driven through a fake gRPC stream: the
// test calls its reactions in an order that a real call produces only
// sometimes (gRPC may deliver a cancellation before a read that had
// already completed), and sees what the reactor asks of the stream.
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
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
    status = std::move(s);
    if (++finishes == 1) finished.Notify();
  }
  void SendInitialMetadata() override {}
  void Read(grpc::ByteBuffer* message) override {
    absl::MutexLock lock(&mu_);
    read = message;
    ++reads_;
  }
  // Waits until the reactor has started `n` reads.
  void WaitForReads(int n) {
    absl::MutexLock lock(&mu_);
    auto started = [&]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return reads_ >= n; };
    mu_.Await(absl::Condition(&started));
  }
  void Write(const grpc::ByteBuffer*, grpc::WriteOptions) override {
    {
      absl::MutexLock lock(&mu_);
      write_threads_.push_back(std::this_thread::get_id());
    }
    ++writes;
    if (!wrote.HasBeenNotified()) wrote.Notify();
    if (hold_writes != nullptr) hold_writes->WaitForNotification();
  }
  void WriteAndFinish(const grpc::ByteBuffer*, grpc::WriteOptions,
                      grpc::Status s) override {
    ++writes;
    Finish(std::move(s));
  }

  // The thread of each Write, in order.
  std::vector<std::thread::id> WriteThreads() {
    absl::MutexLock lock(&mu_);
    return write_threads_;
  }

  std::atomic<int> finishes{0};
  absl::Notification finished;  // At the first Finish.
  std::atomic<int> writes{0};
  absl::Notification wrote;  // At the first Write.
  // Set: each Write waits for it (a slice held in its write).
  absl::Notification* hold_writes = nullptr;
  std::optional<grpc::Status> status;
  grpc::ByteBuffer* read = nullptr;  // The read the reactor started.

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}

  Reactor* reactor_ = nullptr;
  absl::Mutex mu_;
  std::vector<std::thread::id> write_threads_ ABSL_GUARDED_BY(mu_);
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
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

  EXPECT_EQ(stream.finishes.load(), 1);
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
  ASSERT_EQ(stream.finishes.load(), 1);
  EXPECT_TRUE(stream.status->ok());
  reactor->OnCancel();
  EXPECT_EQ(stream.finishes.load(), 1);
  reactor->OnDone();
}

// A batch asking for a session fence; `padding` unknown handles freed
// before it make it larger (each a deferred error, applied at once).
grpc::ByteBuffer FenceBatch(const std::string& session, int padding = 0) {
  v1::PipelineRequest batch;
  batch.set_session(session);
  for (int i = 0; i < padding; ++i) batch.add_commands()->set_free(~0ull - i);
  v1::FenceCommand& fence = *batch.add_commands()->mutable_fence();
  fence.set_id(1);
  fence.set_session(true);
  grpc::ByteBuffer bytes;
  EXPECT_TRUE(SerializeRaw(batch, &bytes).ok());
  return bytes;
}

// Opened once, at the latest when it goes (so a failed test does not leave
// the pool's threads waiting at its destruction).
class Gate {
 public:
  ~Gate() { Open(); }
  void Open() {
    if (!open_.HasBeenNotified()) open_.Notify();
  }
  void Wait() { open_.WaitForNotification(); }

 private:
  absl::Notification open_;
};

class RunsHereTest : public CommandChannelReactorTest {
 protected:
  // Both of the pool's threads held until `workers_gate_` opens: a slice
  // handed to the workers cannot run before (their turns come first).
  void HoldWorkers() {
    for (const char* owner : {"hold-a", "hold-b"}) {
      ASSERT_TRUE(
          workers_.Submit(owner, [this] { workers_gate_.Wait(); }).ok());
    }
  }

  std::string NewSession() {
    absl::StatusOr<std::shared_ptr<Session>> session =
        sessions_.Create("reactor_test", "anonymous");
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return "";
    kept_.push_back(*session);
    return (*session)->id();
  }

  // Delivers `batch` as the channel's next read, on the calling thread.
  static void Deliver(Reactor* reactor, FakeStream& stream,
                      const grpc::ByteBuffer& batch) {
    ASSERT_NE(stream.read, nullptr);
    *stream.read = batch;
    reactor->OnReadDone(true);
  }

  // Ends a channel that was sent one batch: its answer is written, and the
  // client sends nothing more.
  static void End(Reactor* reactor, FakeStream& stream) {
    ASSERT_TRUE(stream.wrote.WaitForNotificationWithTimeout(absl::Minutes(1)));
    stream.WaitForReads(2);  // The batch is done: the next read is started.
    reactor->OnWriteDone(true);
    reactor->OnReadDone(false);
    // On this thread, or on the worker once its slice is out of the read
    // it started.
    ASSERT_TRUE(
        stream.finished.WaitForNotificationWithTimeout(absl::Minutes(1)));
    EXPECT_EQ(stream.finishes.load(), 1);
    EXPECT_TRUE(stream.status->ok());
    reactor->OnDone();
  }

  // A Pipeline call on its fake stream.
  struct Channel {
    explicit Channel(OperatorService& service)
        : reactor(service.Pipeline(&context)) {
      stream.Bind(reactor);
    }
    grpc::CallbackServerContext context;
    FakeStream stream;
    Reactor* reactor;
  };

  // `batch` is applied and answered before its read's reaction returns,
  // on the reading thread; the channel then ends.
  static void ExpectAppliedHere(Channel& channel,
                                const grpc::ByteBuffer& batch) {
    Deliver(channel.reactor, channel.stream, batch);
    ASSERT_EQ(channel.stream.writes.load(), 1);  // The fence and the ack.
    EXPECT_EQ(channel.stream.WriteThreads()[0], std::this_thread::get_id());
    End(channel.reactor, channel.stream);
  }

  // With the workers held, nothing of `batch` is answered until they are
  // let go, and then by a worker; the channel then ends.
  void ExpectAppliedByAWorker(Channel& channel, const grpc::ByteBuffer& batch) {
    Deliver(channel.reactor, channel.stream, batch);
    EXPECT_EQ(channel.stream.writes.load(), 0);
    workers_gate_.Open();
    End(channel.reactor, channel.stream);
    EXPECT_NE(channel.stream.WriteThreads()[0], std::this_thread::get_id());
  }

  std::vector<std::shared_ptr<Session>> kept_;
  Gate workers_gate_;  // Before the pool (the base's) goes.
};

// The server's only session: a small batch is applied, and answered, on
// the callback thread that read it, with every worker busy: no hand-off
// to a worker and back (BENCHMARKS.md: a replayed step's server CPU).
TEST_F(RunsHereTest, TheOnlySessionsSmallBatchIsAppliedOnTheReadingThread) {
  const std::string session = NewSession();
  HoldWorkers();
  Channel channel(service_);
  ExpectAppliedHere(channel, FenceBatch(session));
}

// A second session: batches go to the workers, whose turns keep tenants
// apart; nothing is applied on the callback thread.
TEST_F(RunsHereTest, WithASecondSessionTheBatchWaitsForAWorker) {
  const std::string session = NewSession();
  NewSession();
  HoldWorkers();
  Channel channel(service_);
  ExpectAppliedByAWorker(channel, FenceBatch(session));
}

// A batch over kBatchBytesRunHere goes to the workers even alone.
TEST_F(RunsHereTest, ALargeBatchWaitsForAWorker) {
  const std::string session = NewSession();
  HoldWorkers();
  Channel channel(service_);
  const grpc::ByteBuffer batch = FenceBatch(session, /*padding=*/500);
  ASSERT_GT(batch.Length(), 4096u);
  ExpectAppliedByAWorker(channel, batch);
}

// One slice at a time on the callback threads, server-wide: while one
// channel's slice runs on its reading thread (held in its write), another
// channel's batch goes to the workers, so a callback thread stays free.
TEST_F(RunsHereTest, OneSliceAtATimeRunsOnACallbackThread) {
  const std::string session = NewSession();
  HoldWorkers();
  Channel first(service_), second(service_);
  absl::Notification release_first;
  first.stream.hold_writes = &release_first;

  std::thread reading(
      [&] { Deliver(first.reactor, first.stream, FenceBatch(session)); });
  ASSERT_TRUE(
      first.stream.wrote.WaitForNotificationWithTimeout(absl::Minutes(1)));
  EXPECT_EQ(first.stream.WriteThreads()[0], reading.get_id());
  ExpectAppliedByAWorker(second, FenceBatch(session));
  release_first.Notify();
  reading.join();
  End(first.reactor, first.stream);

  // The first slice is over: the next small batch runs where it is read.
  Channel third(service_);
  ExpectAppliedHere(third, FenceBatch(session));
}

}  // namespace
}  // namespace opserver
