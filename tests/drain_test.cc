// Draining (Server::Drain, opserver --drain_s): a real Server on a free
// loopback port, called through raw stubs. The signal handling around it
// is tested against the binary in drain_binary_test.sh.
//
// Timing checks are upper bounds far above what the behaviour needs (a
// loaded machine must not fail them), or lower bounds the server's own
// deadlines guarantee.

#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/thread_start.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"

namespace opserver {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

class DrainTest : public ::testing::Test {
 protected:
  void Start(absl::Duration drain,
             absl::Duration grace = absl::Milliseconds(500)) {
    Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    options.drain = drain;
    options.shutdown_grace = grace;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    runtime_ = v1::Runtime::NewStub(channel_);
    health_ = grpc::health::v1::Health::NewStub(channel_);
  }

  void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  }

  // CreateSession's status, and the session in `id` when it is OK.
  grpc::Status CreateSession(std::string* id) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::CreateSessionRequest request;
    request.set_client_name("drain_test");
    v1::CreateSessionResponse response;
    grpc::Status status = runtime_->CreateSession(&context, request, &response);
    *id = response.session();
    return status;
  }

  std::string MustCreateSession() {
    std::string id;
    grpc::Status status = CreateSession(&id);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return id;
  }

  grpc::Status CloseSession(const std::string& id) {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::CloseSessionRequest request;
    request.set_session(id);
    v1::CloseSessionResponse response;
    return runtime_->CloseSession(&context, request, &response);
  }

  // Health.Check of `service`: the status name, or the error.
  std::string Check(const std::string& service) {
    grpc::ClientContext context;
    SetDeadline(&context);
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status status = health_->Check(&context, request, &response);
    if (!status.ok()) return "error: " + status.error_message();
    return HealthCheckResponse::ServingStatus_Name(response.status());
  }

  v1::ServerStats Stats() {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::ServerStats stats;
    grpc::Status status =
        runtime_->GetServerStats(&context, v1::GetServerStatsRequest(), &stats);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return stats;
  }

  // Runs Drain() on a thread of its own; JoinDrain() returns how it ended.
  void StartDrain() {
    drain_start_ = absl::Now();
    drainer_ = std::thread([this] { drain_end_ = server_->Drain(); });
  }
  Server::DrainEnd JoinDrain() {
    drainer_.join();
    drain_time_ = absl::Now() - drain_start_;
    return drain_end_;
  }

  // Waits (up to 30 s) until the server reports that it drains.
  void AwaitDraining() {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!server_->draining() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_TRUE(server_->draining());
  }

  void TearDown() override {
    if (drainer_.joinable()) {
      server_->EndDrain();
      drainer_.join();
    }
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Runtime::Stub> runtime_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::thread drainer_;
  absl::Time drain_start_;
  absl::Duration drain_time_;
  Server::DrainEnd drain_end_ = Server::DrainEnd::kEnded;
};

// During the drain: health is NOT_SERVING for "" and every service (Check,
// and the Watch stream, which stays open), CreateSession is UNAVAILABLE
// "server draining", GetServerStats says draining, and the open session
// is served as before. Once it closes, Drain() returns at once, long
// before the drain time.
TEST_F(DrainTest, RefusesNewSessionsReportsNotServingAndServesOpenOnes) {
  Start(absl::Seconds(600));
  const std::string session = MustCreateSession();
  EXPECT_FALSE(Stats().draining());
  EXPECT_EQ(Check(""), "SERVING");

  grpc::ClientContext watch_context;
  SetDeadline(&watch_context);
  auto watch = health_->Watch(&watch_context, HealthCheckRequest());
  HealthCheckResponse watched;
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_EQ(watched.status(), HealthCheckResponse::SERVING);

  StartDrain();
  // The watcher is told, and its stream goes on.
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_EQ(watched.status(), HealthCheckResponse::NOT_SERVING);
  AwaitDraining();
  EXPECT_EQ(Check(""), "NOT_SERVING");
  EXPECT_EQ(Check("opserver.v1.Runtime"), "NOT_SERVING");
  EXPECT_EQ(Check("opserver.v1.Operators"), "NOT_SERVING");
  EXPECT_THAT(Check("no.such.Service"), HasSubstr("unknown service"));

  std::string refused_id;
  grpc::Status refused = CreateSession(&refused_id);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("server draining"));
  v1::ServerStats stats = Stats();
  EXPECT_TRUE(stats.draining());
  EXPECT_EQ(stats.sessions(), 1u);

  // The open session works: memory, values, a stream.
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::MallocRequest request;
    request.set_session(session);
    request.set_size(8);
    v1::MallocResponse malloced;
    ASSERT_TRUE(runtime_->Malloc(&context, request, &malloced).ok());
    grpc::ClientContext write_context;
    SetDeadline(&write_context);
    v1::WriteValuesRequest write;
    write.set_session(session);
    write.set_buffer(malloced.buffer());
    write.set_dtype(v1::FLOAT);
    write.add_values(2.5);
    write.add_values(-1);
    v1::WriteValuesResponse written;
    grpc::Status status =
        runtime_->WriteValues(&write_context, write, &written);
    ASSERT_TRUE(status.ok()) << status.error_message();
    grpc::ClientContext read_context;
    SetDeadline(&read_context);
    v1::ReadValuesRequest read;
    read.set_session(session);
    read.set_buffer(malloced.buffer());
    read.set_dtype(v1::FLOAT);
    read.set_count(2);
    v1::ReadValuesResponse values;
    status = runtime_->ReadValues(&read_context, read, &values);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(values.values(), ::testing::ElementsAre(2.5, -1));
    grpc::ClientContext stream_context;
    SetDeadline(&stream_context);
    v1::CreateStreamRequest create;
    create.set_session(session);
    v1::CreateStreamResponse created;
    EXPECT_TRUE(runtime_->CreateStream(&stream_context, create, &created).ok());
  }

  ASSERT_TRUE(CloseSession(session).ok());
  EXPECT_EQ(JoinDrain(), Server::DrainEnd::kSessionsClosed);
  EXPECT_LT(drain_time_, absl::Seconds(60));
  // Still NOT_SERVING until the shutdown ends the watch.
  EXPECT_EQ(Check(""), "NOT_SERVING");
  server_->Shutdown();
  EXPECT_FALSE(watch->Read(&watched));
  EXPECT_TRUE(watch->Finish().ok());
}

