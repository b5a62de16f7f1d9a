// Hostile and greedy clients against a real Server: each test reproduces a
// way a client once could hurt the server or other sessions, and checks
// that it is refused cleanly and costs other sessions nothing.
//
// "Finding N" is finding N of the first security review,
// docs/reviews/security-review-1.md (findings 12-17 are in its "Lower
// severity" section).

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"
#include "proto/opserver.pb.h"
#include "server/server.h"
#include "testing/metrics_scrape.h"
#include "tests/tensor_desc.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Result {
  grpc::Status status;
  int aclnn = -1;  // From the trailing metadata; -1 when absent.
};

class HardeningTest : public ::testing::Test {
 protected:
  void Start(Options options) {
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel(server_->address(),
                                       grpc::InsecureChannelCredentials());
    runtime_ = v1::Runtime::NewStub(channel);
    ops_ = v1::Operators::NewStub(channel);
  }

  // Runs one call with a deadline, collecting the aclnn status.
  Result Rpc(const std::function<grpc::Status(grpc::ClientContext*)>& call,
             absl::Duration deadline = absl::Seconds(30)) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    Result result;
    result.status = call(&context);
    const auto& trailers = context.GetServerTrailingMetadata();
    auto it = trailers.find("opserver-aclnn-status");
    if (it != trailers.end()) {
      result.aclnn =
          std::stoi(std::string(it->second.data(), it->second.size()));
    }
    return result;
  }

  std::string NewSession() {
    v1::CreateSessionRequest request;
    request.set_client_name("hardening_test");
    v1::CreateSessionResponse response;
    Result r = Rpc([&](auto* c) {
      return runtime_->CreateSession(c, request, &response);
    });
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return response.session();
  }

  // A Malloc clears its block: gigabytes take tens of seconds on a loaded
  // machine, hence the long deadline (a bound, not a timing assumption).
  Result Malloc(const std::string& session, uint64_t size,
                uint64_t* buffer = nullptr) {
    v1::MallocRequest request;
    request.set_session(session);
    request.set_size(size);
    v1::MallocResponse response;
    Result r = Rpc(
        [&](auto* c) { return runtime_->Malloc(c, request, &response); },
        absl::Minutes(5));
    if (buffer != nullptr) *buffer = response.buffer();
    return r;
  }

  uint64_t MustMalloc(const std::string& session, uint64_t size) {
    uint64_t buffer = 0;
    Result r = Malloc(session, size, &buffer);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return buffer;
  }

  Result Free(const std::string& session, uint64_t buffer) {
    v1::FreeRequest request;
    request.set_session(session);
    request.set_buffer(buffer);
    v1::FreeResponse response;
    return Rpc([&](auto* c) { return runtime_->Free(c, request, &response); });
  }

  void WriteValues(const std::string& session, uint64_t buffer,
                   const std::vector<double>& values) {
    v1::WriteValuesRequest request;
    request.set_session(session);
    request.set_buffer(buffer);
    request.set_dtype(v1::FLOAT);
    for (double v : values) request.add_values(v);
    v1::WriteValuesResponse response;
    Result r = Rpc(
        [&](auto* c) { return runtime_->WriteValues(c, request, &response); });
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  }

  std::vector<double> ReadValues(const std::string& session, uint64_t buffer,
                                 uint64_t count) {
    v1::ReadValuesRequest request;
    request.set_session(session);
    request.set_buffer(buffer);
    request.set_dtype(v1::FLOAT);
    request.set_count(count);
    v1::ReadValuesResponse response;
    Result r = Rpc(
        [&](auto* c) { return runtime_->ReadValues(c, request, &response); });
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return {response.values().begin(), response.values().end()};
  }

  // ThresholdBackward with the same descriptor for all three tensors.
  Result PlanThreshold(const std::string& session, const v1::TensorDesc& desc,
                       uint64_t* executor = nullptr) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(session);
    request.set_op("ThresholdBackward");
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = desc;
    }
    v1::GetWorkspaceSizeResponse response;
    Result r = Rpc(
        [&](auto* c) { return ops_->GetWorkspaceSize(c, request, &response); });
    if (executor != nullptr) *executor = response.executor();
    return r;
  }

  uint64_t MustPlanThreshold(const std::string& session,
                             const v1::TensorDesc& desc) {
    uint64_t executor = 0;
    Result r = PlanThreshold(session, desc, &executor);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return executor;
  }

  // ThresholdBackward (threshold 0): out = self > 0 ? gradOutput : 0.
  uint64_t MustPlanThreshold(const std::string& session,
                             const v1::TensorDesc& grad,
                             const v1::TensorDesc& self,
                             const v1::TensorDesc& out) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(session);
    request.set_op("ThresholdBackward");
    (*request.mutable_tensors())["gradOutput"] = grad;
    (*request.mutable_tensors())["self"] = self;
    (*request.mutable_tensors())["out"] = out;
    v1::GetWorkspaceSizeResponse response;
    Result r = Rpc(
        [&](auto* c) { return ops_->GetWorkspaceSize(c, request, &response); });
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return response.executor();
  }

  Result SetRepeatable(const std::string& session, uint64_t executor) {
    v1::SetExecutorRepeatableRequest request;
    request.set_session(session);
    request.set_executor(executor);
    v1::SetExecutorRepeatableResponse response;
    return Rpc([&](auto* c) {
      return ops_->SetExecutorRepeatable(c, request, &response);
    });
  }

  Result DestroyExecutor(const std::string& session, uint64_t executor) {
    v1::DestroyExecutorRequest request;
    request.set_session(session);
    request.set_executor(executor);
    v1::DestroyExecutorResponse response;
    return Rpc(
        [&](auto* c) { return ops_->DestroyExecutor(c, request, &response); });
  }

  Result Execute(const std::string& session, uint64_t executor,
                 uint64_t stream = 0) {
    v1::ExecuteRequest request;
    request.set_session(session);
    request.set_executor(executor);
    request.set_stream(stream);
    v1::ExecuteResponse response;
    return Rpc([&](auto* c) { return ops_->Execute(c, request, &response); });
  }

  Result Synchronize(const std::string& session, uint64_t stream = 0,
                     absl::Duration deadline = absl::Seconds(30)) {
    v1::SynchronizeStreamRequest request;
    request.set_session(session);
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    return Rpc(
        [&](auto* c) {
          return runtime_->SynchronizeStream(c, request, &response);
        },
        deadline);
  }

  Result CreateStream(const std::string& session, uint64_t* stream) {
    v1::CreateStreamRequest request;
    request.set_session(session);
    v1::CreateStreamResponse response;
    Result r = Rpc(
        [&](auto* c) { return runtime_->CreateStream(c, request, &response); });
    *stream = response.stream();
    return r;
  }

  Result DestroyStream(const std::string& session, uint64_t stream,
                       absl::Duration deadline = absl::Seconds(30)) {
    v1::DestroyStreamRequest request;
    request.set_session(session);
    request.set_stream(stream);
    v1::DestroyStreamResponse response;
    return Rpc(
        [&](auto* c) { return runtime_->DestroyStream(c, request, &response); },
        deadline);
  }

  Result CloseSession(const std::string& session,
                      absl::Duration deadline = absl::Seconds(30)) {
    v1::CloseSessionRequest request;
    request.set_session(session);
    v1::CloseSessionResponse response;
    return Rpc(
        [&](auto* c) { return runtime_->CloseSession(c, request, &response); },
        deadline);
  }

  // Queues `count` launches of a repeatable ThresholdBackward over `elements`
  // floats in place (5-10 ms each at 2^26 on 2 cores) on `stream`.
  void QueueSlowWork(const std::string& session, int64_t elements, int count,
                     uint64_t stream = 0) {
    uint64_t buffer = MustMalloc(session, elements * 4);
    uint64_t executor =
        MustPlanThreshold(session, Desc(buffer, v1::FLOAT, {elements}));
    ASSERT_TRUE(SetRepeatable(session, executor).status.ok());
    for (int i = 0; i < count; ++i) {
      Result r = Execute(session, executor, stream);
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    }
  }

  // Waits (a bounded while) until `stream` of `session` holds work, e.g. a
  // transfer that has reached it. Looks inside the server: the client has no
  // way to see when the server has taken an upload's header.
  void WaitUntilStreamBusy(const std::string& session, uint64_t stream = 0) {
    for (int i = 0; i < 12000; ++i) {
      auto found = server_->sessions().Get(session, "anonymous");
      ASSERT_TRUE(found.ok()) << found.status();
      auto queue = (*found)->GetStream(stream);
      ASSERT_TRUE(queue.ok()) << queue.status();
      if ((*queue)->busy()) return;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  v1::SessionStats SessionStats(const std::string& session) {
    v1::GetSessionStatsRequest request;
    request.set_session(session);
    v1::SessionStats stats;
    Result r = Rpc(
        [&](auto* c) { return runtime_->GetSessionStats(c, request, &stats); });
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return stats;
  }

  // Polls GetSessionStats until `done` holds, for at most 30 s (a bounded
  // wait, not a timing assertion); false if it never did.
  bool StatsEventually(
      const std::string& session,
      const std::function<bool(const v1::SessionStats&)>& done) {
    for (int i = 0; i < 3000; ++i) {
      if (done(SessionStats(session))) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  uint64_t CreateEvent(const std::string& session) {
    v1::CreateEventRequest request;
    request.set_session(session);
    v1::CreateEventResponse response;
    Result r = Rpc(
        [&](auto* c) { return runtime_->CreateEvent(c, request, &response); });
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return response.event();
  }

  void RecordEvent(const std::string& session, uint64_t event,
                   uint64_t stream) {
    v1::RecordEventRequest request;
    request.set_session(session);
    request.set_event(event);
    request.set_stream(stream);
    v1::RecordEventResponse response;
    Result r = Rpc(
        [&](auto* c) { return runtime_->RecordEvent(c, request, &response); });
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }

  Result SynchronizeEvent(const std::string& session, uint64_t event,
                          absl::Duration deadline) {
    v1::SynchronizeEventRequest request;
    request.set_session(session);
    request.set_event(event);
    v1::SynchronizeEventResponse response;
    return Rpc(
        [&](auto* c) {
          return runtime_->SynchronizeEvent(c, request, &response);
        },
        deadline);
  }

  // Polls GetServerStats until no buffer memory is held (a bounded while);
  // returns the last figure.
  uint64_t WaitForNoBufferBytes() {
    uint64_t bytes = 1;
    for (int i = 0; i < 6000 && bytes != 0; ++i) {
      v1::ServerStats stats;
      EXPECT_TRUE(Rpc([&](auto* c) {
                    return runtime_->GetServerStats(
                        c, v1::GetServerStatsRequest(), &stats);
                  }).status.ok());
      bytes = stats.buffer_bytes();
      if (bytes != 0) absl::SleepFor(absl::Milliseconds(10));
    }
    return bytes;
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<v1::Runtime::Stub> runtime_;
  std::unique_ptr<v1::Operators::Stub> ops_;
};

// Sends `messages` as they are (raw bytes, no protobuf encoding on this side)
// on one Upload call and returns how the server ended it.
grpc::Status RawUpload(const std::shared_ptr<grpc::Channel>& channel,
                       const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto call = stub.PrepareCall(&context, "/opserver.v1.Runtime/Upload", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  bool writable = cq.Next(&tag, &ok) && ok;
  for (const std::string& bytes : messages) {
    if (!writable) break;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    writable = cq.Next(&tag, &ok) && ok;
  }
  if (writable) {
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
  }
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// One Upload call driven by hand: messages go out one at a time, so a test
// can stop after the header (a stalled client) and go on later.
class PausedUpload {
 public:
  explicit PausedUpload(const std::shared_ptr<grpc::Channel>& channel)
      : stub_(channel) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    call_ = stub_.PrepareCall(&context_, "/opserver.v1.Runtime/Upload", &cq_);
    call_->StartCall(Tag(1));
    writable_ = Next();
  }
  ~PausedUpload() {
    if (!finished_) {
      context_.TryCancel();
      Finish();
    }
  }

  // False once the call is broken (the server ended it).
  bool Send(const std::string& bytes) {
    if (!writable_) return false;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    call_->Write(buffer, Tag(2));
    writable_ = Next();
    return writable_;
  }

  // Half-closes (when still writable, unless told not to: a stalled client)
  // and waits for the server's status.
  grpc::Status Finish(bool half_close = true) {
    void* tag;
    bool ok;
    if (writable_ && half_close) {
      call_->WritesDone(Tag(3));
      Next();
    }
    grpc::ByteBuffer reply;
    call_->Read(&reply, Tag(4));
    Next();
    grpc::Status status;
    call_->Finish(&status, Tag(5));
    Next();
    cq_.Shutdown();
    while (cq_.Next(&tag, &ok)) {
    }
    finished_ = true;
    return status;
  }

 private:
  static void* Tag(intptr_t n) { return reinterpret_cast<void*>(n); }
  bool Next() {
    void* tag;
    bool ok = false;
    return cq_.Next(&tag, &ok) && ok;
  }

  grpc::GenericStub stub_;
  grpc::CompletionQueue cq_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool writable_ = false;
  bool finished_ = false;
};

std::string FloatBytes(int count, float value) {
  std::string bytes(count * sizeof(float), '\0');
  for (int i = 0; i < count; ++i) {
    std::memcpy(&bytes[i * sizeof(float)], &value, sizeof(float));
  }
  return bytes;
}

// Finding 1: a data length of 2^31 in an Upload's second message crashed the
// server (a negative int reached protobuf's ReadRaw). Lengths longer than
// what is left in the message are refused, whatever their size.
TEST_F(HardeningTest, UploadLengthsBeyondTheMessageAreRefused) {
  Options options;
  options.device_memory_bytes = uint64_t{3} << 30;
  Start(options);
  const std::string session = NewSession();
  const uint64_t size = (uint64_t{1} << 31) + 16;
  const uint64_t buffer = MustMalloc(session, size);
  v1::UploadRequest header;
  header.set_session(session);
  header.set_buffer(buffer);
  header.set_size(size);
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  // Field 6 (data), length-delimited, length 2^31, then 1 byte.
  const std::string two_gib("\x32\x80\x80\x80\x80\x08\x78", 7);
  // Field 6, length 100, then 1 byte: short, and small enough for an int.
  const std::string short_by_99("\x32\x64\x78", 3);
  // Field 6, length 2^32 - 1 (the largest varint32).
  const std::string max_u32("\x32\xff\xff\xff\xff\x0f\x78", 7);
  for (const std::string& data : {two_gib, short_by_99, max_u32}) {
    grpc::Status status =
        RawUpload(channel, {header.SerializeAsString(), data});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("malformed UploadRequest"));
  }
  // The same lengths in the first message (the header pass) too.
  grpc::Status status =
      RawUpload(channel, {header.SerializeAsString() + two_gib});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  // A well-formed raw upload still works, and the server serves others.
  v1::UploadRequest small = header;
  small.set_size(4);
  v1::UploadRequest data;
  data.set_data(std::string("\x00\x00\x80\x3f", 4));  // 1.0f
  status =
      RawUpload(channel, {small.SerializeAsString(), data.SerializeAsString()});
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(ReadValues(session, buffer, 1), ElementsAre(1.0));
  EXPECT_FALSE(NewSession().empty());
}

// Finding 3: a freed buffer's bytes never reach another session.
TEST_F(HardeningTest, ReusedMemoryShowsAnotherSessionZeros) {
  Start(Options());
  std::string a = NewSession(), b = NewSession();
  uint64_t secret = MustMalloc(a, 65536);
  WriteValues(a, secret, {1234.5, 6789.25, 42, 42});
  ASSERT_TRUE(Free(a, secret).status.ok());
  uint64_t snoop = MustMalloc(b, 65536);
  EXPECT_THAT(ReadValues(b, snoop, 4), ElementsAre(0, 0, 0, 0));
  // Same through a closed session's memory.
  uint64_t again = MustMalloc(a, 1 << 20);
  WriteValues(a, again, {7, 8, 9});
  ASSERT_TRUE(CloseSession(a).status.ok());
  uint64_t snoop2 = MustMalloc(b, 1 << 20);
  EXPECT_THAT(ReadValues(b, snoop2, 3), ElementsAre(0, 0, 0));
}

// Finding 5: --device_memory_bytes bounds the sum over all sessions;
// beyond it Malloc is RESOURCE_EXHAUSTED and other sessions keep working.
TEST_F(HardeningTest, DeviceMemoryIsARealCapacity) {
  Options options;
  options.device_memory_bytes = 64 << 20;
  Start(options);
  std::string a = NewSession(), b = NewSession();
  uint64_t big = MustMalloc(a, 48 << 20);
  Result refused = Malloc(b, 32 << 20);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("--device_memory_bytes"));
  uint64_t small = MustMalloc(b, 1 << 20);
  WriteValues(b, small, {1, 2});
  EXPECT_THAT(ReadValues(b, small, 2), ElementsAre(1, 2));
  ASSERT_TRUE(Free(a, big).status.ok());
  EXPECT_TRUE(Malloc(b, 32 << 20).status.ok());
  // GetDeviceInfo reports the capacity.
  v1::GetDeviceInfoResponse info;
  ASSERT_TRUE(Rpc([&](auto* c) {
                return runtime_->GetDeviceInfo(c, v1::GetDeviceInfoRequest(),
                                               &info);
              }).status.ok());
  EXPECT_EQ(info.memory_bytes(), uint64_t{64} << 20);
}

// Finding 5(b): freeing a handle that an executor still uses does not give
// the session its memory back until the executor is gone.
TEST_F(HardeningTest, FreedButReferencedMemoryStillCounts) {
  Options options;
  options.session_limits.session_memory_bytes = 1 << 20;
  Start(options);
  std::string s = NewSession();
  uint64_t buffer = MustMalloc(s, 1 << 20);
  uint64_t executor =
      MustPlanThreshold(s, Desc(buffer, v1::FLOAT, {(1 << 20) / 4}));
  ASSERT_TRUE(Free(s, buffer).status.ok());
  Result refused = Malloc(s, 1 << 20);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(DestroyExecutor(s, executor).status.ok());
  EXPECT_TRUE(Malloc(s, 1 << 20).status.ok());
}

// Finding 13: Malloc(0) holds a page and is charged one.
TEST_F(HardeningTest, TinyBuffersAreChargedWhatTheyHold) {
  Options options;
  options.session_limits.session_memory_bytes = 16 * 4096;
  Start(options);
  std::string s = NewSession();
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(Malloc(s, i % 2).status.ok()) << i;
  EXPECT_EQ(Malloc(s, 0).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// Finding 2: a few bytes may not describe 2^34..2^62 elements of output.
TEST_F(HardeningTest, HugeStrideZeroViewsAreRefused) {
  Start(Options());
  std::string s = NewSession();
  uint64_t buffer = MustMalloc(s, 4096);
  for (int64_t n : {int64_t{17179869184}, int64_t{1099511627776},
                    int64_t{4611686018427387904}}) {
    Result r = PlanThreshold(s, Desc(buffer, v1::INT8, {n}, {0}));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << n;
    EXPECT_EQ(r.aclnn, 161002) << n;
    EXPECT_THAT(r.status.error_message(), HasSubstr("overlap")) << n;
  }
}

// Finding 2: --max_launch_elements caps one launch's work.
TEST_F(HardeningTest, LaunchesAreCappedByMaxLaunchElements) {
  Options options;
  options.session_limits.max_launch_elements = 1000;
  Start(options);
  std::string s = NewSession();
  uint64_t buffer = MustMalloc(s, 8192);
  EXPECT_TRUE(PlanThreshold(s, Desc(buffer, v1::FLOAT, {1000})).status.ok());
  Result r = PlanThreshold(s, Desc(buffer, v1::FLOAT, {1001}));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.aclnn, 161002);
  EXPECT_THAT(r.status.error_message(), HasSubstr("--max_launch_elements"));
}

// Findings 2 and 7: closing a session drops its queued work, so neither its
// own CloseSession nor another session's waits for that queue.
TEST_F(HardeningTest, ClosingASessionCancelsItsQueuedWork) {
  Start(Options());
  std::string busy = NewSession(), other = NewSession();
  // 2000 launches over 256 MiB: 10 s or more of queued work.
  QueueSlowWork(busy, int64_t{1} << 26, 2000);
  Result closed = CloseSession(busy, absl::Seconds(3));
  EXPECT_TRUE(closed.status.ok()) << closed.status.error_message();
  Result other_closed = CloseSession(other, absl::Seconds(3));
  EXPECT_TRUE(other_closed.status.ok()) << other_closed.status.error_message();
}

// Finding 2: SIGTERM's path (Server::Shutdown and destruction) ends in time
// whatever is queued.
TEST_F(HardeningTest, ShutdownDoesNotRunQueuedWork) {
  Start(Options());
  std::string s = NewSession();
  // 3000 launches over 256 MiB: 15 s or more of queued work.
  QueueSlowWork(s, int64_t{1} << 26, 3000);
  const absl::Time start = absl::Now();
  server_.reset();
  // Within the default shutdown grace, not after the queue.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Findings 6 and 7: a stream's queue is bounded, a refused launch does not
// consume its executor, and destroyed streams count until their thread ends.
TEST_F(HardeningTest, StreamQueuesAreBounded) {
  Options options;
  options.session_limits.max_queued_per_stream = 4;
  Start(options);
  std::string s = NewSession();
  uint64_t buffer = MustMalloc(s, (1 << 24) * 4);
  uint64_t slow =
      MustPlanThreshold(s, Desc(buffer, v1::FLOAT, {int64_t{1} << 24}));
  ASSERT_TRUE(SetRepeatable(s, slow).status.ok());
  int refused = 0;
  for (int i = 0; i < 12; ++i) {
    Result r = Execute(s, slow);
    if (!r.status.ok()) {
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(r.status.error_message(),
                  HasSubstr("--max_queued_per_stream"));
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  // A single-use executor refused for a full queue is still there.
  uint64_t tiny = MustMalloc(s, 16);
  uint64_t once = MustPlanThreshold(s, Desc(tiny, v1::FLOAT, {4}));
  Result full = Execute(s, once);
  ASSERT_TRUE(Synchronize(s).status.ok());
  if (!full.status.ok()) {
    EXPECT_TRUE(Execute(s, once).status.ok());
  }
}

TEST_F(HardeningTest, DestroyedStreamsCountUntilTheirWorkEnds) {
  Options options;
  options.session_limits.max_streams_per_session = 1;
  Start(options);
  std::string s = NewSession();
  uint64_t stream = 0;
  ASSERT_TRUE(CreateStream(s, &stream).status.ok());
  QueueSlowWork(s, int64_t{1} << 24, 20, stream);
  // The client gives up at once; the stream's queued work is dropped, and
  // its running launch still holds a thread that counts.
  DestroyStream(s, stream, absl::Milliseconds(1));
  uint64_t next = 0;
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    Result r = CreateStream(s, &next);
    if (r.status.ok()) break;
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    ++refused;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(next, 0u) << "the destroyed stream's thread never ended";
  // Never more than the limit at once.
  uint64_t third = 0;
  EXPECT_EQ(CreateStream(s, &third).status.error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

// Once DestroyStream has answered, the stream's slot is free: a CreateStream
// sent right after is not refused for it. Before, the reply came when the
// stream's work had ended but its thread still counted until the reaper had
// destroyed it, and the client library's split transfers (which destroy
// their streams and may create others at once) saw RESOURCE_EXHAUSTED near
// the cap.
TEST_F(HardeningTest, DestroyedStreamsSlotIsFreeWhenDestroyStreamReturns) {
  Options options;
  options.session_limits.max_streams_per_session = 1;
  Start(options);
  std::string s = NewSession();
  for (int i = 0; i < 300; ++i) {
    uint64_t stream = 0;
    Result created = CreateStream(s, &stream);
    ASSERT_TRUE(created.status.ok())
        << "round " << i << ": " << created.status.error_message();
    if (i % 3 == 0) {
      // With work that ends before the reply, too.
      QueueSlowWork(s, 1 << 10, 2, stream);
    }
    Result destroyed = DestroyStream(s, stream);
    ASSERT_TRUE(destroyed.status.ok())
        << "round " << i << ": " << destroyed.status.error_message();
  }
}

// Found by the soak (bench/soak.cc, RELIABILITY.md): with reading paused at
// --max_pending_replies, a finished reply write resumed reading and, while
// its lock was let go for StartRead, the launch that read brought in could
// start the next reply write; the resuming side then started that write a
// second time and gRPC aborted the server (GRPC_CALL_ERROR_TOO_MANY_
// OPERATIONS). One pending reply at most makes every write resume reading:
// pipelines of many launches, read as fast as they come, all answered.
TEST_F(HardeningTest, Soak_ExecuteStreamResumingReadsStartsOneWriteAtATime) {
  Options options;
  options.session_limits.max_pending_replies = 1;
  Start(options);
  const std::string s = NewSession();
  const uint64_t buffer = MustMalloc(s, 64);
  const uint64_t executor = MustPlanThreshold(s, Desc(buffer, v1::FLOAT, {16}));
  ASSERT_TRUE(SetRepeatable(s, executor).status.ok());
  constexpr int kCalls = 8, kLaunches = 3000;
  std::vector<std::thread> calls;
  std::atomic<int> answered{0};
  for (int c = 0; c < kCalls; ++c) {
    calls.emplace_back([&] {
      grpc::ClientContext context;
      context.set_deadline(
          absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      auto stream = ops_->ExecuteStream(&context);
      std::thread writer([&] {
        v1::ExecuteRequest request;
        request.set_session(s);
        request.set_executor(executor);
        for (int i = 0; i < kLaunches && stream->Write(request); ++i) {
        }
        stream->WritesDone();
      });
      v1::ExecuteResponse response;
      int replies = 0;
      while (stream->Read(&response)) {
        EXPECT_EQ(response.code(), 0) << response.message();
        ++replies;
      }
      writer.join();
      grpc::Status status = stream->Finish();
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(replies, kLaunches);
      answered += replies;
    });
  }
  for (std::thread& t : calls) t.join();
  EXPECT_EQ(answered.load(), kCalls * kLaunches);
  EXPECT_TRUE(Synchronize(s).status.ok());
}

// Finding 9: what a client sends is bounded and escaped in replies and logs.
TEST_F(HardeningTest, EchoedClientStringsAreBounded) {
  Start(Options());
  Result r = Malloc(std::string(8 << 20, 'x'), 16);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LT(r.status.error_message().size(), 512u);
  EXPECT_THAT(r.status.error_message(), HasSubstr("of 8388608 bytes"));
  v1::CreateSessionRequest request;
  request.set_client_name(std::string(300, 'n'));
  v1::CreateSessionResponse response;
  Result named = Rpc(
      [&](auto* c) { return runtime_->CreateSession(c, request, &response); });
  EXPECT_EQ(named.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(named.status.error_message(), HasSubstr("at most 256"));
}

// Finding 11: Evaluate (no session needed) cannot occupy every RPC thread.
TEST_F(HardeningTest, ConcurrentEvaluatesAreBounded) {
  Options options;
  options.session_limits.max_concurrent_evaluates = 1;
  Start(options);
  // 32 concurrent calls of 2^20 elements: some are refused, none crash, and
  // the ones admitted are right.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0}, refused{0};
  v1::EvaluateRequest request;
  request.set_op("HardswishBackward");
  for (const char* name : {"gradOutput", "self"}) {
    v1::ValueTensor& t = (*request.mutable_inputs())[name];
    t.set_dtype(v1::FLOAT);
    t.add_shape(1 << 18);
    for (int i = 0; i < (1 << 18); ++i) t.add_values(1);
  }
  request.mutable_output()->set_dtype(v1::FLOAT);
  request.mutable_output()->add_shape(1 << 18);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 4; ++j) {
        v1::EvaluateResponse response;
        Result r =
            Rpc([&](auto* c) { return ops_->Evaluate(c, request, &response); });
        if (r.status.ok()) {
          ++ok;
          EXPECT_FLOAT_EQ(response.output().values(7), 1.0f / 3 + 0.5f);
        } else {
          EXPECT_EQ(r.status.error_code(),
                    grpc::StatusCode::RESOURCE_EXHAUSTED);
          ++refused;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(ok.load() + refused.load(), 32);
}

// Finding 8: CloseSession ends the session's Attach calls, so they do not
// keep its memory alive after it was closed.
TEST_F(HardeningTest, CloseSessionEndsItsAttachCalls) {
  Start(Options());
  std::string s = NewSession();
  grpc::ClientContext attach_context;
  v1::AttachRequest attach_request;
  attach_request.set_session(s);
  auto attach = runtime_->Attach(&attach_context, attach_request);
  v1::AttachEvent event;
  ASSERT_TRUE(attach->Read(&event));
  EXPECT_EQ(event.event(), "attached");
  MustMalloc(s, 1 << 20);
  ASSERT_TRUE(CloseSession(s).status.ok());
  // The Attach call is told and ends...
  bool closed_event = false;
  while (attach->Read(&event)) {
    closed_event |= event.event() == "session closed by CloseSession";
  }
  EXPECT_TRUE(closed_event);
  EXPECT_TRUE(attach->Finish().ok());
  // ...and the memory goes.
  uint64_t bytes = 1;
  for (int i = 0; i < 6000 && bytes != 0; ++i) {
    v1::ServerStats stats;
    ASSERT_TRUE(Rpc([&](auto* c) {
                  return runtime_->GetServerStats(
                      c, v1::GetServerStatsRequest(), &stats);
                }).status.ok());
    bytes = stats.buffer_bytes();
    if (bytes != 0) absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(bytes, 0u);
}

// Finding 10: a session whose stream still works is not reaped as idle.
TEST_F(HardeningTest, BusySessionsAreNotIdle) {
  Options options;
  options.session_limits.idle_timeout = absl::Milliseconds(250);
  Start(options);
  std::string s = NewSession();
  // Work for several idle timeouts however fast the machine (>= 1.5 s at
  // 5 ms a launch), yet short enough under ASan on a loaded machine.
  QueueSlowWork(s, int64_t{1} << 26, 300);
  Result synced = Synchronize(s, 0, absl::Minutes(3));
  EXPECT_TRUE(synced.status.ok()) << synced.status.error_message();
  uint64_t buffer = 0;
  Result after = Malloc(s, 16, &buffer);
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
}

// Finding 14: an integer-typed negativeSlope of NaN or 1e300 is refused
// (it was cast to int64: undefined behaviour).
TEST_F(HardeningTest, NonIntegralIntegerSlopeIsRefused) {
  Start(Options());
  std::string s = NewSession();
  uint64_t buffer = MustMalloc(s, 64);
  for (double slope : {std::nan(""), 1e300, -1e300, 9223372036854775808.0}) {
    v1::GetWorkspaceSizeRequest request;
    request.set_session(s);
    request.set_op("LeakyReluBackward");
    request.mutable_params()->mutable_negative_slope()->set_dtype(v1::INT64);
    request.mutable_params()->mutable_negative_slope()->set_value(slope);
    for (const char* name : {"gradOutput", "self", "out"}) {
      (*request.mutable_tensors())[name] = Desc(buffer, v1::FLOAT, {4});
    }
    v1::GetWorkspaceSizeResponse response;
    Result r = Rpc(
        [&](auto* c) { return ops_->GetWorkspaceSize(c, request, &response); });
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << slope;
    EXPECT_EQ(r.aclnn, 161002) << slope;
  }
}

// Finding 17: limits whose sums could wrap are refused at start, and
// --max_values is held to what fits in a message.
TEST_F(HardeningTest, ConfigurationCannotWrap) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.transfer_limits.chunk_bytes = ~uint64_t{0} - 100;
  auto refused = Server::Start(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("--chunk_bytes"));
  options = Options();
  options.transfer_limits.max_message_bytes = 1 << 20;
  options.transfer_limits.chunk_bytes = 1 << 19;
  options.transfer_limits.max_values = 1 << 30;
  Start(options);
  v1::GetDeviceInfoResponse info;
  ASSERT_TRUE(Rpc([&](auto* c) {
                return runtime_->GetDeviceInfo(c, v1::GetDeviceInfoRequest(),
                                               &info);
              }).status.ok());
  EXPECT_EQ(info.limits().max_values(), ((1u << 20) - 1024) / 8);
}

// Finding 12: an upload occupies its stream until its last byte is in, so a
// kernel queued on that stream after the upload started reads the uploaded
// data, not what was there before.
TEST_F(HardeningTest, KernelsWaitForAnUploadOnTheirStream) {
  Start(Options());
  const std::string s = NewSession();
  const uint64_t in = MustMalloc(s, 64), out = MustMalloc(s, 64);
  const uint64_t executor =
      MustPlanThreshold(s, Desc(in, v1::FLOAT, {16}), Desc(in, v1::FLOAT, {16}),
                        Desc(out, v1::FLOAT, {16}));
  v1::UploadRequest header;
  header.set_session(s);
  header.set_buffer(in);
  header.set_size(64);
  PausedUpload upload(grpc::CreateChannel(server_->address(),
                                          grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(upload.Send(header.SerializeAsString()));
  WaitUntilStreamBusy(s);
  // The client queues a kernel that reads `in` while the upload is paused.
  ASSERT_TRUE(Execute(s, executor).status.ok());
  v1::UploadRequest data;
  data.set_data(FloatBytes(16, 5.0f));
  ASSERT_TRUE(upload.Send(data.SerializeAsString()));
  grpc::Status uploaded = upload.Finish();
  ASSERT_TRUE(uploaded.ok()) << uploaded.error_message();
  ASSERT_TRUE(Synchronize(s).status.ok());
  EXPECT_EQ(ReadValues(s, out, 16), std::vector<double>(16, 5.0));
}

// Finding 12: a download occupies its stream until its last chunk has left,
// so a kernel queued after it cannot change bytes not sent yet (chunks are
// zero-copy views of the buffer).
TEST_F(HardeningTest, KernelsWaitForADownloadOnTheirStream) {
  Options options;
  // The test's channel takes gRPC's default 4 MiB messages.
  options.transfer_limits.chunk_bytes = 1 << 20;
  Start(options);
  const std::string s = NewSession();
  // 128 MiB: far more than gRPC's flow-control window and the socket
  // buffers hold, so most chunks are still unsent when the client pauses.
  const int64_t n = int64_t{1} << 25;
  const uint64_t big = MustMalloc(s, n * 4);
  const uint64_t minus_one = MustMalloc(s, 4), seven = MustMalloc(s, 4),
                 one = MustMalloc(s, 4);
  WriteValues(s, minus_one, {-1});
  WriteValues(s, seven, {7});
  WriteValues(s, one, {1});
  // big = -1 everywhere, then a kernel that would make it 7 everywhere
  // (stride-0 inputs broadcast one value).
  const v1::TensorDesc all = Desc(big, v1::FLOAT, {n});
  ASSERT_TRUE(
      Execute(s, MustPlanThreshold(s, Desc(minus_one, v1::FLOAT, {n}, {0}),
                                   Desc(one, v1::FLOAT, {n}, {0}), all))
          .status.ok());
  const uint64_t to_seven = MustPlanThreshold(
      s, Desc(seven, v1::FLOAT, {n}, {0}), Desc(one, v1::FLOAT, {n}, {0}), all);
  ASSERT_TRUE(Synchronize(s).status.ok());

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  v1::DownloadRequest request;
  request.set_session(s);
  request.set_buffer(big);
  request.set_size(n * 4);
  auto reader = runtime_->Download(&context, request);
  v1::DownloadResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  uint64_t received = chunk.data().size();
  uint64_t wrong = 0;
  auto count_wrong = [&](const std::string& data) {
    for (size_t i = 0; i + 4 <= data.size(); i += 4) {
      float v;
      std::memcpy(&v, data.data() + i, 4);
      if (v != -1.0f) ++wrong;
    }
  };
  count_wrong(chunk.data());
  // The client pauses its download and queues the kernel on the same
  // stream. Give it time to run if it (wrongly) does not wait: the
  // synchronize does not return while the download holds the stream.
  ASSERT_TRUE(Execute(s, to_seven).status.ok());
  Rpc(
      [&](auto* c) {
        v1::SynchronizeStreamRequest sync;
        sync.set_session(s);
        v1::SynchronizeStreamResponse response;
        return runtime_->SynchronizeStream(c, sync, &response);
      },
      absl::Seconds(2));
  while (reader->Read(&chunk)) {
    received += chunk.data().size();
    count_wrong(chunk.data());
  }
  grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(received, uint64_t(n) * 4);
  EXPECT_EQ(wrong, 0u) << "values changed by a kernel queued after the "
                          "download started";
  // The kernel ran after the download.
  ASSERT_TRUE(Synchronize(s).status.ok());
  EXPECT_THAT(ReadValues(s, big, 2), ElementsAre(7, 7));
}

// Finding 5(c): CloseSession and DestroyStream end the transfers in flight
// on the session's streams, however stalled their clients are, so a closed
// session's memory goes.
TEST_F(HardeningTest, ClosingEndsStalledTransfers) {
  Options options;
  // The test's channel takes gRPC's default 4 MiB messages.
  options.transfer_limits.chunk_bytes = 1 << 20;
  Start(options);
  const std::string s = NewSession();
  const uint64_t small = MustMalloc(s, 1 << 20);
  const uint64_t big = MustMalloc(s, 128 << 20);
  uint64_t other = 0;
  ASSERT_TRUE(CreateStream(s, &other).status.ok());
  // An upload stalled after its header, on stream 0.
  v1::UploadRequest header;
  header.set_session(s);
  header.set_buffer(small);
  header.set_size(1 << 20);
  PausedUpload upload(grpc::CreateChannel(server_->address(),
                                          grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(upload.Send(header.SerializeAsString()));
  WaitUntilStreamBusy(s);
  // A download whose client does not read, on the other stream.
  grpc::ClientContext download_context;
  download_context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  v1::DownloadRequest request;
  request.set_session(s);
  request.set_buffer(big);
  request.set_size(128 << 20);
  request.set_stream(other);
  auto reader = runtime_->Download(&download_context, request);
  v1::DownloadResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk));

  Result destroyed = DestroyStream(s, other, absl::Seconds(10));
  EXPECT_TRUE(destroyed.status.ok()) << destroyed.status.error_message();
  Result closed = CloseSession(s, absl::Seconds(10));
  EXPECT_TRUE(closed.status.ok()) << closed.status.error_message();
  EXPECT_EQ(WaitForNoBufferBytes(), 0u)
      << "a stalled transfer keeps a closed session's memory";
  // Both calls were ended by the server.
  grpc::Status uploaded = upload.Finish(/*half_close=*/false);
  EXPECT_EQ(uploaded.error_code(), grpc::StatusCode::CANCELLED)
      << uploaded.error_message();
  while (reader->Read(&chunk)) {
  }
  grpc::Status downloaded = reader->Finish();
  EXPECT_EQ(downloaded.error_code(), grpc::StatusCode::CANCELLED)
      << downloaded.error_message();
}

// Finding 5(c): a transfer that moves nothing for --transfer_idle_timeout_s
// is ended, and its stream goes on with the work queued behind it.
TEST_F(HardeningTest, StalledTransfersTimeOut) {
  Options options;
  options.transfer_limits.idle_timeout = absl::Seconds(1);
  options.transfer_limits.chunk_bytes = 1 << 20;
  Start(options);
  const std::string s = NewSession();
  const uint64_t small = MustMalloc(s, 64);
  v1::UploadRequest header;
  header.set_session(s);
  header.set_buffer(small);
  header.set_size(64);
  PausedUpload upload(grpc::CreateChannel(server_->address(),
                                          grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(upload.Send(header.SerializeAsString()));
  WaitUntilStreamBusy(s);
  grpc::Status uploaded = upload.Finish(/*half_close=*/false);
  EXPECT_EQ(uploaded.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << uploaded.error_message();
  EXPECT_THAT(uploaded.error_message(), HasSubstr("--transfer_idle_timeout_s"));
  // The stream and the session still work.
  ASSERT_TRUE(Synchronize(s).status.ok());
  WriteValues(s, small, {3});
  EXPECT_THAT(ReadValues(s, small, 1), ElementsAre(3));

  // A download whose client stops reading.
  const uint64_t big = MustMalloc(s, 128 << 20);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  v1::DownloadRequest request;
  request.set_session(s);
  request.set_buffer(big);
  request.set_size(128 << 20);
  auto reader = runtime_->Download(&context, request);
  v1::DownloadResponse chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  // Blocks (the download holds the stream) until the download times out.
  Result synced = Synchronize(s);
  EXPECT_TRUE(synced.status.ok()) << synced.status.error_message();
  while (reader->Read(&chunk)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  EXPECT_THAT(ReadValues(s, small, 1), ElementsAre(3));
}

// Finding 5(c): a stalled transfer does not hold up the server's shutdown.
TEST_F(HardeningTest, ShutdownEndsStalledTransfers) {
  Options options;
  options.shutdown_grace = absl::Milliseconds(200);
  options.transfer_limits.chunk_bytes = 1 << 20;
  Start(options);
  const std::string s = NewSession();
  const uint64_t small = MustMalloc(s, 64);
  const uint64_t big = MustMalloc(s, 128 << 20);
  v1::UploadRequest header;
  header.set_session(s);
  header.set_buffer(small);
  header.set_size(64);
  PausedUpload upload(grpc::CreateChannel(server_->address(),
                                          grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(upload.Send(header.SerializeAsString()));
  WaitUntilStreamBusy(s);
  grpc::ClientContext context;
  v1::DownloadRequest request;
  request.set_session(s);
  request.set_buffer(big);
  request.set_size(128 << 20);
  auto reader = runtime_->Download(&context, request);
  // Queued behind the upload: work waiting on a held stream.
  QueueSlowWork(s, 1 << 20, 10);
  server_.reset();  // Returns: nothing waits for the stalled clients.
  EXPECT_FALSE(upload.Finish(/*half_close=*/false).ok());
  v1::DownloadResponse chunk;
  while (reader->Read(&chunk)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
}

}  // namespace
// The third review, finding 3: synchronizes whose calls are abandoned
// (deadline passed, cancelled) while the record they wait for is held are
// dropped at once, not kept until it completes; and a session may keep only
// --max_pending_synchronizes_per_session waiting. Finding 10: all of it
// shows in SessionStats and in the per-tenant gauges.
TEST_F(HardeningTest, AbandonedSynchronizesAreReleasedAndBounded) {
  Options options;
  options.session_limits.max_pending_synchronizes_per_session = 4;
  // The stalled upload below holds its stream for the whole test.
  options.transfer_limits.idle_timeout = absl::Minutes(10);
  options.metrics_listen = "127.0.0.1:0";
  Start(options);
  const std::string s = NewSession();
  const uint64_t buffer = MustMalloc(s, 4096);
  uint64_t t = 0;
  ASSERT_TRUE(CreateStream(s, &t).status.ok());
  // An upload stalled after its header holds t, so a record on t stays
  // pending for as long as the test needs.
  v1::UploadRequest header;
  header.set_session(s);
  header.set_buffer(buffer);
  header.set_size(4096);
  header.set_stream(t);
  auto upload = std::make_unique<PausedUpload>(grpc::CreateChannel(
      server_->address(), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(upload->Send(header.SerializeAsString()));
  WaitUntilStreamBusy(s, t);
  const uint64_t e = CreateEvent(s);
  RecordEvent(s, e, t);

  // Abandoned: their deadlines pass while the record is held. Fewer than
  // the limit, so none is refused however late the server sees the
  // deadlines.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(
        SynchronizeEvent(s, e, absl::Milliseconds(20)).status.error_code(),
        grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(Synchronize(s, t, absl::Milliseconds(20)).status.error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  // Only the record is left outstanding.
  EXPECT_TRUE(StatsEventually(s, [](const v1::SessionStats& stats) {
    return stats.pending_synchronizes() == 0 &&
           stats.pending_event_operations() == 1;
  })) << SessionStats(s).DebugString();

  // Waiting ones count, up to the limit.
  struct Waiting {
    grpc::ClientContext context;
    v1::SynchronizeEventRequest request;
    v1::SynchronizeEventResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Waiting>> waiting;
  for (int i = 0; i < 4; ++i) {
    auto call = std::make_unique<Waiting>();
    call->context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    call->request.set_session(s);
    call->request.set_event(e);
    Waiting* w = call.get();
    runtime_->async()->SynchronizeEvent(&w->context, &w->request, &w->response,
                                        [w](grpc::Status status) {
                                          w->status = std::move(status);
                                          w->done.Notify();
                                        });
    waiting.push_back(std::move(call));
  }
  ASSERT_TRUE(StatsEventually(s, [](const v1::SessionStats& stats) {
    return stats.pending_synchronizes() == 4;
  })) << SessionStats(s).DebugString();
  const v1::SessionStats held = SessionStats(s);
  EXPECT_EQ(held.events(), 1u);
  EXPECT_EQ(held.pending_event_operations(), 5u);  // The record, 4 waits.
  const std::string limit =
      "the session has 4 synchronizes pending, the limit "
      "(--max_pending_synchronizes_per_session); wait for them to be "
      "answered before sending more";
  Result refused = SynchronizeEvent(s, e, absl::Seconds(30));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.status.error_message(), limit);
  refused = Synchronize(s, t);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.status.error_message(), limit);
  const std::string page = scrape::Metrics(server_->metrics_address());
  EXPECT_EQ(scrape::Sum(page, "opserver_pending_synchronizes"), 4);
  EXPECT_EQ(scrape::Sum(page, "opserver_pending_event_operations"), 5);
  EXPECT_EQ(scrape::Sum(page, "opserver_events"), 1);

  // Cancelled ones are answered and released at once.
  for (auto& call : waiting) call->context.TryCancel();
  for (auto& call : waiting) {
    ASSERT_TRUE(call->done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(StatsEventually(s, [](const v1::SessionStats& stats) {
    return stats.pending_synchronizes() == 0 &&
           stats.pending_event_operations() == 1;
  })) << SessionStats(s).DebugString();

  // The stream goes on once the upload ends; the record then completes.
  upload.reset();
  EXPECT_TRUE(StatsEventually(s, [](const v1::SessionStats& stats) {
    return stats.pending_event_operations() == 0;
  })) << SessionStats(s).DebugString();
  EXPECT_TRUE(SynchronizeEvent(s, e, absl::Seconds(30)).status.ok());
}

// Finding 4: Attach calls per session are bounded; a refused one attaches
// nothing (its end closes nothing), and the open ones show in the stats.
TEST_F(HardeningTest, AttachCallsPerSessionAreBounded) {
  Options options;
  options.session_limits.max_attach_per_session = 2;
  Start(options);
  const std::string s = NewSession();
  v1::AttachRequest request;
  request.set_session(s);
  grpc::ClientContext first_context, second_context, third_context;
  auto first = runtime_->Attach(&first_context, request);
  auto second = runtime_->Attach(&second_context, request);
  v1::AttachEvent event;
  ASSERT_TRUE(first->Read(&event));
  EXPECT_EQ(event.event(), "attached");
  ASSERT_TRUE(second->Read(&event));
  EXPECT_EQ(event.event(), "attached");
  auto third = runtime_->Attach(&third_context, request);
  EXPECT_FALSE(third->Read(&event));
  grpc::Status refused = third->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "the session has 2 Attach calls open, the limit "
            "(--max_attach_per_session)");
  EXPECT_EQ(SessionStats(s).attach_streams(), 2u);
  MustMalloc(s, 4096);  // The session lives on.
  // Another session has slots of its own.
  const std::string other = NewSession();
  v1::AttachRequest other_request;
  other_request.set_session(other);
  grpc::ClientContext other_context;
  auto other_attach = runtime_->Attach(&other_context, other_request);
  ASSERT_TRUE(other_attach->Read(&event));
  EXPECT_EQ(event.event(), "attached");
  EXPECT_EQ(SessionStats(other).attach_streams(), 1u);
  ASSERT_TRUE(CloseSession(s).status.ok());
  ASSERT_TRUE(CloseSession(other).status.ok());
  for (auto* call : {first.get(), second.get(), other_attach.get()}) {
    while (call->Read(&event)) {
    }
    EXPECT_TRUE(call->Finish().ok());
  }
}

}  // namespace opserver
