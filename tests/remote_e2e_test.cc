// End-to-end tests of the remote-execution API: a real Server on a free
// loopback port, called through real channels with the generated stubs.

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"
#include "tests/tensor_desc.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The aclnn status a failed call carried in its trailing metadata, or -1.
int AclnnStatusOf(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find("opserver-aclnn-status");
  if (it == trailers.end()) return -1;
  return std::stoi(std::string(it->second.data(), it->second.size()));
}

struct CallResult {
  grpc::Status status;
  int aclnn = -1;
};

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(Options()); }

  Options DefaultOptions() {
    Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    return options;
  }
  void StartServer(Options options) {
    if (options.listen == Options().listen) {
      Options defaults = DefaultOptions();
      defaults.session_limits = options.session_limits;
      defaults.transfer_limits = options.transfer_limits;
      options = defaults;
    }
    server_.reset();
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = NewChannel();
    runtime_ = v1::Runtime::NewStub(channel_);
    ops_ = v1::Operators::NewStub(channel_);
    session_ = NewSession();
  }

  std::shared_ptr<grpc::Channel> NewChannel() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    return grpc::CreateCustomChannel(server_->address(),
                                     grpc::InsecureChannelCredentials(), args);
  }

  std::string NewSession() {
    grpc::ClientContext context;
    v1::CreateSessionRequest request;
    request.set_client_name("remote_e2e_test");
    v1::CreateSessionResponse response;
    grpc::Status status = runtime_->CreateSession(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.session();
  }

  uint64_t Malloc(uint64_t size, const std::string& session = "") {
    grpc::ClientContext context;
    v1::MallocRequest request;
    request.set_session(session.empty() ? session_ : session);
    request.set_size(size);
    v1::MallocResponse response;
    grpc::Status status = runtime_->Malloc(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.buffer();
  }

  void WriteValues(uint64_t buffer, v1::DataType dtype,
                   const std::vector<double>& values, uint64_t stream = 0) {
    grpc::ClientContext context;
    v1::WriteValuesRequest request;
    request.set_session(session_);
    request.set_buffer(buffer);
    request.set_dtype(dtype);
    request.set_stream(stream);
    for (double v : values) request.add_values(v);
    v1::WriteValuesResponse response;
    grpc::Status status = runtime_->WriteValues(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  std::vector<double> ReadValues(uint64_t buffer, v1::DataType dtype,
                                 uint64_t count, uint64_t stream = 0) {
    grpc::ClientContext context;
    v1::ReadValuesRequest request;
    request.set_session(session_);
    request.set_buffer(buffer);
    request.set_dtype(dtype);
    request.set_count(count);
    request.set_stream(stream);
    v1::ReadValuesResponse response;
    grpc::Status status = runtime_->ReadValues(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.values().begin(), response.values().end()};
  }

  CallResult GetWorkspaceSize(const v1::GetWorkspaceSizeRequest& request,
                              v1::GetWorkspaceSizeResponse* response) {
    grpc::ClientContext context;
    CallResult result;
    result.status = ops_->GetWorkspaceSize(&context, request, response);
    result.aclnn = AclnnStatusOf(context);
    return result;
  }

  CallResult Execute(uint64_t executor, uint64_t stream = 0,
                     uint64_t workspace_buffer = 0,
                     uint64_t workspace_size = 0) {
    grpc::ClientContext context;
    v1::ExecuteRequest request;
    request.set_session(session_);
    request.set_executor(executor);
    request.set_stream(stream);
    request.set_workspace_buffer(workspace_buffer);
    request.set_workspace_size(workspace_size);
    v1::ExecuteResponse response;
    CallResult result;
    result.status = ops_->Execute(&context, request, &response);
    result.aclnn = AclnnStatusOf(context);
    return result;
  }

  grpc::Status Synchronize(uint64_t stream = 0) {
    grpc::ClientContext context;
    v1::SynchronizeStreamRequest request;
    request.set_session(session_);
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    return runtime_->SynchronizeStream(&context, request, &response);
  }

  // Plans ThresholdBackward over three 4-element FLOAT buffers.
  uint64_t PlanThreshold(uint64_t grad, uint64_t self, uint64_t out,
                         double threshold, int64_t n = 4) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(session_);
    request.set_op("ThresholdBackward");
    request.mutable_params()->set_threshold(threshold);
    (*request.mutable_tensors())["gradOutput"] = Desc(grad, v1::FLOAT, {n});
    (*request.mutable_tensors())["self"] = Desc(self, v1::FLOAT, {n});
    (*request.mutable_tensors())["out"] = Desc(out, v1::FLOAT, {n});
    v1::GetWorkspaceSizeResponse response;
    CallResult result = GetWorkspaceSize(request, &response);
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
    EXPECT_EQ(response.workspace_size(), 0u);
    return response.executor();
  }

  v1::ServerStats ServerStats() {
    grpc::ClientContext context;
    v1::ServerStats stats;
    EXPECT_TRUE(
        runtime_->GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
            .ok());
    return stats;
  }

  void CloseSessionOfFixture() {
    grpc::ClientContext context;
    v1::CloseSessionRequest request;
    request.set_session(session_);
    v1::CloseSessionResponse response;
    ASSERT_TRUE(runtime_->CloseSession(&context, request, &response).ok());
  }

  // Polls until the server holds no session and no device memory.
  bool WaitForEmptyServer() {
    for (int i = 0; i < 2400; ++i) {
      v1::ServerStats stats = ServerStats();
      if (stats.sessions() == 0 && stats.buffer_bytes() == 0) return true;
      absl::SleepFor(absl::Milliseconds(25));
    }
    return false;
  }

  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Runtime::Stub> runtime_;
  std::unique_ptr<v1::Operators::Stub> ops_;
  std::string session_;
};

TEST_F(RemoteTest, ThresholdBackwardWorkedExample) {
  uint64_t grad = Malloc(16), self = Malloc(16), out = Malloc(16);
  WriteValues(grad, v1::FLOAT, {4.5, 4.4, 4.3, 4.2});
  WriteValues(self, v1::FLOAT, {0.2, 1.2, 2.2, 3.2});
  uint64_t executor = PlanThreshold(grad, self, out, 1.0);
  CallResult result = Execute(executor);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  ASSERT_TRUE(Synchronize().ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 4), ElementsAre(0, 4.4f, 4.3f, 4.2f));
}

TEST_F(RemoteTest, DropoutBackwardWorkedExampleWithTypedValues) {
  uint64_t grad = Malloc(32), mask = Malloc(16), out = Malloc(32);
  WriteValues(grad, v1::FLOAT, {0, 1, 2, 3, 4, 5, 6, 7});
  std::vector<double> mask_bytes(16, 0);
  mask_bytes[0] = 42;
  WriteValues(mask, v1::UINT8, mask_bytes);
  v1::GetWorkspaceSizeRequest request;
  request.set_session(session_);
  request.set_op("aclnnDropoutBackward");
  request.mutable_params()->set_scale(2);
  (*request.mutable_tensors())["gradOutput"] = Desc(grad, v1::FLOAT, {4, 2});
  (*request.mutable_tensors())["mask"] = Desc(mask, v1::UINT8, {16});
  (*request.mutable_tensors())["out"] = Desc(out, v1::FLOAT, {4, 2});
  v1::GetWorkspaceSizeResponse response;
  CallResult planned = GetWorkspaceSize(request, &response);
  ASSERT_TRUE(planned.status.ok()) << planned.status.error_message();
  ASSERT_TRUE(Execute(response.executor()).status.ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 8),
              ElementsAre(0, 2, 0, 6, 0, 10, 0, 0));
}