// Without open sessions there is nothing to wait for.
TEST_F(DrainTest, WithoutSessionsDrainEndsAtOnce) {
  Start(absl::Seconds(600));
  StartDrain();
  EXPECT_EQ(JoinDrain(), Server::DrainEnd::kSessionsClosed);
  EXPECT_LT(drain_time_, absl::Seconds(60));
  EXPECT_TRUE(server_->draining());
}

// A session that does not close: Drain() returns when the drain time is
// over, and the shutdown after it cancels the session's call in flight
// once the grace has passed.
TEST_F(DrainTest, OpenSessionsAreCutOffAfterDrainAndGrace) {
  const absl::Duration drain = absl::Seconds(1);
  const absl::Duration grace = absl::Milliseconds(500);
  Start(drain, grace);
  const std::string session = MustCreateSession();
  grpc::ClientContext malloc_context;
  SetDeadline(&malloc_context);
  v1::MallocRequest malloc_request;
  malloc_request.set_session(session);
  malloc_request.set_size(64);
  v1::MallocResponse malloced;
  ASSERT_TRUE(
      runtime_->Malloc(&malloc_context, malloc_request, &malloced).ok());

  // An upload that announces 64 bytes and sends none: it stays in flight.
  grpc::ClientContext upload_context;
  upload_context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  v1::UploadResponse uploaded;
  auto upload = runtime_->Upload(&upload_context, &uploaded);
  v1::UploadRequest header;
  header.set_session(session);
  header.set_buffer(malloced.buffer());
  header.set_size(64);
  ASSERT_TRUE(upload->Write(header));

  const absl::Time start = absl::Now();
  StartDrain();
  EXPECT_EQ(JoinDrain(), Server::DrainEnd::kTimeUp);
  EXPECT_GE(absl::Now() - start, drain);
  // Up to the end of the drain the session was served.
  EXPECT_EQ(server_->sessions().session_count(), 1u);
  server_->Shutdown();
  grpc::Status status = upload->Finish();
  EXPECT_FALSE(status.ok());
  EXPECT_LT(absl::Now() - start, drain + grace + absl::Seconds(30));
}

// EndDrain() (what a second SIGTERM does) ends a drain in progress at once.
TEST_F(DrainTest, EndDrainSkipsTheRestOfTheDrain) {
  Start(absl::Seconds(600));
  MustCreateSession();
  StartDrain();
  AwaitDraining();
  server_->EndDrain();
  EXPECT_EQ(JoinDrain(), Server::DrainEnd::kEnded);
  EXPECT_LT(drain_time_, absl::Seconds(60));
  EXPECT_EQ(server_->sessions().session_count(), 1u);
}

// Shutdown() from another thread ends a drain in progress too.
TEST_F(DrainTest, ShutdownEndsADrainInProgress) {
  Start(absl::Seconds(600));
  MustCreateSession();
  StartDrain();
  AwaitDraining();
  server_->Shutdown();
  EXPECT_EQ(JoinDrain(), Server::DrainEnd::kEnded);
  EXPECT_LT(drain_time_, absl::Seconds(60));
}

// Once a client has used up the process's threads
// (RLIMIT_NPROC; here the test hook), the calls that need a thread fail
// with RESOURCE_EXHAUSTED, and shutdown, which used to start a thread and
// die of the exception (SIGABRT), completes without one.
TEST_F(DrainTest, WithoutThreadsCallsFailCleanlyAndShutdownCompletes) {
  Start(absl::ZeroDuration());
  const std::string session = MustCreateSession();
  FailThreadStartsForTesting(true);
  std::string refused;
  grpc::Status create = CreateSession(&refused);
  EXPECT_EQ(create.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(create.error_message(),
            "cannot start the session's stream thread: Resource temporarily "
            "unavailable");
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::CreateStreamRequest request;
    request.set_session(session);
    v1::CreateStreamResponse response;
    grpc::Status stream = runtime_->CreateStream(&context, request, &response);
    EXPECT_EQ(stream.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(stream.error_message(),
              "cannot start a stream thread: Resource temporarily unavailable");
  }
  ::testing::internal::CaptureStderr();
  server_->Shutdown();
  const std::string log = ::testing::internal::GetCapturedStderr();
  server_.reset();
  FailThreadStartsForTesting(false);
  EXPECT_THAT(log, HasSubstr("cannot start the shutdown canceller thread: "
                             "Resource temporarily unavailable; cancelling "
                             "queued work now, without the grace"));
}

TEST(ServerStartTest, WithoutThreadsStartIsAnErrorNotAnAbort) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  FailThreadStartsForTesting(true);
  auto server = Server::Start(options);
  FailThreadStartsForTesting(false);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("cannot start the threads: Resource temporarily "
                        "unavailable"));
}

}  // namespace
}  // namespace opserver
