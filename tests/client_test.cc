// The C++ thin client against a real Server on a free loopback port: every
// operator through the typed calls, streamed transfers, RAII ownership, and
// each client-visible error path with its aclnn status.

#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "server/server.h"
#include "testing/closed_port.h"

namespace opserver {
namespace remote {
namespace {

using kernels::DType;
using kernels::GetAclnnStatus;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartServer("127.0.0.1:0");
    auto client = Client::Connect(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("client_test");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  void StartServer(const std::string& listen,
                   uint32_t max_streams_per_session = 16) {
    opserver::Options options;
    options.listen = listen;
    options.threads = 2;
    options.session_limits.max_streams_per_session = max_streams_per_session;
    auto server = opserver::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  DeviceBuffer Floats(const std::vector<float>& values) {
    auto buffer = session_->Malloc(values.size() * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_TRUE(session_
                    ->Upload(buffer->handle(), 0, values.data(),
                             values.size() * sizeof(float))
                    .ok());
    return *std::move(buffer);
  }

  std::vector<float> ReadFloats(const DeviceBuffer& buffer, size_t n) {
    std::vector<float> out(n);
    absl::Status status =
        session_->Download(buffer.handle(), 0, out.data(), n * sizeof(float));
    EXPECT_TRUE(status.ok()) << status;
    return out;
  }

  static TensorDesc F32(const DeviceBuffer& buffer,
                        std::vector<int64_t> shape) {
    return TensorDesc::Contiguous(buffer.handle(), DType::kFloat,
                                  std::move(shape));
  }

  uint64_t ServerBufferBytes() {
    grpc::ClientContext context;
    v1::ServerStats stats;
    EXPECT_TRUE(
        client_->runtime()
            .GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
            .ok());
    return stats.buffer_bytes();
  }

  std::unique_ptr<opserver::Server> server_;
  // A session of its own, through a client made with `options`.
  struct Connection {
    std::unique_ptr<Client> client;
    std::unique_ptr<Session> session;  // Declared last: closed first.
  };
  Connection Connect(const ConnectOptions& options, const std::string& name) {
    Connection c;
    auto client = Client::Connect(server_->address(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return c;
    c.client = *std::move(client);
    auto session = c.client->CreateSession(name);
    EXPECT_TRUE(session.ok()) << session.status();
    if (session.ok()) c.session = *std::move(session);
    return c;
  }

  // Uploads of kSplitBytes or more split over `connections`, in messages
  // of kSplitChunk.
  static constexpr uint64_t kSplitChunk = 4096;
  static constexpr uint64_t kSplitBytes = 16 * kSplitChunk;
  void TransfersAtChunkBoundariesAndBufferEnds(bool data_path);

  static ConnectOptions SplitOptions(int connections) {
    ConnectOptions options;
    options.upload_chunk_bytes = kSplitChunk;
    options.transfer_connections = connections;
    options.transfer_split_bytes = kSplitBytes;
    options.data_path = false;  // These test gRPC's split transfers.
    return options;
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

TEST_F(ClientTest, ThresholdBackwardWorkedExampleOnAStream) {
  DeviceBuffer grad = Floats({4.5, 4.4, 4.3, 4.2});
  DeviceBuffer self = Floats({0.2, 1.2, 2.2, 3.2});
  DeviceBuffer out = Floats({-1, -1, -1, -1});
  auto stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto executor = session_->ThresholdBackward(F32(grad, {4}), F32(self, {4}),
                                              1.0, F32(out, {4}));
  ASSERT_TRUE(executor.ok()) << executor.status();
  EXPECT_EQ(executor->workspace_size(), 0u);
  ASSERT_TRUE(executor->Execute(stream->handle()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  std::vector<float> result(4);
  ASSERT_TRUE(
      session_->Download(out.handle(), 0, result.data(), 16, stream->handle())
          .ok());
  EXPECT_THAT(result, ElementsAre(0, 4.4f, 4.3f, 4.2f));
}

TEST_F(ClientTest, EveryOperatorThroughItsTypedCall) {
  DeviceBuffer grad = Floats({1, 2, 3, 4});
  DeviceBuffer self = Floats({0.5, -0.6, 0.1, -2});
  DeviceBuffer out = Floats({0, 0, 0, 0});

  auto softshrink = session_->SoftshrinkBackward(F32(grad, {4}), F32(self, {4}),
                                                 0.5, F32(out, {4}));
  ASSERT_TRUE(softshrink.ok()) << softshrink.status();
  ASSERT_TRUE(softshrink->Execute().ok());
  EXPECT_THAT(ReadFloats(out, 4), ElementsAre(0, 2, 0, 4));

  auto hardswish = session_->HardswishBackward(F32(grad, {4}), F32(self, {4}),
                                               F32(out, {4}));
  ASSERT_TRUE(hardswish.ok()) << hardswish.status();
  ASSERT_TRUE(hardswish->Execute().ok());
  EXPECT_THAT(ReadFloats(out, 4),
              ElementsAre(FloatNear(1 * (0.5 / 3 + 0.5), 1e-6),
                          FloatNear(2 * (-0.6 / 3 + 0.5), 1e-6),
                          FloatNear(3 * (0.1 / 3 + 0.5), 1e-6),
                          FloatNear(4 * (-2.0 / 3 + 0.5), 1e-6)));

  auto leaky =
      session_->LeakyReluBackward(F32(grad, {4}), F32(self, {4}),
                                  {DType::kFloat, 0.25}, false, F32(out, {4}));
  ASSERT_TRUE(leaky.ok()) << leaky.status();
  ASSERT_TRUE(leaky->Execute().ok());
  EXPECT_THAT(ReadFloats(out, 4), ElementsAre(1, 0.5, 3, 1));

  // DropoutBackward, the spec's worked example; the mask as UINT8 values.
  DeviceBuffer grad8 = Floats({0, 1, 2, 3, 4, 5, 6, 7});
  DeviceBuffer out8 = Floats(std::vector<float>(8, -1));
  auto mask = session_->Malloc(16);
  ASSERT_TRUE(mask.ok());
  std::vector<double> bits(16, 0);
  bits[0] = 42;
  ASSERT_TRUE(
      session_->WriteValues(mask->handle(), 0, DType::kUint8, bits).ok());
  auto dropout = session_->DropoutBackward(
      F32(grad8, {4, 2}),
      TensorDesc::Contiguous(mask->handle(), DType::kUint8, {16}), 2.0,
      F32(out8, {4, 2}));
  ASSERT_TRUE(dropout.ok()) << dropout.status();
  ASSERT_TRUE(dropout->Execute().ok());
  auto values = session_->ReadValues(out8.handle(), 0, DType::kFloat, 8);
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ElementsAre(0, 2, 0, 6, 0, 10, 0, 0));
}

TEST_F(ClientTest, BroadcastStridedAndOffsetViews) {
  // gradOutput: transposed view of a 3x2 buffer; self: [2,1] column at byte
  // offset 8 of its buffer; out: every other element of rows of 8.
  DeviceBuffer grad = Floats({1, 2, 3, 4, 5, 6});
  DeviceBuffer self = Floats({99, 99, 0, 5});
  DeviceBuffer out = Floats(std::vector<float>(16, -1));
  TensorDesc grad_desc = F32(grad, {2, 3});
  grad_desc.strides = {1, 2};
  TensorDesc self_desc = F32(self, {2, 1});
  self_desc.buffer_offset = 8;
  TensorDesc out_desc = F32(out, {2, 3});
  out_desc.strides = {8, 2};
  auto executor =
      session_->ThresholdBackward(grad_desc, self_desc, 1.0, out_desc);
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE(executor->Execute().ok());
  EXPECT_THAT(ReadFloats(out, 16), ElementsAre(0, -1, 0, -1, 0, -1, -1, -1,  //
                                               2, -1, 4, -1, 6, -1, -1, -1));
}

TEST_F(ClientTest, LargeTransfersAreByteExactAcrossChunks) {
  const size_t size = (9 << 20) + 123;  // Several chunks each way.
  std::vector<char> data(size);
  std::mt19937 rng(11);
  for (char& c : data) c = static_cast<char>(rng());
  auto buffer = session_->Malloc(size + 100);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(session_->Upload(buffer->handle(), 100, data.data(), size).ok());
  std::vector<char> back(size);
  ASSERT_TRUE(
      session_->Download(buffer->handle(), 100, back.data(), size).ok());
  EXPECT_TRUE(back == data) << "downloaded bytes differ";

  absl::Status past =
      session_->Upload(buffer->handle(), 200, data.data(), size);
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument) << past;
}

// Upload sends slices of the caller's memory and Download parses chunks
// straight into it (or, over the data path, both are raw socket calls on
// it): sizes at chunk boundaries and one byte either side, an empty
// transfer, and ranges that end at (or run past) the buffer's end.
TEST_F(ClientTest, TransfersAtChunkBoundariesAndBufferEnds) {
  for (bool data_path : {false, true}) {
    SCOPED_TRACE(data_path ? "data path" : "gRPC");
    TransfersAtChunkBoundariesAndBufferEnds(data_path);
  }
}

void ClientTest::TransfersAtChunkBoundariesAndBufferEnds(bool data_path) {
  constexpr uint64_t kChunk = 4096;
  ConnectOptions options;
  options.upload_chunk_bytes = kChunk;
  // Every non-empty transfer over the data path, or none.
  options.data_path = data_path;
  options.data_path_bytes = 1;
  Connection c = Connect(options, "boundaries");
  ASSERT_NE(c.session, nullptr);
  Session* session = c.session.get();
  // The server's download chunk is its --chunk_bytes (4 MiB here).
  const uint64_t server_chunk = 4 << 20;
  const uint64_t capacity = server_chunk + 3 * kChunk + 2;
  auto buffer = session->Malloc(capacity);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::mt19937 rng(5);
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, kChunk - 1, kChunk,
                        kChunk + 1, 3 * kChunk - 1, 3 * kChunk, 3 * kChunk + 1,
                        server_chunk - 1, server_chunk, server_chunk + 1}) {
    for (uint64_t offset : {uint64_t{0}, capacity - size}) {
      SCOPED_TRACE(absl::StrCat("size ", size, " offset ", offset));
      std::vector<char> data(size);
      for (char& c : data) c = static_cast<char>(rng());
      ASSERT_TRUE(
          session->Upload(buffer->handle(), offset, data.data(), size).ok());
      std::vector<char> back(size + 1, '\x7f');
      ASSERT_TRUE(
          session->Download(buffer->handle(), offset, back.data(), size).ok());
      EXPECT_EQ(back[size], '\x7f') << "wrote past the range asked for";
      back.resize(size);
      EXPECT_TRUE(back == data) << "bytes differ";
    }
  }
  char byte = 0;
  EXPECT_TRUE(session->Upload(buffer->handle(), capacity, &byte, 0).ok());
  EXPECT_TRUE(session->Download(buffer->handle(), capacity, &byte, 0).ok());
  EXPECT_EQ(session->Upload(buffer->handle(), capacity, &byte, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Download(buffer->handle(), capacity, &byte, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

// Transfers of at least transfer_split_bytes go over several connections, in
// parts on streams of their own. Byte-exact at the split threshold and at
// part and chunk boundaries, up to the buffer's end; and split for real:
// each extra part's stream takes a handle, and this server hands out
// handles in order, so a split transfer moves the next handle on by the
// number of extra connections.
TEST_F(ClientTest, SplitTransfersAreByteExactAndUseTheExtraConnections) {
  constexpr uint64_t kChunk = kSplitChunk;
  constexpr uint64_t kSplit = kSplitBytes;
  Connection c = Connect(SplitOptions(3), "split");
  ASSERT_NE(c.session, nullptr);
  Session* session = c.session.get();
  const uint64_t capacity = (1 << 20) + 5;
  auto buffer = session->Malloc(capacity);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto next_handle = [&] {
    auto stream = session->CreateStream();
    EXPECT_TRUE(stream.ok()) << stream.status();
    return stream.ok() ? stream->handle() : 0;
  };
  std::mt19937 rng(17);
  for (uint64_t size : {kSplit - 1, kSplit, kSplit + 1, 3 * kChunk * 7 + 1,
                        uint64_t{1} << 20, capacity}) {
    for (uint64_t offset : {uint64_t{0}, capacity - size}) {
      SCOPED_TRACE(absl::StrCat("size ", size, " offset ", offset));
      std::vector<char> before(capacity);
      for (char& byte : before) byte = static_cast<char>(rng());
      ASSERT_TRUE(
          session->Upload(buffer->handle(), 0, before.data(), capacity).ok());
      std::vector<char> data(size);
      for (char& byte : data) byte = static_cast<char>(rng());
      const uint64_t handle = next_handle();
      ASSERT_TRUE(
          session->Upload(buffer->handle(), offset, data.data(), size).ok());
      EXPECT_EQ(next_handle() - handle, size >= kSplit ? 3u : 1u)
          << "split into the wrong number of parts";
      std::vector<char> expected = before;
      std::copy(data.begin(), data.end(), expected.begin() + offset);
      std::vector<char> back(capacity);
      ASSERT_TRUE(
          session->Download(buffer->handle(), 0, back.data(), capacity).ok());
      EXPECT_TRUE(back == expected) << "bytes differ";
      // Downloads split the same way, and write only the range asked for.
      std::vector<char> range(size + 2, '\x7f');
      const uint64_t before_download = next_handle();
      ASSERT_TRUE(
          session->Download(buffer->handle(), offset, range.data() + 1, size)
              .ok());
      EXPECT_EQ(next_handle() - before_download, size >= kSplit ? 3u : 1u)
          << "download split into the wrong number of parts";
      EXPECT_EQ(range.front(), '\x7f');
      EXPECT_EQ(range.back(), '\x7f');
      EXPECT_TRUE(std::equal(data.begin(), data.end(), range.begin() + 1))
          << "downloaded bytes differ";
    }
  }
}

// The parts go out on other streams than the caller's, yet no part may
// land before the work queued on the caller's stream: an operator writing
// the same bytes, queued just before, never overwrites the upload.
TEST_F(ClientTest, SplitUploadLandsAfterTheWorkQueuedOnItsStream) {
  Connection c = Connect(SplitOptions(4), "split_order");
  ASSERT_NE(c.session, nullptr);
  Session* session = c.session.get();
  constexpr int64_t kCount = 1 << 20;  // 4 MiB of floats.
  const uint64_t bytes = kCount * sizeof(float);
  auto grad = session->Malloc(bytes);
  auto self = session->Malloc(bytes);
  auto out = session->Malloc(bytes);
  ASSERT_TRUE(grad.ok() && self.ok() && out.ok());
  std::vector<float> ones(kCount, 1.0f);
  ASSERT_TRUE(session->Upload(grad->handle(), 0, ones.data(), bytes).ok());
  ASSERT_TRUE(session->Upload(self->handle(), 0, ones.data(), bytes).ok());
  auto stream = session->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<float> data(kCount);
  for (int64_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(i % 977);
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    // Milliseconds of work, each launch writing 1.0 everywhere in `out`
    // (grad where self > 0.5): parts landing early would be overwritten.
    for (int launch = 0; launch < 20; ++launch) {
      auto executor = session->ThresholdBackward(
          TensorDesc::Contiguous(grad->handle(), DType::kFloat, {kCount}),
          TensorDesc::Contiguous(self->handle(), DType::kFloat, {kCount}), 0.5,
          TensorDesc::Contiguous(out->handle(), DType::kFloat, {kCount}));
      ASSERT_TRUE(executor.ok()) << executor.status();
      ASSERT_TRUE(executor->Execute(stream->handle()).ok());
    }
    ASSERT_TRUE(
        session->Upload(out->handle(), 0, data.data(), bytes, stream->handle())
            .ok());
    ASSERT_TRUE(stream->Synchronize().ok());
    std::vector<float> back(kCount);
    ASSERT_TRUE(session->Download(out->handle(), 0, back.data(), bytes).ok());
    EXPECT_TRUE(back == data) << "the operator ran after part of the upload";
  }
}

// A split upload the server would refuse writes nothing (it goes as one
// call, refused on its first message), and a session out of streams still
// uploads, in one call.
TEST_F(ClientTest, SplitUploadRefusalsAndFallbacks) {
  server_.reset();
  StartServer("127.0.0.1:0", /*max_streams_per_session=*/2);
  Connection c = Connect(SplitOptions(3), "split_refusals");
  ASSERT_NE(c.session, nullptr);
  Session* session = c.session.get();
  const uint64_t size = 256 << 10;
  auto buffer = session->Malloc(size);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<char> expected(size, 'e');
  ASSERT_TRUE(session->Upload(buffer->handle(), 0, expected.data(), size).ok());
  std::vector<char> other(size + 1, 'o');
  EXPECT_EQ(session->Upload(buffer->handle(), 0, other.data(), size + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Upload(buffer->handle(), 1, other.data(), size).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      session->Upload(buffer->handle() + 1000, 0, other.data(), size).code(),
      absl::StatusCode::kNotFound);
  std::vector<char> back(size);
  ASSERT_TRUE(session->Download(buffer->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(back == expected) << "a refused upload wrote";

  // A session of its own (a split's short-lived streams count against the
  // cap until the server has reaped them): both streams taken first, so
  // the parts have none and each transfer is one call.
  Connection full = Connect(SplitOptions(3), "split_no_streams");
  ASSERT_NE(full.session, nullptr);
  auto first = full.session->CreateStream();
  auto second = full.session->CreateStream();
  ASSERT_TRUE(first.ok() && second.ok());
  auto full_buffer = full.session->Malloc(size);
  ASSERT_TRUE(full_buffer.ok()) << full_buffer.status();
  ASSERT_TRUE(
      full.session->Upload(full_buffer->handle(), 0, other.data(), size).ok());
  ASSERT_TRUE(
      full.session->Download(full_buffer->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), other.begin()));
}

// Upload lends the caller's memory to gRPC without copying it; once it
// returns, nothing may refer to that memory (under ASan a late read of the
// freed vector would be reported), also when the server refuses the upload
// part way through.
TEST_F(ClientTest, UploadLeavesNoReferenceToTheCallersMemory) {
  const size_t size = (3 << 20) + 7;
  auto buffer = session_->Malloc(size);
  ASSERT_TRUE(buffer.ok());
  std::vector<char> expected(size);
  for (size_t i = 0; i < size; ++i) expected[i] = static_cast<char>(i * 7);
  {
    auto data = std::make_unique<std::vector<char>>(expected);
    ASSERT_TRUE(session_->Upload(buffer->handle(), 0, data->data(), size).ok());
    data.reset();  // Freed at once: gRPC must be done with it.
  }
  {
    // Past the end: the server refuses on the first message.
    auto data = std::make_unique<std::vector<char>>(size + 1, 'z');
    EXPECT_EQ(
        session_->Upload(buffer->handle(), 0, data->data(), size + 1).code(),
        absl::StatusCode::kInvalidArgument);
    data->assign(size + 1, 'q');  // Overwritten: must not reach the buffer.
  }
  std::vector<char> back(size);
  ASSERT_TRUE(session_->Download(buffer->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(back == expected) << "buffer changed";
}

// A refused upload whose last message (sent with the end-of-stream flag)
// is the first write to fail must not half-close the call a second time:
// the client called WritesDone after it and gRPC aborted the process with
// GRPC_CALL_ERROR_TOO_MANY_OPERATIONS (CI, once). Two-message uploads past
// the buffer's end, many times, so the server's refusal lands between the
// two writes in some of them.
TEST_F(ClientTest, RefusedUploadEndsCleanlyWhicheverWriteFails) {
  constexpr uint64_t kChunk = 1024;
  ConnectOptions options;
  options.upload_chunk_bytes = kChunk;
  Connection c = Connect(options, "refused");
  ASSERT_NE(c.session, nullptr);
  Session* session = c.session.get();
  auto buffer = session->Malloc(kChunk);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<char> data(2 * kChunk, 'r');
  for (int i = 0; i < 300; ++i) {
    absl::Status status =
        session->Upload(buffer->handle(), 0, data.data(), data.size());
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  // The session still works.
  EXPECT_TRUE(session->Upload(buffer->handle(), 0, data.data(), kChunk).ok());
}

TEST_F(ClientTest, HandlesAreFreedByRaiiAndByClosingTheSession) {
  {
    auto buffer = session_->Malloc(1 << 20);
    ASSERT_TRUE(buffer.ok());
    EXPECT_EQ(ServerBufferBytes(), 1u << 20);
  }
  // GetServerStats is no call of the session: a session call first (it
  // comes after the pipelined Free) orders it.
  ASSERT_TRUE(session_->Stats().ok());
  EXPECT_EQ(ServerBufferBytes(), 0u);
  auto kept = session_->Malloc(4096);
  ASSERT_TRUE(kept.ok());
  kept->Release();  // The session still owns it on the server.
  auto stats = session_->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->buffers(), 1u);
  session_.reset();  // CloseSession; the server frees in the background.
  uint64_t bytes = 1;
  for (int i = 0; i < 2400 && bytes != 0; ++i) {
    bytes = ServerBufferBytes();
    if (bytes != 0) absl::SleepFor(absl::Milliseconds(25));
  }
  EXPECT_EQ(bytes, 0u);
}

// Options out of range are refused before anything is dialled.
TEST_F(ClientTest, ConnectOptionsOutOfRangeAreInvalidArgument) {
  for (int connections : {0, -1, kMaxTransferConnections + 1}) {
    ConnectOptions options;
    options.transfer_connections = connections;
    auto client = Client::Connect(server_->address(), options);
    ASSERT_FALSE(client.ok()) << connections;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(client.status().message(),
              "transfer_connections must be between 1 and 16");
  }
  ConnectOptions options;
  options.max_message_bytes = 0;
  auto client = Client::Connect(server_->address(), options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.status().message(),
            "max_message_bytes must be between 1 and 2 GiB - 1");
  options.max_message_bytes = 1;
  options.transfer_connections = kMaxTransferConnections;
  EXPECT_TRUE(Client::Connect(server_->address(), options).ok());
}

// A refused connection fails at once, saying so: the time-out is never
// waited out (the first-hour review, problem 4), which is the only way the
// error can name the refusal.
TEST_F(ClientTest, RefusedConnectionIsNamedWithoutWaitingOutTheDeadline) {
  ConnectOptions options;
  options.connect_timeout = absl::Minutes(10);
  const std::string address = ClosedPortAddress();
  auto client = Client::Connect(address, options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(),
              HasSubstr("cannot reach opserver at " + address +
                        ": connection refused"));
  EXPECT_EQ(GetAclnnStatus(client.status()), kernels::kAclnnErrRuntimeError);
}

TEST_F(ClientTest, MalformedAddressesAreNamedBeforeDialing) {
  ConnectOptions options;
  options.connect_timeout = absl::Minutes(10);
  for (const auto& [address, why] :
       std::vector<std::pair<std::string, std::string>>{
           {"http://" + server_->address(), "it is a URL (http://)"},
           {"127.0.0.1", "missing ':PORT'"},
           {":50051", "empty host"},
           {"", "the address is empty"}}) {
    auto client = Client::Connect(address, options);
    ASSERT_FALSE(client.ok()) << address;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(client.status().message(),
                HasSubstr("cannot dial '" + address + "': " + why));
    EXPECT_EQ(GetAclnnStatus(client.status()), kernels::kAclnnErrParamInvalid);
  }
}

TEST_F(ClientTest, DeadlineExceededIsReported) {
  // Synchronize waits for ~200 MB of fresh device memory to be computed; a
  // 1 ms wait deadline cannot cover that.
  ConnectOptions options;
  options.wait_timeout = absl::Milliseconds(1);
  auto client = Client::Connect(server_->address(), options);
  ASSERT_TRUE(client.ok());
  auto session = (*client)->CreateSession("deadline");
  ASSERT_TRUE(session.ok());
  const int64_t n = 16 << 20;
  auto a = (*session)->Malloc(n * 4);
  auto b = (*session)->Malloc(n * 4);
  ASSERT_TRUE(a.ok() && b.ok());
  auto executor = (*session)->ThresholdBackward(F32(*a, {n}), F32(*a, {n}), 0,
                                                F32(*b, {n}));
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE(executor->Execute().ok());
  absl::Status status = (*session)->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("SynchronizeStream"));
  EXPECT_EQ(GetAclnnStatus(status), kernels::kAclnnErrRuntimeError);
}

TEST_F(ClientTest, InvalidArgumentsCarryTheExactAclnnStatusPerOperator) {
  DeviceBuffer a = Floats(std::vector<float>(16, 1));
  DeviceBuffer b = Floats(std::vector<float>(16, 1));
  DeviceBuffer c = Floats(std::vector<float>(16, 1));
  TensorDesc int8 = TensorDesc::Contiguous(b.handle(), DType::kInt8, {4});
  struct Case {
    std::string name;
    absl::StatusOr<Executor> result;
    int32_t aclnn;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"threshold dtype mismatch",
       session_->ThresholdBackward(F32(a, {4}), int8, 1, F32(c, {4})), 161002,
       "dtype"});
  cases.push_back(
      {"softshrink negative lambd",
       session_->SoftshrinkBackward(F32(a, {4}), F32(b, {4}), -1, F32(c, {4})),
       161002, "lambd"});
  cases.push_back(
      {"hardswish shape mismatch",
       session_->HardswishBackward(F32(a, {4}), F32(b, {2, 2}), F32(c, {4})),
       161002, "shape"});
  cases.push_back(
      {"leaky negative slope on the result",
       session_->LeakyReluBackward(F32(a, {4}), F32(b, {4}),
                                   {DType::kFloat, -0.5}, true, F32(c, {4})),
       161002, "negativeSlope"});
  cases.push_back(
      {"dropout mask size",
       session_->DropoutBackward(
           F32(a, {8}), TensorDesc::Contiguous(b.handle(), DType::kUint8, {8}),
           2, F32(c, {8})),
       161002, "mask"});
  cases.push_back(
      {"dropout scale",
       session_->DropoutBackward(
           F32(a, {8}), TensorDesc::Contiguous(b.handle(), DType::kUint8, {16}),
           0.5, F32(c, {8})),
       161002, "scale"});
  cases.push_back({"missing self",
                   session_->GetWorkspaceSize(
                       "ThresholdBackward", v1::OpParams(),
                       {{"gradOutput", F32(a, {4})}, {"out", F32(c, {4})}}),
                   161001, "self"});
  for (const Case& c : cases) {
    ASSERT_FALSE(c.result.ok()) << c.name;
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << c.result.status();
    EXPECT_EQ(GetAclnnStatus(c.result.status()), c.aclnn)
        << c.name << ": " << c.result.status();
    EXPECT_THAT(c.result.status().message(), HasSubstr(c.message)) << c.name;
  }
}

TEST_F(ClientTest, UnknownAndConsumedExecutorsAre561103) {
  DeviceBuffer a = Floats({1, 2, 3, 4});
  auto executor =
      session_->ThresholdBackward(F32(a, {4}), F32(a, {4}), 2, F32(a, {4}));
  ASSERT_TRUE(executor.ok());
  const uint64_t handle = executor->handle();
  ASSERT_TRUE(executor->Execute().ok());
  // The RAII object knows it is consumed...
  absl::Status again = executor->Execute();
  EXPECT_EQ(GetAclnnStatus(again), 561103) << again;
  // ...and so does the server.
  absl::Status server_again = session_->ExecuteHandle(handle, 0, 0, 0, 0);
  EXPECT_EQ(server_again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(GetAclnnStatus(server_again), 561103) << server_again;
  EXPECT_THAT(server_again.message(), HasSubstr("already consumed"));

  absl::Status unknown = session_->ExecuteHandle(987654, 0, 0, 0, 0);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(GetAclnnStatus(unknown), 561103) << unknown;

  auto repeatable =
      session_->ThresholdBackward(F32(a, {4}), F32(a, {4}), 2, F32(a, {4}));
  ASSERT_TRUE(repeatable.ok());
  ASSERT_TRUE(repeatable->SetRepeatable().ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(repeatable->Execute().ok());
  const uint64_t repeatable_handle = repeatable->handle();
  ASSERT_TRUE(repeatable->Destroy().ok());
  EXPECT_EQ(
      GetAclnnStatus(session_->ExecuteHandle(repeatable_handle, 0, 0, 0, 0)),
      561103);
}

TEST_F(ClientTest, WorkspaceTooSmallIs161002AndKeepsTheExecutor) {
  // A strided dropout mask is gathered into the workspace.
  DeviceBuffer grad = Floats(std::vector<float>(8, 1));
  DeviceBuffer out = Floats(std::vector<float>(8, 0));
  auto mask = session_->Malloc(32);
  ASSERT_TRUE(mask.ok());
  std::vector<double> bits(32, 0);
  bits[0] = 0xFF;
  ASSERT_TRUE(
      session_->WriteValues(mask->handle(), 0, DType::kUint8, bits).ok());
  TensorDesc mask_desc =
      TensorDesc::Contiguous(mask->handle(), DType::kUint8, {16});
  mask_desc.strides = {2};
  auto executor =
      session_->DropoutBackward(F32(grad, {8}), mask_desc, 2, F32(out, {8}));
  ASSERT_TRUE(executor.ok()) << executor.status();
  const uint64_t needed = executor->workspace_size();
  ASSERT_GT(needed, 0u);
  auto workspace = session_->Malloc(needed);
  ASSERT_TRUE(workspace.ok());
  absl::Status small = executor->Execute(0, workspace->handle(), 0, needed - 1);
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetAclnnStatus(small), 161002) << small;
  absl::Status none = executor->Execute(0, 0, 0, 0);
  EXPECT_EQ(GetAclnnStatus(none), 161002) << none;
  ASSERT_TRUE(executor->Execute(0, workspace->handle()).ok());
  EXPECT_THAT(ReadFloats(out, 8), ElementsAre(2, 2, 2, 2, 2, 2, 2, 2));
}

TEST_F(ClientTest, ServerRestartedUnderTheClientIsACleanError) {
  auto buffer = session_->Malloc(64);
  ASSERT_TRUE(buffer.ok());
  const std::string address = server_->address();
  server_.reset();  // Shuts down; the session is gone with it.
  StartServer(address);
  // The old session is gone: its connection broke with the old server
  // ("went away", UNAVAILABLE), or, when the channel reconnected before
  // the client noticed, the new server does not know it (NOT_FOUND).
  absl::Status status;
  for (int i = 0; i < 600; ++i) {
    status = session_->Malloc(64).status();
    if (absl::IsNotFound(status) ||
        absl::StrContains(status.message(), "went away")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_THAT(status.message(),
              AnyOf(HasSubstr("no session"),
                    HasSubstr("server at " + address + " went away")))
      << status;
  buffer->Release();
  // A new session on the same client works.
  auto fresh = client_->CreateSession("after restart");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE((*fresh)->Malloc(64).ok());
  session_.reset();  // Closing the lost session fails quietly.
}

}  // namespace
}  // namespace remote
}  // namespace opserver
