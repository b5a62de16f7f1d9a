// Events and device memory operations through the real server and the C++
// client, pipelined and unary, over an asynchronous FakeDevice. Cross-stream
// ordering is checked without timing: the producer's stream is held by the
// device (FakeStreamRecord::HoldLaunches) until the test lets it go, so a
// consumer on another stream that does not wait reads the producer's input
// before it is written (the control), and one that waits on an event reads
// what the producer wrote.

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/client.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "runtime/event.h"
#include "server/server.h"
#include "tests/tensor_desc.h"

namespace opserver {
namespace remote {
namespace {

using kernels::DType;
using ::testing::HasSubstr;

// Above the server's inline-launch size, so launches run on their stream's
// thread (a held launch run inline would hold the caller).
constexpr int64_t kN = 20000;

// Polls until `done` holds, for at most 20 s (a bounded wait, not a timing
// assertion: the test fails only if it never holds).
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

class EventsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    opserver::Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    auto device = std::make_unique<FakeDevice>();
    device_ = device.get();
    auto server = opserver::Server::Start(options, std::move(device));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ConnectOptions connect;
    connect.pipeline = GetParam();
    auto client = Client::Connect(server_->address(), connect);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("events_test");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    ASSERT_EQ(session_->pipelined(), GetParam());
  }

  void TearDown() override {
    for (const auto& record : device_->streams()) record->ReleaseLaunches();
    session_.reset();
    client_.reset();
    server_.reset();
  }

  // A new stream and its device stream's record.
  std::pair<uint64_t, std::shared_ptr<FakeStreamRecord>> NewStream() {
    const size_t before = device_->streams().size();
    auto stream = session_->CreateStream();
    EXPECT_TRUE(stream.ok()) << stream.status();
    auto records = device_->streams();
    EXPECT_EQ(records.size(), before + 1);
    return {stream.ok() ? stream->Release() : 0, records.back()};
  }