TEST_F(RemoteTest, SoftshrinkHardswishLeakyReluRunRemotely) {
  uint64_t grad = Malloc(64), self = Malloc(64), out = Malloc(64);
  // Softshrink, lambd 0.5: |x| == lambd gives 0, NaN passes the gradient.
  WriteValues(grad, v1::FLOAT, {1, 2, 3, 4, 5});
  WriteValues(self, v1::FLOAT, {0.5, -0.6, 0.1, std::nan(""), -0.5});
  v1::GetWorkspaceSizeRequest request;
  request.set_session(session_);
  request.set_op("SoftshrinkBackward");
  request.mutable_params()->set_lambd(0.5);
  (*request.mutable_tensors())["gradOutput"] = Desc(grad, v1::FLOAT, {5});
  (*request.mutable_tensors())["self"] = Desc(self, v1::FLOAT, {5});
  (*request.mutable_tensors())["gradInput"] = Desc(out, v1::FLOAT, {5});
  v1::GetWorkspaceSizeResponse response;
  ASSERT_TRUE(GetWorkspaceSize(request, &response).status.ok());
  ASSERT_TRUE(Execute(response.executor()).status.ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 5), ElementsAre(0, 2, 0, 4, 0));

  // Hardswish in FLOAT16: d(-3) = -0.5, d(3) = 1.5, d(x > 3) = 1, d(x < -3) =
  // 0.
  WriteValues(grad, v1::FLOAT16, {2, 2, 2, 2, 2});
  WriteValues(self, v1::FLOAT16, {-3, 3, 4, -4, 0});
  request.Clear();
  request.set_session(session_);
  request.set_op("HardswishBackward");
  (*request.mutable_tensors())["gradOutput"] = Desc(grad, v1::FLOAT16, {5});
  (*request.mutable_tensors())["self"] = Desc(self, v1::FLOAT16, {5});
  (*request.mutable_tensors())["out"] = Desc(out, v1::FLOAT16, {5});
  ASSERT_TRUE(GetWorkspaceSize(request, &response).status.ok());
  ASSERT_TRUE(Execute(response.executor()).status.ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT16, 5), ElementsAre(-1, 3, 2, 0, 1));

  // LeakyRelu, BF16 in, FLOAT out, slope 0.25: x = 0 takes the slope.
  WriteValues(grad, v1::BF16, {4, 4, 4});
  WriteValues(self, v1::BF16, {1, 0, -1});
  request.Clear();
  request.set_session(session_);
  request.set_op("LeakyReluBackward");
  request.mutable_params()->mutable_negative_slope()->set_dtype(v1::FLOAT);
  request.mutable_params()->mutable_negative_slope()->set_value(0.25);
  (*request.mutable_tensors())["gradOutput"] = Desc(grad, v1::BF16, {3});
  (*request.mutable_tensors())["self"] = Desc(self, v1::BF16, {3});
  (*request.mutable_tensors())["out"] = Desc(out, v1::FLOAT, {3});
  ASSERT_TRUE(GetWorkspaceSize(request, &response).status.ok());
  ASSERT_TRUE(Execute(response.executor()).status.ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 3), ElementsAre(4, 1, 1));
}

