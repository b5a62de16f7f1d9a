// End-to-end: a real Server on a free loopback port, called through a real
// channel by the thin client and by raw stubs.

#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

std::unique_ptr<Server> StartServer() {
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  auto server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(ServerE2ETest, PicksAFreePortAndReportsIt) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
}

TEST(ServerE2ETest, DeviceInfoDescribesTheCpuDeviceAndBuild) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto client = Client::Connect(server->address());
  ASSERT_TRUE(client.ok()) << client.status();
  auto info = (*client)->GetDeviceInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind(), "cpu");
  EXPECT_FALSE(info->name().empty());
  EXPECT_GT(info->memory_bytes(), 0u);
  EXPECT_EQ(info->threads(), 2u);
  EXPECT_EQ(info->server_version(), "0.1.0");
  EXPECT_EQ(info->api_version(), "opserver.v1");
  EXPECT_EQ(info->grpc_version(), grpc::Version());
}

TEST(ServerE2ETest, HealthIsServingForServerAndRuntimeService) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto client = Client::Connect(server->address());
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(*(*client)->CheckHealth(""), "SERVING");
  EXPECT_EQ(*(*client)->CheckHealth("opserver.v1.Runtime"), "SERVING");
  auto unknown = (*client)->CheckHealth("no.such.Service");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no.such.Service"));
}

TEST(ServerE2ETest, HealthWatchSeesNotServingAndEndsOnShutdown) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto reader = stub->Watch(&context, HealthCheckRequest());
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  absl::Time start = absl::Now();
  std::thread stopper([&] { server->Shutdown(); });
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(reader->Read(&response));
  EXPECT_TRUE(reader->Finish().ok());
  stopper.join();
  // The watch must not hold shutdown for the whole grace period.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(ServerE2ETest, HealthWatchOfUnknownServiceSaysServiceUnknown) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(),
                                     grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service("no.such.Service");
  auto reader = stub->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(ServerE2ETest, ShutdownIsIdempotentAndRefusesNewCalls) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  std::string address = server->address();
  server->Shutdown();
  server->Shutdown();
  ConnectOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  auto client = Client::Connect(address, options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr(address));
}

uint32_t SessionCount(remote::Client& client) {
  grpc::ClientContext context;
  client.SetDeadline(&context);
  v1::ServerStats stats;
  grpc::Status status = client.runtime().GetServerStats(
      &context, v1::GetServerStatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats.sessions();
}

// Polls until the server has `want` sessions, for up to a minute (a closed
// session goes on the session manager's teardown, after the call ended).
bool AwaitSessionCount(remote::Client& client, uint32_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (SessionCount(client) != want) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// A CreateSession whose reply cannot be delivered (here
// the client cancels while the server holds the made session's reply)
// leaves no session behind.
TEST(ServerE2ETest, ACreateSessionCancelledBeforeItsReplyLeavesNoSession) {
  absl::Notification made;
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  options.transfer_limits.hold_create_session_reply =
      [&](const std::string& /*session*/) {
        made.Notify();
        return true;  // Until the call is cancelled.
      };
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = remote::Client::Connect((*server)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  grpc::ClientContext context;
  std::thread canceller([&] {
    made.WaitForNotification();
    // The session exists, its reply not sent: now the client gives up.
    EXPECT_TRUE(AwaitSessionCount(**client, 1));
    context.TryCancel();
  });
  v1::CreateSessionResponse response;
  grpc::Status status = (*client)->runtime().CreateSession(
      &context, v1::CreateSessionRequest(), &response);
  canceller.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(AwaitSessionCount(**client, 0))
      << "the session nobody knows is still open";
}

TEST(ServerStartTest, RejectsBadOptionsNamingTheFlag) {
  Options options;
  options.listen = "127.0.0.1:notaport";
  auto server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--listen"));

  options.listen = "127.0.0.1:0";
  options.device = "tpu";
  server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--device"));
  EXPECT_THAT(server.status().message(), HasSubstr("tpu"));

  options.device = "cpu";
  options.threads = -1;
  server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("--threads"));

  options.threads = 0;
  for (uint64_t staging : {uint64_t{0}, (uint64_t{1} << 30) + 1}) {
    options.transfer_limits.staging_chunk_bytes = staging;
    server = Server::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(server.status().message(),
              "--staging_chunk_bytes: must be from 1 to 1073741824 (1 GiB)");
  }

  // Checked before the device is made (no CANN here): with --device=ascend
  // the staging cap must let one transfer run. The CPU device has none.
  options.transfer_limits.staging_chunk_bytes = 8 << 20;
  options.max_staging_bytes = (24 << 20) - 1;
  options.device = "ascend";
  server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.status().message(),
            "--device: --max_staging_bytes (25165823) must hold one "
            "transfer's 3 staging chunks of the larger of --chunk_bytes and "
            "--staging_chunk_bytes: at least 25165824");
  options.device = "cpu";
  server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
}

TEST(ServerStartTest, PortInUseByAnotherServerIsUnavailable) {
  auto first = StartServer();
  ASSERT_NE(first, nullptr);
  Options options;
  options.listen = first->address();
  auto second = Server::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--listen"));
  EXPECT_THAT(second.status().message(), HasSubstr("Address already in use"));
}

}  // namespace
}  // namespace opserver
