// The clients (C++ and the aclnn C API) against a fake opserver whose
// answers the test controls: a call that does not return until the test
// says so, and a message far larger than the protocol needs: a hostile
// or broken server must not hang or exhaust its clients.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"

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

class FakeRuntime final : public v1::Runtime::Service {
 public:
  grpc::Status CreateSession(grpc::ServerContext*,
                             const v1::CreateSessionRequest*,
                             v1::CreateSessionResponse* response) override {
    response->set_session("fake-session");
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*,
                            const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override {
    return grpc::Status::OK;
  }
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
  grpc::Status Malloc(grpc::ServerContext*, const v1::MallocRequest*,
                      v1::MallocResponse* response) override {
    response->set_buffer(++next_);
    return grpc::Status::OK;
  }
  grpc::Status Free(grpc::ServerContext*, const v1::FreeRequest*,
                    v1::FreeResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status GetDeviceInfo(grpc::ServerContext*,
                             const v1::GetDeviceInfoRequest*,
                             v1::GetDeviceInfoResponse* response) override {
    response->set_name(std::string(device_name_bytes, 'x'));
    return grpc::Status::OK;
  }

  // Download answers with these chunks whatever was asked (a hostile or
  // broken server); each gets an unknown varint field when asked to.
  grpc::Status Download(
      grpc::ServerContext*, const v1::DownloadRequest*,
      grpc::ServerWriter<v1::DownloadResponse>* writer) override {
    for (const std::string& data : download_chunks) {
      v1::DownloadResponse chunk;
      chunk.set_data(data);
      if (download_unknown_fields) {
        chunk.GetReflection()->MutableUnknownFields(&chunk)->AddVarint(9, 42);
        chunk.GetReflection()->MutableUnknownFields(&chunk)->AddLengthDelimited(
            10, "not data");
      }
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }

  std::vector<std::string> download_chunks;
  bool download_unknown_fields = false;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_{0};
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

  Gate plan;
  Gate execute;
  std::atomic<uint64_t> next_{100};
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
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }

  FakeRuntime runtime_;
  FakeOperators operators_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
};

// Finding 16(c): a server's message is bounded by what the protocol needs
// (the server's --max_message_bytes, 64 MiB by default), not accepted
// whatever its size.
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
  ConnectOptions options;
  options.pipeline = false;
  auto client = Client::Connect(address_, options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->CreateSession("hostile", /*attach=*/false);
  ASSERT_TRUE(session.ok()) << session.status();
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
    absl::Status status = (*session)->Download(1, 0, out.data(), c.size);
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

// Finding 16(a): a thread blocked in an operator call (planning, then
// launching) does not stop other threads' API calls.
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