TEST_F(RemoteTest, BroadcastAndStridedViewsOfBuffers) {
  // self is a column [2,1] broadcast against a transposed gradOutput view
  // of a 3x2 row-major buffer; out is written through a strided view.
  uint64_t grad = Malloc(24), self = Malloc(8), out = Malloc(64);
  WriteValues(grad, v1::FLOAT, {1, 2, 3, 4, 5, 6});  // 3x2
  WriteValues(self, v1::FLOAT, {0, 5});
  WriteValues(out, v1::FLOAT, std::vector<double>(16, -1));
  v1::GetWorkspaceSizeRequest request;
  request.set_session(session_);
  request.set_op("ThresholdBackward");
  request.mutable_params()->set_threshold(1);
  // Transposed: shape [2,3], strides [1,2] -> rows {1,3,5}, {2,4,6}.
  (*request.mutable_tensors())["gradOutput"] =
      Desc(grad, v1::FLOAT, {2, 3}, {1, 2});
  (*request.mutable_tensors())["self"] = Desc(self, v1::FLOAT, {2, 1});
  // out: every other element of rows of 8.
  (*request.mutable_tensors())["out"] = Desc(out, v1::FLOAT, {2, 3}, {8, 2});
  v1::GetWorkspaceSizeResponse response;
  CallResult planned = GetWorkspaceSize(request, &response);
  ASSERT_TRUE(planned.status.ok()) << planned.status.error_message();
  ASSERT_TRUE(Execute(response.executor()).status.ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 16),
              ElementsAre(0, -1, 0, -1, 0, -1, -1, -1,  //
                          2, -1, 4, -1, 6, -1, -1, -1));
}

TEST_F(RemoteTest, LargeUploadAndDownloadAreByteExactAcrossChunks) {
  Options options;
  options.transfer_limits.chunk_bytes = 1 << 20;  // Many chunks.
  StartServer(options);
  const size_t size = (9 << 20) + 123;  // > 4 MiB, not a chunk multiple.
  std::string data(size, '\0');
  std::mt19937 rng(7);
  for (char& c : data) c = static_cast<char>(rng());
  uint64_t buffer = Malloc(size + 100);

  grpc::ClientContext upload_context;
  v1::UploadResponse upload_response;
  auto writer = runtime_->Upload(&upload_context, &upload_response);
  const size_t piece = 3 << 20;
  for (size_t at = 0; at < size; at += piece) {
    v1::UploadRequest chunk;
    if (at == 0) {
      chunk.set_session(session_);
      chunk.set_buffer(buffer);
      chunk.set_offset(100);
      chunk.set_size(size);
    }
    chunk.set_data(data.substr(at, piece));
    ASSERT_TRUE(writer->Write(chunk));
  }
  ASSERT_TRUE(writer->WritesDone());
  grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(upload_response.bytes_written(), size);

  grpc::ClientContext download_context;
  v1::DownloadRequest request;
  request.set_session(session_);
  request.set_buffer(buffer);
  request.set_offset(100);
  request.set_size(size);
  auto reader = runtime_->Download(&download_context, request);
  std::string back;
  v1::DownloadResponse chunk;
  int chunks = 0;
  while (reader->Read(&chunk)) {
    EXPECT_LE(chunk.data().size(), 1u << 20);
    back += chunk.data();
    ++chunks;
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(chunks, 10);
  EXPECT_TRUE(back == data) << "downloaded bytes differ";
}

TEST_F(RemoteTest, UploadErrorsAreCleanAndPrecise) {
  uint64_t buffer = Malloc(16);
  auto upload = [&](std::vector<v1::UploadRequest> messages) {
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = runtime_->Upload(&context, &response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  v1::UploadRequest header;
  header.set_session(session_);
  header.set_buffer(buffer);
  header.set_size(8);

  v1::UploadRequest short_header = header;
  short_header.set_data("1234");
  grpc::Status status = upload({short_header});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("after 4 of the 8 bytes"));

  v1::UploadRequest long_header = header;
  long_header.set_data("123456789");
  status = upload({long_header});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("more than the 8 bytes"));

  v1::UploadRequest outside = header;
  outside.set_offset(12);
  status = upload({outside});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("outside the buffer of 16"));

  v1::UploadRequest overflow = header;
  overflow.set_offset(~uint64_t{0} - 2);
  status = upload({overflow});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  status = upload({});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("before its first message"));

  v1::UploadRequest unknown = header;
  unknown.set_buffer(999);
  status = upload({unknown});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RemoteTest, DownloadAfterExecuteOnTheSameStreamSeesTheResult) {
  // A large launch followed at once by a download of its output: the
  // download must wait for the launch queued before it.
  const int64_t n = 4 << 20;
  uint64_t grad = Malloc(n * 4), self = Malloc(n * 4), out = Malloc(n * 4);
  uint64_t stream;
  {
    grpc::ClientContext context;
    v1::CreateStreamRequest request;
    request.set_session(session_);
    v1::CreateStreamResponse response;
    ASSERT_TRUE(runtime_->CreateStream(&context, request, &response).ok());
    stream = response.stream();
  }
  // Fill grad with 3.0 and self with 1.0 via uploads on the stream.
  for (auto [buffer, value] : {std::pair{grad, 3.0f}, std::pair{self, 1.0f}}) {
    std::vector<float> host(n, value);
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = runtime_->Upload(&context, &response);
    v1::UploadRequest chunk;
    chunk.set_session(session_);
    chunk.set_buffer(buffer);
    chunk.set_size(n * 4);
    chunk.set_stream(stream);
    chunk.set_data(std::string(reinterpret_cast<char*>(host.data()), n * 4));
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
  }
  uint64_t executor = PlanThreshold(grad, self, out, 0.5, n);
  ASSERT_TRUE(Execute(executor, stream).status.ok());
  grpc::ClientContext context;
  v1::DownloadRequest request;
  request.set_session(session_);
  request.set_buffer(out);
  request.set_offset((n - 4) * 4);
  request.set_size(16);
  request.set_stream(stream);
  auto reader = runtime_->Download(&context, request);
  v1::DownloadResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(chunk.data().size(), 16u);
  float tail[4];
  std::memcpy(tail, chunk.data().data(), 16);
  EXPECT_THAT(tail, ElementsAre(3, 3, 3, 3));
}