  uint64_t Floats(const std::vector<float>& values) {
    auto buffer = session_->Malloc(values.size() * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return 0;
    EXPECT_TRUE(session_
                    ->Upload(buffer->handle(), 0, values.data(),
                             values.size() * sizeof(float))
                    .ok());
    return buffer->Release();
  }

  // Ordered on `stream` only (a pipelined Download would first wait for
  // the whole session, the held stream included).
  std::vector<float> Read(uint64_t buffer, size_t n, uint64_t stream) {
    std::vector<float> out(n);
    auto read =
        session_->ReadAsync(buffer, 0, out.data(), n * sizeof(float), stream);
    EXPECT_TRUE(read.ok()) << read.status();
    if (read.ok()) {
      absl::Status status = read->Wait();
      EXPECT_TRUE(status.ok()) << status;
    }
    return out;
  }

  std::vector<uint8_t> Bytes(uint64_t buffer, size_t n) {
    std::vector<uint8_t> out(n);
    absl::Status status = session_->Download(buffer, 0, out.data(), n);
    EXPECT_TRUE(status.ok()) << status;
    return out;
  }

  // out = grad where self > 0 (all of it here): a copy of `grad` by a
  // launch on `stream`.
  void CopyByLaunch(uint64_t grad, uint64_t self, uint64_t out,
                    uint64_t stream) {
    auto executor = session_->ThresholdBackward(
        TensorDesc::Contiguous(grad, DType::kFloat, {kN}),
        TensorDesc::Contiguous(self, DType::kFloat, {kN}), 0.0,
        TensorDesc::Contiguous(out, DType::kFloat, {kN}));
    ASSERT_TRUE(executor.ok()) << executor.status();
    ASSERT_TRUE(executor->Execute(stream).ok());
  }

  // Buffers of a producer (y = g on stream A) and a consumer (z = y on
  // stream B): g = 1..kN, y = -1 until produced, z = 0.
  struct Work {
    uint64_t g, x, y, z;
    std::vector<float> produced, unproduced;
  };
  Work MakeWork() {
    Work w;
    for (int64_t i = 0; i < kN; ++i) w.produced.push_back(float(i + 1));
    w.unproduced.assign(kN, -1.0f);
    w.g = Floats(w.produced);
    w.x = Floats(std::vector<float>(kN, 10.0f));
    w.y = Floats(w.unproduced);
    w.z = Floats(std::vector<float>(kN, 0.0f));
    return w;
  }

  std::unique_ptr<opserver::Server> server_;
  FakeDevice* device_ = nullptr;  // Owned by server_.
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

INSTANTIATE_TEST_SUITE_P(PipelinedAndUnary, EventsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Pipelined" : "Unary";
                         });

// The control: without a wait, the consumer on B runs while the producer on
// A is held, and reads the producer's output before it exists. This is
// what the next test would see if its wait did nothing.
TEST_P(EventsTest, WithoutAWaitTheConsumerRunsBeforeTheProducer) {
  Work w = MakeWork();
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  a_device->HoldLaunches();
  CopyByLaunch(w.g, w.x, w.y, a);
  ASSERT_TRUE(Eventually([&] { return a_device->WaitingLaunches() == 1; }));
  CopyByLaunch(w.y, w.x, w.z, b);
  ASSERT_TRUE(session_->Synchronize(b).ok());
  EXPECT_EQ(Read(w.z, kN, b), w.unproduced);
  a_device->ReleaseLaunches();
  ASSERT_TRUE(session_->Synchronize(a).ok());
  EXPECT_EQ(Read(w.y, kN, a), w.produced);
}

TEST_P(EventsTest, AStreamWaitingOnAnEventSeesTheProducersOutput) {
  Work w = MakeWork();
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  auto event = session_->CreateEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  a_device->HoldLaunches();
  CopyByLaunch(w.g, w.x, w.y, a);
  ASSERT_TRUE(session_->RecordEvent(*event, a).ok());
  ASSERT_TRUE(session_->StreamWaitEvent(b, *event).ok());
  CopyByLaunch(w.y, w.x, w.z, b);
  ASSERT_TRUE(Eventually([&] { return a_device->WaitingLaunches() == 1; }));
  absl::StatusOr<bool> complete = session_->QueryEvent(*event);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_FALSE(*complete);
  // The consumer has not reached the device (the control's did by now).
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(b_device->launches.load(), 0);

  a_device->ReleaseLaunches();
  ASSERT_TRUE(session_->Synchronize(b).ok());
  EXPECT_EQ(Read(w.z, kN, b), w.produced);
  ASSERT_TRUE(session_->SynchronizeEvent(*event).ok());
  complete = session_->QueryEvent(*event);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_TRUE(*complete);
  EXPECT_TRUE(session_->DestroyEvent(*event).ok());
}

TEST_P(EventsTest, DestroyingTheEventReleasesTheWaitingStream) {
  Work w = MakeWork();
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  auto event = session_->CreateEvent(kEventSync);
  ASSERT_TRUE(event.ok()) << event.status();
  a_device->HoldLaunches();
  CopyByLaunch(w.g, w.x, w.y, a);
  ASSERT_TRUE(session_->RecordEvent(*event, a).ok());
  ASSERT_TRUE(session_->StreamWaitEvent(b, *event).ok());
  CopyByLaunch(w.y, w.x, w.z, b);
  ASSERT_TRUE(session_->DestroyEvent(*event).ok());
  // B goes on although A is still held.
  ASSERT_TRUE(session_->Synchronize(b).ok());
  EXPECT_EQ(Read(w.z, kN, b), w.unproduced);
  a_device->ReleaseLaunches();
  ASSERT_TRUE(session_->Synchronize(a).ok());
}

// A record on a stream destroyed before reaching it still completes, so
// the stream waiting on it goes on (with the producer's work dropped), but
// not as a normal completion (the third review, finding 11): the waiting
// stream gets CANCELLED as its deferred error, the event's synchronize
// answers CANCELLED, and the event has no completion to query or time.
TEST_P(EventsTest, DestroyingTheRecordingStreamReleasesTheWaiter) {
  Work w = MakeWork();
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  auto event = session_->CreateEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  a_device->HoldLaunches();
  CopyByLaunch(w.g, w.x, w.y, a);
  ASSERT_TRUE(session_->RecordEvent(*event, a).ok());
  ASSERT_TRUE(session_->StreamWaitEvent(b, *event).ok());
  CopyByLaunch(w.y, w.x, w.z, b);
  ASSERT_TRUE(Eventually([&] { return a_device->WaitingLaunches() == 1; }));
  ASSERT_TRUE(session_->DestroyStream(a).ok());
  const std::string why =
      "the event's record was cancelled before its stream reached it";
  absl::Status waited = session_->Synchronize(b);
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_THAT(waited.message(), HasSubstr(why));
  absl::Status synced = session_->SynchronizeEvent(*event);
  EXPECT_EQ(synced.code(), absl::StatusCode::kCancelled) << synced;
  EXPECT_THAT(synced.message(), HasSubstr(why));
  absl::StatusOr<bool> complete = session_->QueryEvent(*event);
  EXPECT_EQ(complete.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(complete.status().message(), HasSubstr(why));
  absl::StatusOr<float> ms = session_->EventElapsedMs(*event, *event);
  EXPECT_EQ(ms.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(ms.status().message(), HasSubstr(why));
  // Reported once: the stream goes on without it.
  EXPECT_TRUE(session_->Synchronize(b).ok());
}

// Closing the session while a stream waits on an event whose stream is
// held: everything is released, nothing hangs.
TEST_P(EventsTest, ClosingTheSessionReleasesWaitingStreams) {
  Work w = MakeWork();
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  auto event = session_->CreateEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  a_device->HoldLaunches();
  CopyByLaunch(w.g, w.x, w.y, a);
  ASSERT_TRUE(session_->RecordEvent(*event, a).ok());
  ASSERT_TRUE(session_->StreamWaitEvent(b, *event).ok());
  CopyByLaunch(w.y, w.x, w.z, b);
  ASSERT_TRUE(Eventually([&] { return a_device->WaitingLaunches() == 1; }));
  // Behind the unary call, so the channel's commands are applied first.
  ASSERT_TRUE(session_->QueryEvent(*event).ok());
  v1::CloseSessionRequest request;
  request.set_session(session_->token());
  v1::CloseSessionResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  grpc::Status status =
      client_->runtime().CloseSession(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  // The channel's Close finds the session gone.
  session_->Close().IgnoreError();
}

TEST_P(EventsTest, ElapsedTimeIsPositiveInRecordOrder) {
  Work w = MakeWork();
  auto [a, a_device] = NewStream();
  a_device->SetLaunchDelay(absl::Milliseconds(20));
  auto start = session_->CreateEvent(kEventTimeLine);
  auto end = session_->CreateEvent(kEventTimeLine);
  auto never = session_->CreateEvent();
  ASSERT_TRUE(start.ok() && end.ok() && never.ok());
  // Unrecorded: complete, and no timestamp.
  absl::StatusOr<bool> complete = session_->QueryEvent(*never);
  ASSERT_TRUE(complete.ok()) << complete.status();
  EXPECT_TRUE(*complete);
  EXPECT_TRUE(session_->SynchronizeEvent(*never).ok());

  ASSERT_TRUE(session_->RecordEvent(*start, a).ok());
  CopyByLaunch(w.g, w.x, w.y, a);
  ASSERT_TRUE(session_->RecordEvent(*end, a).ok());
  ASSERT_TRUE(session_->SynchronizeEvent(*end).ok());
  absl::StatusOr<float> ms = session_->EventElapsedMs(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0.0f);
  absl::StatusOr<float> back = session_->EventElapsedMs(*end, *start);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_LT(*back, 0.0f);

  absl::StatusOr<float> bad = session_->EventElapsedMs(*start, *never);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition)
      << bad.status();
  EXPECT_EQ(kernels::GetAclnnStatus(bad.status()),
            kAclErrorRtEventTimestampInvalid);

  // Reset on A: unrecorded again, so no timestamp.
  ASSERT_TRUE(session_->ResetEvent(*end, a).ok());
  ASSERT_TRUE(session_->Synchronize(a).ok());
  bad = session_->EventElapsedMs(*start, *end);
  EXPECT_EQ(kernels::GetAclnnStatus(bad.status()),
            kAclErrorRtEventTimestampInvalid)
      << bad.status();
}

TEST_P(EventsTest, EventHandleErrors) {
  auto [a, a_device] = NewStream();
  EXPECT_EQ(session_->CreateEvent(0x4).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto event = session_->CreateEvent();
  ASSERT_TRUE(event.ok());
  const uint64_t unknown = *event + 1000;
  EXPECT_EQ(session_->RecordEvent(unknown, a).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->RecordEvent(*event, 777).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->StreamWaitEvent(777, *event).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->StreamWaitEvent(a, unknown).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->ResetEvent(unknown).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->QueryEvent(unknown).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->SynchronizeEvent(unknown).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->EventElapsedMs(*event, unknown).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(session_->DestroyEvent(*event).ok());
  EXPECT_EQ(session_->DestroyEvent(*event).code(), absl::StatusCode::kNotFound);
  // Nothing was deferred: every error above was the call's.
  EXPECT_TRUE(session_->Synchronize(a).ok());
  EXPECT_TRUE(session_->Flush().ok());
}

TEST_P(EventsTest, MemsetAndCopyOnDevice) {
  auto buffer = session_->Malloc(64);
  auto other = session_->Malloc(64);
  ASSERT_TRUE(buffer.ok() && other.ok());
  const uint64_t b = buffer->handle(), o = other->handle();
  std::vector<uint8_t> host(64);
  for (int i = 0; i < 64; ++i) host[i] = static_cast<uint8_t>(i);
  ASSERT_TRUE(session_->Upload(b, 0, host.data(), 64).ok());
  auto [s, s_device] = NewStream();

  ASSERT_TRUE(session_->Memset(b, 8, 16, 0xab, s).ok());
  std::memset(host.data() + 8, 0xab, 16);
  // Overlapping, forwards: memmove semantics.
  ASSERT_TRUE(session_->CopyOnDevice(b, 4, b, 0, 32, s).ok());
  std::memmove(host.data() + 4, host.data(), 32);
  ASSERT_TRUE(session_->CopyOnDevice(o, 0, b, 0, 64, s).ok());
  ASSERT_TRUE(session_->Memset(o, 60, 4, 0, s).ok());
  ASSERT_TRUE(session_->Synchronize(s).ok());
  EXPECT_EQ(Bytes(b, 64), host);
  std::vector<uint8_t> copied = host;
  std::memset(copied.data() + 60, 0, 4);
  EXPECT_EQ(Bytes(o, 64), copied);
  EXPECT_EQ(s_device->memsets.load(), 2);
  EXPECT_EQ(s_device->device_copies.load(), 2);
  // Empty ranges are fine, at the end too.
  EXPECT_TRUE(session_->Memset(b, 64, 0, 1).ok());
  EXPECT_TRUE(session_->CopyOnDevice(o, 64, b, 64, 0).ok());

  // The errors, the same pipelined (found here) and unary (the server's).
  const uint64_t kHuge = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(session_->Memset(b, 60, 8, 1).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(session_->Memset(b, kHuge, 2, 1).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(session_->Memset(999, 0, 8, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->Memset(b, 0, 8, 1, 777).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->CopyOnDevice(o, 0, b, 32, 33).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(session_->CopyOnDevice(o, 1, b, 0, 64).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(session_->CopyOnDevice(o, 0, b, kHuge, 2).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(session_->CopyOnDevice(999, 0, b, 0, 8).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->CopyOnDevice(o, 0, 999, 0, 8).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->CopyOnDevice(o, 0, b, 0, 8, 777).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(session_->Synchronize(s).ok());
  EXPECT_TRUE(session_->Synchronize().ok());
  EXPECT_EQ(Bytes(b, 64), host);
}

// The unary calls' own checks (a client could send anything).
TEST_P(EventsTest, UnaryCallsCheckWhatTheClientLibraryCannot) {
  auto buffer = session_->Malloc(16);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(session_->Flush().ok());
  {
    v1::MemsetRequest request;
    request.set_session(session_->token());
    request.set_buffer(buffer->handle());
    request.set_size(4);
    request.set_value(256);
    v1::MemsetResponse response;
    grpc::ClientContext context;
    grpc::Status status =
        client_->runtime().Memset(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    v1::CreateEventRequest request;
    request.set_session(session_->token());
    request.set_flags(0x80);
    v1::CreateEventResponse response;
    grpc::ClientContext context;
    grpc::Status status =
        client_->runtime().CreateEvent(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("unknown bits"));
  }
  {
    v1::EventElapsedTimeRequest request;
    request.set_session(session_->token());
    request.set_start(12345);
    request.set_end(12345);
    v1::EventElapsedTimeResponse response;
    grpc::ClientContext context;
    grpc::Status status =
        client_->runtime().EventElapsedTime(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

// A channel spoken by hand: event, memset and copy commands the server
// refuses become deferred errors with their exact codes, and the channel
// and session keep serving.
class EventsPipelineHostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opserver::Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    auto server = opserver::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ConnectOptions connect;
    connect.pipeline = false;
    auto client = Client::Connect(server_->address(), connect);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("hostile", /*attach=*/false);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  std::unique_ptr<opserver::Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(EventsPipelineHostileTest, RefusedCommandsAreDeferredErrors) {
  auto buffer = session_->Malloc(64);
  ASSERT_TRUE(buffer.ok());
  const uint64_t b = buffer->handle();
  const uint64_t base = kClientExecutorBase;
  grpc::ClientContext context;
  auto stream = client_->operators().Pipeline(&context);
  v1::PipelineRequest open;
  open.set_session(session_->token());
  ASSERT_TRUE(stream->Write(open));

  v1::PipelineRequest batch;
  auto fence = [&](uint64_t id, bool session, uint64_t event = 0) {
    v1::FenceCommand* f = batch.add_commands()->mutable_fence();
    f->set_id(id);
    f->set_session(session);
    f->set_event(event);
  };
  // 1: a wait on an unknown event fails the stream that waits.
  batch.add_commands()->mutable_wait_event()->set_event(99);
  fence(1, false);
  // 2: an id used twice, and one below 2^62, fail the session.
  batch.add_commands()->mutable_create_event()->set_event(base + 5);
  batch.add_commands()->mutable_create_event()->set_event(base + 5);
  fence(2, true);
  batch.add_commands()->mutable_create_event()->set_event(7);
  fence(3, true);
  // 4, 5: memset out of range, copy from an unknown buffer.
  v1::MemsetRequest* memset = batch.add_commands()->mutable_memset();
  memset->set_buffer(b);
  memset->set_offset(32);
  memset->set_size(33);
  fence(4, false);
  v1::CopyDeviceToDeviceRequest* copy = batch.add_commands()->mutable_copy();
  copy->set_dst_buffer(b);
  copy->set_src_buffer(999);
  copy->set_size(1);
  fence(5, false);
  // 6: an unknown stream is the session's error.
  batch.add_commands()->mutable_record_event()->set_event(base + 5);
  batch.add_commands()->mutable_record_event()->set_stream(777);
  fence(6, true);
  // 7, 8: event fences, on the event recorded above and an unknown one.
  fence(7, false, base + 5);
  fence(8, false, 12345);
  // 9: a memset value that is not a byte.
  memset = batch.add_commands()->mutable_memset();
  memset->set_buffer(b);
  memset->set_size(1);
  memset->set_value(300);
  fence(9, false);
  // 11: a memset on an unknown stream is the session's error.
  memset = batch.add_commands()->mutable_memset();
  memset->set_buffer(b);
  memset->set_size(1);
  memset->set_stream(777);
  fence(11, true);
  // 10: an unknown flag.
  v1::CreateEventCommand* create = batch.add_commands()->mutable_create_event();
  create->set_event(base + 6);
  create->set_flags(0x10);
  fence(10, true);
  ASSERT_TRUE(stream->Write(batch));

  std::map<uint64_t, v1::FenceResult> results;
  v1::PipelineEvent event;
  while (results.size() < 11 && stream->Read(&event)) {
    for (const v1::FenceResult& result : event.fences()) {
      results[result.id()] = result;
    }
  }
  ASSERT_EQ(results.size(), 11u);
  auto code = [&](uint64_t id) {
    return static_cast<grpc::StatusCode>(results[id].code());
  };
  EXPECT_EQ(code(1), grpc::StatusCode::NOT_FOUND) << results[1].message();
  EXPECT_THAT(results[1].message(), HasSubstr("StreamWaitEvent"));
  EXPECT_EQ(code(2), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(results[2].message(), HasSubstr("CreateEvent"));
  EXPECT_EQ(code(3), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(4), grpc::StatusCode::OUT_OF_RANGE) << results[4].message();
  EXPECT_EQ(code(5), grpc::StatusCode::NOT_FOUND) << results[5].message();
  EXPECT_EQ(code(6), grpc::StatusCode::NOT_FOUND) << results[6].message();
  EXPECT_EQ(code(7), grpc::StatusCode::OK) << results[7].message();
  EXPECT_EQ(code(8), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code(9), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(10), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code(11), grpc::StatusCode::NOT_FOUND) << results[11].message();
  EXPECT_THAT(results[11].message(), HasSubstr("Memset"));

  // The channel goes on: a good memset, read back by a read fence.
  v1::PipelineRequest good;
  memset = good.add_commands()->mutable_memset();
  memset->set_buffer(b);
  memset->set_size(4);
  memset->set_value(7);
  v1::FenceCommand* read = good.add_commands()->mutable_fence();
  read->set_id(12);
  read->set_read_buffer(b);
  read->set_read_size(4);
  ASSERT_TRUE(stream->Write(good));
  bool answered = false;
  while (!answered && stream->Read(&event)) {
    for (const v1::FenceResult& result : event.fences()) {
      if (result.id() != 12) continue;
      answered = true;
      EXPECT_EQ(result.code(), 0) << result.message();
      EXPECT_EQ(result.data(), std::string(4, '\x07'));
    }
  }
  EXPECT_TRUE(answered);
  stream->WritesDone();
  while (stream->Read(&event)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
  // The session serves unary calls too.
  EXPECT_TRUE(session_->Malloc(8).ok());
}

}  // namespace
}  // namespace remote
}  // namespace opserver
