// The server's log of failed calls (CallLog): a real Server on a free
// loopback port, with tokens, called through raw stubs and the client
// library; the log is what the server writes to stderr, captured.

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"

namespace opserver {
namespace {

using ::opserver::remote::Client;
using ::opserver::remote::ConnectOptions;
using ::opserver::remote::DeviceBuffer;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kToken[] = "alice-token-0123456789";

class ServerLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string tokens =
        absl::StrCat(::testing::TempDir(), "/server_log_test_tokens");
    {
      std::ofstream file(tokens);
      file << "alice " << kToken << "\n";
    }
    Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    options.auth_token_file = tokens;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    runtime_ = v1::Runtime::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
    // Captured from here: the start-up lines are not what is tested.
    ::testing::internal::CaptureStderr();
    capturing_ = true;
  }

  void TearDown() override {
    if (capturing_) StopAndReadLog();
  }

  // Stops the server (which writes the summaries still due) and returns
  // the lines it logged since SetUp.
  std::vector<std::string> StopAndReadLog() {
    server_->Shutdown();
    capturing_ = false;
    return absl::StrSplit(::testing::internal::GetCapturedStderr(), '\n',
                          absl::SkipEmpty());
  }

  void Prepare(grpc::ClientContext* context) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    context->AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
  }

  std::string MustCreateSession() {
    grpc::ClientContext context;
    Prepare(&context);
    v1::CreateSessionRequest request;
    request.set_client_name("server_log_test");
    v1::CreateSessionResponse response;
    grpc::Status status = runtime_->CreateSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session();
  }

  // A client's mistake: freeing a buffer the session never had.
  grpc::Status FreeUnknownBuffer(const std::string& session) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::FreeRequest request;
    request.set_session(session);
    request.set_buffer(12345);
    v1::FreeResponse response;
    return runtime_->Free(&context, request, &response);
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Runtime::Stub> runtime_;
  bool capturing_ = false;
};

TEST_F(ServerLogTest, AClientMistakeNamesTheMethodTenantAndSession) {
  const std::string session = MustCreateSession();
  grpc::Status status = FreeUnknownBuffer(session);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  std::vector<std::string> failed;
  for (const std::string& line : StopAndReadLog()) {
    if (absl::StrContains(line, "call failed")) failed.push_back(line);
  }
  ASSERT_EQ(failed.size(), 1u) << absl::StrJoin(failed, "\n");
  // LogLine escapes the quote.
  EXPECT_THAT(failed[0],
              EndsWith(absl::StrCat(
                  " opserver: call failed: opserver.v1.Runtime/Free "
                  "tenant=alice session=",
                  session,
                  ": NOT_FOUND (aclnn 361001): no buffer 12345 in this "
                  "session (never created, freed, or another session\\'s)")));
}

TEST_F(ServerLogTest, RepeatedMistakesAreRateLimitedAndSummarized) {
  const std::string session = MustCreateSession();
  constexpr int kMistakes = 30;
  for (int i = 0; i < kMistakes; ++i) {
    ASSERT_EQ(FreeUnknownBuffer(session).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Written lines and the counts of the summaries add up to every mistake;
  // each interval of CallLog::kInterval writes at most kMaxLines, and only
  // an interval that left some out has a summary. (Were the 30 calls
  // spread over more than 10 s per 5 calls, an interval could pass with
  // nothing left out; a loaded machine is far from that.)
  int written = 0;
  int summaries = 0;
  int suppressed = 0;
  const std::string summary = "suppressed ";
  const std::string cause =
      " similar lines (opserver.v1.Runtime/Free "
      "NOT_FOUND) in the last ";
  for (const std::string& line : StopAndReadLog()) {
    if (absl::StrContains(line, "call failed: opserver.v1.Runtime/Free")) {
      ++written;
    }
    const size_t at = line.find(" opserver: " + summary);
    if (at != std::string::npos && absl::StrContains(line, cause)) {
      absl::string_view count(line);
      count.remove_prefix(at + summary.size() + 11);
      count = count.substr(0, count.find(' '));
      int k = 0;
      ASSERT_TRUE(absl::SimpleAtoi(count, &k)) << line;
      suppressed += k;
      ++summaries;
    }
  }
  EXPECT_EQ(written + suppressed, kMistakes);
  EXPECT_GE(summaries, 1);
  EXPECT_LE(written, static_cast<int>(CallLog::kMaxLines) * summaries);
}

TEST_F(ServerLogTest, APipelinedSessionClosedByItsClientLogsNoFailure) {
  ConnectOptions options;
  options.token = kToken;
  options.pipeline = true;
  auto client = Client::Connect(server_->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->CreateSession("server_log_test");
  ASSERT_TRUE(session.ok()) << session.status();
  ASSERT_TRUE((*session)->pipelined());
  {
    absl::StatusOr<DeviceBuffer> buffer = (*session)->Malloc(64);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
  }
  ASSERT_TRUE((*session)->Close().ok());
  session->reset();
  client->reset();
  for (const std::string& line : StopAndReadLog()) {
    EXPECT_THAT(line, Not(HasSubstr("call failed"))) << line;
    EXPECT_THAT(line, Not(HasSubstr("NOT_FOUND"))) << line;
  }
}

}  // namespace
}  // namespace opserver