TEST_F(RemoteTest, WorkOnOneStreamRunsInIssueOrder) {
  uint64_t grad = Malloc(16), self = Malloc(16), out1 = Malloc(16),
           out2 = Malloc(16);
  WriteValues(grad, v1::FLOAT, {1, 1, 1, 1});
  WriteValues(self, v1::FLOAT, {5, 5, 5, 5});
  uint64_t first = PlanThreshold(grad, self, out1, 1);
  uint64_t second = PlanThreshold(grad, self, out2, 1);
  ASSERT_TRUE(Execute(first).status.ok());
  // Queued after the first launch, before the second.
  WriteValues(grad, v1::FLOAT, {7, 7, 7, 7});
  ASSERT_TRUE(Execute(second).status.ok());
  ASSERT_TRUE(Synchronize().ok());
  EXPECT_THAT(ReadValues(out1, v1::FLOAT, 4), ElementsAre(1, 1, 1, 1));
  EXPECT_THAT(ReadValues(out2, v1::FLOAT, 4), ElementsAre(7, 7, 7, 7));
}

TEST_F(RemoteTest, StreamsAreIndependentAndLimited) {
  Options options;
  options.session_limits.max_streams_per_session = 2;
  StartServer(options);
  std::vector<uint64_t> streams;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::CreateStreamRequest request;
    request.set_session(session_);
    v1::CreateStreamResponse response;
    grpc::Status status = runtime_->CreateStream(&context, request, &response);
    if (i < 2) {
      ASSERT_TRUE(status.ok());
      streams.push_back(response.stream());
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr("--max_streams_per_session"));
    }
  }
  uint64_t grad = Malloc(16), self = Malloc(16), a = Malloc(16), b = Malloc(16);
  WriteValues(grad, v1::FLOAT, {2, 2, 2, 2});
  WriteValues(self, v1::FLOAT, {2, 2, 2, 2});
  ASSERT_TRUE(Execute(PlanThreshold(grad, self, a, 1), streams[0]).status.ok());
  ASSERT_TRUE(Execute(PlanThreshold(grad, self, b, 1), streams[1]).status.ok());
  EXPECT_TRUE(Synchronize(streams[0]).ok());
  EXPECT_TRUE(Synchronize(streams[1]).ok());
  EXPECT_THAT(ReadValues(a, v1::FLOAT, 4, streams[0]), ElementsAre(2, 2, 2, 2));
  EXPECT_THAT(ReadValues(b, v1::FLOAT, 4, streams[1]), ElementsAre(2, 2, 2, 2));

  grpc::ClientContext context;
  v1::DestroyStreamRequest destroy;
  destroy.set_session(session_);
  destroy.set_stream(streams[0]);
  v1::DestroyStreamResponse destroyed;
  ASSERT_TRUE(runtime_->DestroyStream(&context, destroy, &destroyed).ok());
  grpc::Status status = Synchronize(streams[0]);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext context0;
  destroy.set_stream(0);
  status = runtime_->DestroyStream(&context0, destroy, &destroyed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RemoteTest, ExecutorsAreSingleUseUnlessRepeatable) {
  uint64_t grad = Malloc(16), self = Malloc(16), out = Malloc(16);
  WriteValues(grad, v1::FLOAT, {1, 2, 3, 4});
  WriteValues(self, v1::FLOAT, {1, 2, 3, 4});
  uint64_t once = PlanThreshold(grad, self, out, 2);
  ASSERT_TRUE(Execute(once).status.ok());
  CallResult again = Execute(once);
  EXPECT_EQ(again.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(again.aclnn, 561103);
  EXPECT_THAT(again.status.error_message(), HasSubstr("already consumed"));

  CallResult unknown = Execute(12345);
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.aclnn, 561103);

  uint64_t repeatable = PlanThreshold(grad, self, out, 2);
  {
    grpc::ClientContext context;
    v1::SetExecutorRepeatableRequest request;
    request.set_session(session_);
    request.set_executor(repeatable);
    v1::SetExecutorRepeatableResponse response;
    ASSERT_TRUE(ops_->SetExecutorRepeatable(&context, request, &response).ok());
  }
  for (int i = 0; i < 3; ++i) {
    WriteValues(grad, v1::FLOAT, {1.0 + i, 2, 3, 4});
    ASSERT_TRUE(Execute(repeatable).status.ok());
    EXPECT_THAT(ReadValues(out, v1::FLOAT, 4), ElementsAre(0, 0, 3, 4));
  }
  {
    grpc::ClientContext context;
    v1::DestroyExecutorRequest request;
    request.set_session(session_);
    request.set_executor(repeatable);
    v1::DestroyExecutorResponse response;
    ASSERT_TRUE(ops_->DestroyExecutor(&context, request, &response).ok());
    grpc::ClientContext context2;
    EXPECT_EQ(ops_->DestroyExecutor(&context2, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(Execute(repeatable).aclnn, 561103);
}

TEST_F(RemoteTest, ExecuteStreamAnswersEveryLaunchInOrder) {
  uint64_t grad = Malloc(16), self = Malloc(16), out = Malloc(16);
  WriteValues(grad, v1::FLOAT, {1, 2, 3, 4});
  WriteValues(self, v1::FLOAT, {1, 2, 3, 4});
  uint64_t once = PlanThreshold(grad, self, out, 2.5);
  grpc::ClientContext context;
  auto stream = ops_->ExecuteStream(&context);
  v1::ExecuteRequest request;
  request.set_session(session_);
  request.set_executor(once);
  ASSERT_TRUE(stream->Write(request));  // Launches.
  ASSERT_TRUE(stream->Write(request));  // Consumed by the first.
  request.set_executor(999);
  ASSERT_TRUE(stream->Write(request));  // Unknown.
  stream->WritesDone();
  std::vector<v1::ExecuteResponse> responses;
  v1::ExecuteResponse response;
  while (stream->Read(&response)) responses.push_back(response);
  ASSERT_TRUE(stream->Finish().ok());
  ASSERT_EQ(responses.size(), 3u);
  EXPECT_EQ(responses[0].executor(), once);
  EXPECT_EQ(responses[0].aclnn_status(), 0);
  EXPECT_EQ(responses[0].code(), 0);
  EXPECT_EQ(responses[1].aclnn_status(), 561103);
  EXPECT_EQ(responses[1].code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(responses[1].message(), HasSubstr("already consumed"));
  EXPECT_EQ(responses[2].executor(), 999u);
  EXPECT_EQ(responses[2].code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Synchronize().ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 4), ElementsAre(0, 0, 3, 4));
}

TEST_F(RemoteTest, WorkspaceTooSmallIsRejectedWithoutConsumingTheExecutor) {
  // A non-contiguous dropout mask is gathered into the workspace.
  uint64_t grad = Malloc(4 * 8), mask = Malloc(64), out = Malloc(4 * 8);
  WriteValues(grad, v1::FLOAT, {1, 1, 1, 1, 1, 1, 1, 1});
  std::vector<double> mask_bytes(32, 0);
  mask_bytes[0] = 0xFF;  // Element 0 of the strided mask view: all kept.
  WriteValues(mask, v1::UINT8, mask_bytes);
  v1::GetWorkspaceSizeRequest request;
  request.set_session(session_);
  request.set_op("DropoutBackward");
  request.mutable_params()->set_scale(2);
  (*request.mutable_tensors())["gradOutput"] = Desc(grad, v1::FLOAT, {8});
  (*request.mutable_tensors())["mask"] = Desc(mask, v1::UINT8, {16}, {2});
  (*request.mutable_tensors())["out"] = Desc(out, v1::FLOAT, {8});
  v1::GetWorkspaceSizeResponse response;
  CallResult planned = GetWorkspaceSize(request, &response);
  ASSERT_TRUE(planned.status.ok()) << planned.status.error_message();
  const uint64_t needed = response.workspace_size();
  ASSERT_GT(needed, 0u);
  uint64_t workspace = Malloc(needed);

  CallResult small = Execute(response.executor(), 0, workspace, needed - 1);
  EXPECT_EQ(small.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(small.aclnn, 161002);
  EXPECT_THAT(small.status.error_message(), HasSubstr("smaller than"));

  CallResult outside = Execute(response.executor(), 0, workspace, needed + 1);
  EXPECT_EQ(outside.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(outside.aclnn, 161002);

  CallResult ok = Execute(response.executor(), 0, workspace, needed);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_TRUE(Synchronize().ok());
  EXPECT_THAT(ReadValues(out, v1::FLOAT, 8),
              ElementsAre(2, 2, 2, 2, 2, 2, 2, 2));
}

TEST_F(RemoteTest, OperatorChecksCarryTheExactAclnnStatus) {
  uint64_t buffer = Malloc(64);
  auto plan = [&](auto edit) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(session_);
    request.set_op("ThresholdBackward");
    (*request.mutable_tensors())["gradOutput"] = Desc(buffer, v1::FLOAT, {4});
    (*request.mutable_tensors())["self"] = Desc(buffer, v1::FLOAT, {4});
    (*request.mutable_tensors())["out"] = Desc(buffer, v1::FLOAT, {4});
    edit(request);
    v1::GetWorkspaceSizeResponse response;
    return GetWorkspaceSize(request, &response);
  };
  auto tensors = [](v1::GetWorkspaceSizeRequest & r) -> auto& {
    return *r.mutable_tensors();
  };
  struct Case {
    const char* name;
    std::function<void(v1::GetWorkspaceSizeRequest&)> edit;
    grpc::StatusCode code;
    int aclnn;
    const char* message;
  } cases[] = {
      {"dtype mismatch",
       [&](auto& r) { tensors(r)["self"].set_dtype(v1::INT8); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "self"},
      {"missing out", [&](auto& r) { tensors(r).erase("out"); },
       grpc::StatusCode::INVALID_ARGUMENT, 161001, "out"},
      {"unknown argument",
       [&](auto& r) { tensors(r)["bogus"] = tensors(r)["self"]; },
       grpc::StatusCode::INVALID_ARGUMENT, 161002,
       "no tensor argument 'bogus'"},
      {"unknown op", [&](auto& r) { r.set_op("Relu"); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "unknown operator 'Relu'"},
      {"unknown dtype enum",
       [&](auto& r) {
         tensors(r)["self"].set_dtype(static_cast<v1::DataType>(99));
       },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "not an aclDataType"},
      {"negative dim", [&](auto& r) { tensors(r)["self"].set_shape(0, -1); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "self"},
      {"huge dims",
       [&](auto& r) {
         tensors(r)["self"].clear_shape();
         for (int i = 0; i < 4; ++i) tensors(r)["self"].add_shape(1ll << 40);
       },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "self"},
      {"overflowing strides",
       [&](auto& r) { tensors(r)["self"].add_strides(1ll << 62); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "self"},
      {"rank 9",
       [&](auto& r) {
         tensors(r)["self"].clear_shape();
         for (int i = 0; i < 9; ++i) tensors(r)["self"].add_shape(1);
       },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "self"},
      {"view outside its buffer",
       [&](auto& r) { tensors(r)["self"].set_shape(0, 17); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "self"},
      {"view offset outside",
       [&](auto& r) { tensors(r)["out"].set_offset(13); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "out"},
      {"buffer offset outside",
       [&](auto& r) { tensors(r)["out"].set_buffer_offset(65); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "out"},
      {"unknown buffer", [&](auto& r) { tensors(r)["out"].set_buffer(777); },
       grpc::StatusCode::NOT_FOUND, 161002, "out"},
      {"no session", [&](auto& r) { r.clear_session(); },
       grpc::StatusCode::INVALID_ARGUMENT, 161002, "session is empty"},
      {"unknown session", [&](auto& r) { r.set_session("feedface"); },
       grpc::StatusCode::NOT_FOUND, -2, "no session 'feedface'"},
  };
  for (const Case& c : cases) {
    CallResult result = plan(c.edit);
    EXPECT_EQ(result.status.error_code(), c.code) << c.name;
    if (c.aclnn != -2) {
      EXPECT_EQ(result.aclnn, c.aclnn) << c.name;
    }
    EXPECT_THAT(result.status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // Negative slope with selfIsResult, and a missing slope, which takes the
  // default ListOperators advertises (FLOAT 0.01) rather than 161001.
  CallResult slope = plan([&](auto& r) {
    r.set_op("LeakyReluBackward");
    r.mutable_params()->set_self_is_result(true);
    r.mutable_params()->mutable_negative_slope()->set_value(-0.1);
  });
  EXPECT_EQ(slope.aclnn, 161002);
  CallResult no_slope = plan([&](auto& r) { r.set_op("LeakyReluBackward"); });
  EXPECT_TRUE(no_slope.status.ok()) << no_slope.status.error_message();
}

TEST_F(RemoteTest, SessionsCannotTouchEachOthersHandles) {
  uint64_t mine = Malloc(16);
  std::string other = NewSession();
  // The other session's Free / ReadValues / descriptors see nothing.
  {
    grpc::ClientContext context;
    v1::FreeRequest request;
    request.set_session(other);
    request.set_buffer(mine);
    v1::FreeResponse response;
    EXPECT_EQ(runtime_->Free(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    v1::ReadValuesRequest request;
    request.set_session(other);
    request.set_buffer(mine);
    request.set_count(1);
    v1::ReadValuesResponse response;
    EXPECT_EQ(runtime_->ReadValues(&context, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  v1::GetWorkspaceSizeRequest request;
  request.set_session(other);
  request.set_op("HardswishBackward");
  for (const char* name : {"gradOutput", "self", "out"}) {
    (*request.mutable_tensors())[name] = Desc(mine, v1::FLOAT, {4});
  }
  v1::GetWorkspaceSizeResponse response;
  EXPECT_EQ(GetWorkspaceSize(request, &response).status.error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Still intact for its owner.
  WriteValues(mine, v1::FLOAT, {1, 2, 3, 4});
  EXPECT_THAT(ReadValues(mine, v1::FLOAT, 4), ElementsAre(1, 2, 3, 4));
}

TEST_F(RemoteTest, CloseSessionFreesEverything) {
  Malloc(1 << 20);
  Malloc(1000);
  {
    grpc::ClientContext context;
    v1::GetSessionStatsRequest request;
    request.set_session(session_);
    v1::SessionStats stats;
    ASSERT_TRUE(runtime_->GetSessionStats(&context, request, &stats).ok());
    EXPECT_EQ(stats.buffers(), 2u);
    EXPECT_EQ(stats.buffer_bytes(), (1u << 20) + 1000);
  }
  EXPECT_EQ(ServerStats().buffer_bytes(), (1u << 20) + 1000);
  grpc::ClientContext context;
  v1::CloseSessionRequest request;
  request.set_session(session_);
  v1::CloseSessionResponse response;
  ASSERT_TRUE(runtime_->CloseSession(&context, request, &response).ok());
  // CloseSession answers once everything is released: no polling needed.
  EXPECT_EQ(ServerStats().sessions(), 0u);
  EXPECT_EQ(ServerStats().buffer_bytes(), 0u);
  grpc::ClientContext again;
  EXPECT_EQ(runtime_->CloseSession(&again, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(RemoteTest, ClientDisconnectingMidUploadLeavesNothingBehind) {
  // A separate client process stand-in: its own channel, session and
  // Attach stream; it dies in the middle of an upload.
  CloseSessionOfFixture();
  auto channel = NewChannel();
  auto runtime = v1::Runtime::NewStub(channel);
  std::string session;
  {
    grpc::ClientContext context;
    v1::CreateSessionResponse response;
    ASSERT_TRUE(
        runtime->CreateSession(&context, v1::CreateSessionRequest(), &response)
            .ok());
    session = response.session();
  }
  auto attach_context = std::make_unique<grpc::ClientContext>();
  v1::AttachRequest attach;
  attach.set_session(session);
  auto events = runtime->Attach(attach_context.get(), attach);
  v1::AttachEvent event;
  ASSERT_TRUE(events->Read(&event));
  EXPECT_EQ(event.event(), "attached");
  uint64_t buffer;
  {
    grpc::ClientContext context;
    v1::MallocRequest request;
    request.set_session(session);
    request.set_size(8 << 20);
    v1::MallocResponse response;
    ASSERT_TRUE(runtime->Malloc(&context, request, &response).ok());
    buffer = response.buffer();
  }
  auto upload_context = std::make_unique<grpc::ClientContext>();
  v1::UploadResponse upload_response;
  auto writer = runtime->Upload(upload_context.get(), &upload_response);
  v1::UploadRequest chunk;
  chunk.set_session(session);
  chunk.set_buffer(buffer);
  chunk.set_size(8 << 20);
  chunk.set_data(std::string(1 << 20, 'x'));
  ASSERT_TRUE(writer->Write(chunk));
  EXPECT_GT(ServerStats().buffer_bytes(), 0u);
  // The client dies: every call it had open is cancelled.
  upload_context->TryCancel();
  attach_context->TryCancel();
  writer->Finish().IgnoreError();
  while (events->Read(&event)) {
  }
  events->Finish().IgnoreError();
  EXPECT_TRUE(WaitForEmptyServer());
}

TEST_F(RemoteTest, ClientDisconnectingMidDownloadLeavesNothingBehind) {
  CloseSessionOfFixture();
  auto channel = NewChannel();
  auto runtime = v1::Runtime::NewStub(channel);
  std::string session;
  {
    grpc::ClientContext context;
    v1::CreateSessionResponse response;
    ASSERT_TRUE(
        runtime->CreateSession(&context, v1::CreateSessionRequest(), &response)
            .ok());
    session = response.session();
  }
  grpc::ClientContext attach_context;
  v1::AttachRequest attach;
  attach.set_session(session);
  auto events = runtime->Attach(&attach_context, attach);
  v1::AttachEvent event;
  ASSERT_TRUE(events->Read(&event));
  uint64_t buffer;
  {
    grpc::ClientContext context;
    v1::MallocRequest request;
    request.set_session(session);
    request.set_size(64 << 20);
    v1::MallocResponse response;
    ASSERT_TRUE(runtime->Malloc(&context, request, &response).ok());
    buffer = response.buffer();
  }
  grpc::ClientContext download_context;
  v1::DownloadRequest request;
  request.set_session(session);
  request.set_buffer(buffer);
  request.set_size(64 << 20);
  auto reader = runtime->Download(&download_context, request);
  v1::DownloadResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  download_context.TryCancel();
  attach_context.TryCancel();
  while (reader->Read(&chunk)) {
  }
  reader->Finish().IgnoreError();
  while (events->Read(&event)) {
  }
  events->Finish().IgnoreError();
  EXPECT_TRUE(WaitForEmptyServer());
}

TEST_F(RemoteTest, IdleSessionsTimeOut) {
  Options options;
  options.session_limits.idle_timeout = absl::Milliseconds(300);
  StartServer(options);
  Malloc(4096);
  EXPECT_TRUE(WaitForEmptyServer());
  grpc::ClientContext context;
  v1::MallocRequest request;
  request.set_session(session_);
  request.set_size(1);
  v1::MallocResponse response;
  grpc::Status status = runtime_->Malloc(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("timed out"));
}

TEST_F(RemoteTest, LimitsAreResourceExhaustedNeverAborts) {
  Options options;
  options.session_limits.session_memory_bytes = 1 << 20;
  options.session_limits.max_sessions = 2;
  options.session_limits.max_handles_per_session = 3;
  options.transfer_limits.max_values = 8;
  StartServer(options);
  auto malloc = [&](uint64_t size) {
    grpc::ClientContext context;
    v1::MallocRequest request;
    request.set_session(session_);
    request.set_size(size);
    v1::MallocResponse response;
    return runtime_->Malloc(&context, request, &response);
  };
  grpc::Status status = malloc((1 << 20) + 1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--session_memory_bytes"));
  status = malloc(~uint64_t{0});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(malloc(1).ok());
  ASSERT_TRUE(malloc(1).ok());
  ASSERT_TRUE(malloc(1).ok());
  status = malloc(1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_handles_per_session"));

  NewSession();
  grpc::ClientContext context;
  v1::CreateSessionResponse response;
  status =
      runtime_->CreateSession(&context, v1::CreateSessionRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_sessions"));

  grpc::ClientContext values_context;
  v1::ReadValuesRequest read;
  read.set_session(session_);
  read.set_buffer(1);
  read.set_count(9);
  v1::ReadValuesResponse values;
  EXPECT_EQ(runtime_->ReadValues(&values_context, read, &values).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(RemoteTest, OversizedMessageIsResourceExhausted) {
  Options options;
  options.transfer_limits.max_message_bytes = 1 << 20;
  options.transfer_limits.chunk_bytes = 1 << 19;
  StartServer(options);
  uint64_t buffer = Malloc(4 << 20);
  grpc::ClientContext context;
  v1::UploadResponse response;
  auto writer = runtime_->Upload(&context, &response);
  v1::UploadRequest chunk;
  chunk.set_session(session_);
  chunk.set_buffer(buffer);
  chunk.set_size(2 << 20);
  chunk.set_data(std::string(2 << 20, 'x'));
  writer->Write(chunk);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The server is unharmed.
  WriteValues(buffer, v1::FLOAT, {1});
  EXPECT_THAT(ReadValues(buffer, v1::FLOAT, 1), ElementsAre(1));
}

TEST_F(RemoteTest, EvaluateRunsAnOperatorOnLiteralNumbers) {
  grpc::ClientContext context;
  v1::EvaluateRequest request;
  request.set_op("ThresholdBackward");
  request.mutable_params()->set_threshold(1);
  auto& inputs = *request.mutable_inputs();
  inputs["gradOutput"].set_dtype(v1::FLOAT);
  inputs["gradOutput"].add_shape(4);
  for (double v : {4.5, 4.4, 4.3, 4.2}) inputs["gradOutput"].add_values(v);
  inputs["self"].set_dtype(v1::FLOAT);
  inputs["self"].add_shape(4);
  for (double v : {0.2, 1.2, 2.2, 3.2}) inputs["self"].add_values(v);
  request.mutable_output()->set_dtype(v1::FLOAT);
  request.mutable_output()->add_shape(4);
  v1::EvaluateResponse response;
  grpc::Status status = ops_->Evaluate(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(response.output().values(), ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_THAT(response.output().shape(), ElementsAre(4));

  grpc::ClientContext bad_context;
  inputs["self"].add_values(9);
  status = ops_->Evaluate(&bad_context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(AclnnStatusOf(bad_context), 161002);
  EXPECT_THAT(status.error_message(), HasSubstr("5 values"));
}

TEST_F(RemoteTest, ListOperatorsComesFromTheKernelTable) {
  grpc::ClientContext context;
  v1::ListOperatorsResponse response;
  ASSERT_TRUE(
      ops_->ListOperators(&context, v1::ListOperatorsRequest(), &response)
          .ok());
  std::vector<std::string> names;
  for (const auto& op : response.operators()) names.push_back(op.name());
  EXPECT_THAT(names, ElementsAre("ThresholdBackward", "SoftshrinkBackward",
                                 "HardswishBackward", "LeakyReluBackward",
                                 "DropoutBackward"));
  const auto& leaky = response.operators(3);
  EXPECT_EQ(leaky.aclnn_name(), "aclnnLeakyReluBackward");
  std::vector<std::string> params;
  for (const auto& p : leaky.params()) params.push_back(p.name());
  EXPECT_THAT(params, ElementsAre("negative_slope", "self_is_result"));
  // Defaults, for callers such as opctl run that were given no value.
  ASSERT_TRUE(leaky.params(0).has_default_value());
  EXPECT_EQ(leaky.params(0).default_value(), 0.01);
  EXPECT_EQ(leaky.params(0).dtypes(0), v1::DataType::FLOAT);
  ASSERT_TRUE(leaky.params(1).has_default_value());
  EXPECT_EQ(leaky.params(1).default_value(), 0);
  EXPECT_EQ(leaky.params(1).dtypes_size(), 0);
  for (const auto& op : response.operators()) {
    for (const auto& p : op.params()) {
      EXPECT_TRUE(p.has_default_value()) << op.name() << " " << p.name();
    }
  }
  EXPECT_EQ(response.operators(1).params(0).default_value(), 0.5);
  EXPECT_EQ(response.operators(4).params(0).default_value(), 2);
}

}  // namespace
}  // namespace opserver
