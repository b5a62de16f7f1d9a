// A server SIGKILLed under its clients (the first-hour review, problem 3):
// the C++ client, pipelined or not, and the C API say so the same way,
// "server at ADDRESS went away", UNAVAILABLE (ACL_ERROR_RT_FAILURE in C),
// and never that the server freed the session, which is what a server
// that closes a session says (SessionTheServerClosedKeepsItsWording).
//
// Argument: the opserver binary.

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "acl/acl.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/opserver_process.h"
#include "testing/test_main.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string g_opserver;  // argv[1]

class LostServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    process::OpserverLaunch launch;
    launch.binary = g_opserver;
    launch.flags = {"--threads=2"};
    const std::string dir = getenv("TEST_TMPDIR");
    launch.out_path = dir + "/server.out";
    launch.err_path = dir + "/server.err";
    absl::StatusOr<process::OpserverProcess> server =
        process::StartOpserver(launch);
    ASSERT_TRUE(server.ok()) << server.status();
    pid_ = server->pid;
    address_ = server->address;
  }

  void TearDown() override {
    if (pid_ != 0) Kill();
  }

  // SIGKILL, reaped: the server is gone, its sockets closed by the kernel.
  void Kill() {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }

  std::string WentAway() const {
    return absl::StrCat("server at ", address_, " went away");
  }

  pid_t pid_ = 0;
  std::string address_;
};

void ExpectWentAway(const absl::Status& status, const std::string& went_away) {
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(went_away));
  EXPECT_THAT(status.message(), Not(HasSubstr("freed")));
}

TEST_F(LostServerTest, CppClientSaysTheServerWentAway) {
  for (bool pipeline : {true, false}) {
    SCOPED_TRACE(pipeline ? "pipelined" : "unary");
    if (pid_ == 0) SetUp();
    remote::ConnectOptions options;
    options.pipeline = pipeline;
    auto client = remote::Client::Connect(address_, options);
    ASSERT_TRUE(client.ok()) << client.status();
    auto session = (*client)->CreateSession("doomed");
    ASSERT_TRUE(session.ok()) << session.status();
    auto buffer = (*session)->Malloc(64);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const float value = 1;
    ASSERT_TRUE((*session)->WriteAsync(buffer->handle(), 0, &value, 4).ok());
    Kill();
    // Every kind of call: a queued write's fence (pipelined: unary, the
    // write went out at once), a unary call, a transfer.
    if (pipeline) ExpectWentAway((*session)->Flush(), WentAway());
    ExpectWentAway((*session)->Malloc(64).status(), WentAway());
    float out;
    ExpectWentAway((*session)->Download(buffer->handle(), 0, &out, 4),
                   WentAway());
    ExpectWentAway((*client)->CreateSession("after").status(), WentAway());
    // The Attach call notices too (bounded polling: it learns it on its
    // own thread).
    absl::Status lost;
    for (int i = 0; i < 600 && lost.ok(); ++i) {
      lost = (*session)->Lost();
      if (lost.ok()) absl::SleepFor(absl::Milliseconds(100));
    }
    ExpectWentAway(lost, WentAway());
    buffer->Release();
  }
}

TEST_F(LostServerTest, SessionTheServerClosedKeepsItsWording) {
  auto client = remote::Client::Connect(address_);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->CreateSession("closed");
  ASSERT_TRUE(session.ok()) << session.status();
  // Closed on the server under the client (as an idle time-out or a
  // revoked token would): the session is gone, the server is not.
  v1::CloseSessionRequest request;
  request.set_session((*session)->token());
  v1::CloseSessionResponse response;
  grpc::ClientContext context;
  ASSERT_TRUE(
      (*client)->runtime().CloseSession(&context, request, &response).ok());
  absl::Status lost;
  for (int i = 0; i < 600 && lost.ok(); ++i) {
    lost = (*session)->Lost();
    if (lost.ok()) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(lost.code(), absl::StatusCode::kNotFound) << lost;
  EXPECT_THAT(lost.message(), HasSubstr("the server freed the session"));
  EXPECT_THAT(lost.message(), Not(HasSubstr("went away")));
}

TEST_F(LostServerTest, CApiSaysTheServerWentAway) {
  setenv("OPSERVER_ADDRESS", address_.c_str(), 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << aclGetRecentErrMsg();
  void* pointer = nullptr;
  ASSERT_EQ(aclrtMalloc(&pointer, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
      << aclGetRecentErrMsg();
  Kill();
  EXPECT_EQ(aclrtSynchronizeDevice(), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr(WentAway()));
  EXPECT_THAT(aclGetRecentErrMsg(), Not(HasSubstr("freed")));
  void* more = nullptr;
  EXPECT_EQ(aclrtMalloc(&more, 64, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(aclGetRecentErrMsg(), HasSubstr(WentAway()));
  EXPECT_THAT(aclGetRecentErrMsg(), Not(HasSubstr("freed")));
  // Reported already: dropping the lost device is no second error.
  EXPECT_EQ(aclrtResetDevice(0), ACL_SUCCESS) << aclGetRecentErrMsg();
  aclFinalize();
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  return opserver::test_main::RunWithPaths(
      argc, argv, {{"OPSERVER", &opserver::g_opserver}});
}
