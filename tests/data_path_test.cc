// The data path (common/data_path.h) against a real Server: the raw
// protocol byte-exact both ways, and every way a client can break it (short
// or long uploads, wrong tickets, never connecting, not reading, cancelling,
// destroying the stream, shutting the server down mid-transfer) ends the
// call with a clear status, closes the connection and leaves the stream
// usable. Then the client library: it uses the data path, and falls back
// to gRPC where the server has none.

#include "common/data_path.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/thread_start.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/opserver.grpc.pb.h"
#include "server/server.h"
#include "testing/closed_port.h"
#include "testing/metrics_scrape.h"
#include "testing/tcp_forwarder.h"

namespace opserver {
namespace {

using remote::Client;
using remote::ConnectOptions;
using remote::Session;
using ::testing::HasSubstr;
using Direction = v1::OpenDataTransferRequest::Direction;
constexpr Direction kUp = v1::OpenDataTransferRequest::DIRECTION_HOST_TO_DEVICE;
constexpr Direction kDown =
    v1::OpenDataTransferRequest::DIRECTION_DEVICE_TO_HOST;

std::string RandomData(size_t size, unsigned seed) {
  std::string data(size, '\0');
  std::mt19937 rng(seed);
  for (char& c : data) c = static_cast<char>(rng());
  return data;
}

// True when the server closed `fd`: end of stream or a reset, within the
// socket's receive timeout.
bool ClosedByServer(int fd) {
  char bytes[4096];
  for (;;) {
    ssize_t n = recv(fd, bytes, sizeof(bytes), 0);
    if (n > 0) continue;  // Data sent before it closed.
    return n == 0 || errno == ECONNRESET || errno == EPIPE;
  }
}

// One OpenDataTransfer call in flight.
struct Open {
  std::unique_ptr<grpc::ClientContext> context =
      std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::OpenDataTransferResponse>> reader;
  v1::OpenDataTransferResponse event;
  bool has_event = false;

  // Drains the call and returns its status.
  grpc::Status Finish() {
    v1::OpenDataTransferResponse more;
    while (reader->Read(&more)) {
      ADD_FAILURE() << "a second event";
    }
    return reader->Finish();
  }
};

class DataPathTest : public ::testing::Test {
 protected:
  void Start(Options options = {}, ConnectOptions connect = {}) {
    StartServer(std::move(options));
    if (server_ != nullptr) Connect(server_->address(), connect);
  }
  // On `device` when given, else on the one `options` names.
  void StartServer(Options options, std::unique_ptr<Device> device = nullptr) {
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    auto server = device != nullptr ? Server::Start(options, std::move(device))
                                    : Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  // client_ and session_, through `address`.
  void Connect(const std::string& address, ConnectOptions options = {}) {
    auto client = Client::Connect(address, options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("data_path_test");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  std::unique_ptr<Open> OpenTransfer(Direction direction, uint64_t buffer,
                                     uint64_t offset, uint64_t size,
                                     uint64_t stream = 0, bool keep = false) {
    auto open = std::make_unique<Open>();
    open->context->set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::OpenDataTransferRequest request;
    request.set_session(session_->token());
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_size(size);
    request.set_stream(stream);
    request.set_direction(direction);
    request.set_keep_connection(keep);
    open->reader =
        client_->runtime().OpenDataTransfer(open->context.get(), request);
    open->has_event = open->reader->Read(&open->event);
    return open;
  }

  // Connects to the data port and presents `ticket`.
  UniqueFd Dial(const std::string& ticket) {
    absl::StatusOr<UniqueFd> fd = ConnectTcp(
        "127.0.0.1", server_->data_port(), absl::Seconds(5), absl::Seconds(30));
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return UniqueFd();
    EXPECT_TRUE(SendAll(fd->get(), ticket.data(), ticket.size()).ok());
    return *std::move(fd);
  }

  // Raw upload of `data` to buffer[offset...] over the data path.
  grpc::Status RawUpload(uint64_t buffer, uint64_t offset,
                         const std::string& data, uint64_t stream = 0) {
    auto open = OpenTransfer(kUp, buffer, offset, data.size(), stream);
    if (!open->has_event) return open->Finish();
    UniqueFd fd = Dial(open->event.ticket());
    EXPECT_TRUE(SendAll(fd.get(), data.data(), data.size()).ok());
    shutdown(fd.get(), SHUT_WR);
    return open->Finish();
  }

  // Through gRPC's Download, so the check does not depend on the data path.
  std::string GrpcDownload(uint64_t buffer, uint64_t offset, uint64_t size) {
    ConnectOptions options;
    options.data_path = false;
    auto client = Client::Connect(server_->address(), options);
    EXPECT_TRUE(client.ok());
    // A second client reaches the first one's session by its token.
    std::string out(size, '\0');
    grpc::ClientContext context;
    v1::DownloadRequest request;
    request.set_session(session_->token());
    request.set_buffer(buffer);
    request.set_offset(offset);
    request.set_size(size);
    auto reader = (*client)->runtime().Download(&context, request);
    v1::DownloadResponse chunk;
    size_t at = 0;
    while (reader->Read(&chunk)) {
      EXPECT_LE(at + chunk.data().size(), size);
      if (at + chunk.data().size() > size) break;
      out.replace(at, chunk.data().size(), chunk.data());
      at += chunk.data().size();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(at, size);
    return out;
  }

  v1::ServerStats Stats() {
    grpc::ClientContext context;
    v1::ServerStats stats;
    EXPECT_TRUE(
        client_->runtime()
            .GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
            .ok());
    return stats;
  }

  // The data port's connections accepted and reused so far, from /metrics
  // (the server must have been started with a metrics_listen).
  std::pair<double, double> DataConnections() {
    const std::string page = scrape::Metrics(server_->metrics_address());
    EXPECT_FALSE(page.empty());
    return {scrape::Sum(page, "opserver_data_port_connections_total"),
            scrape::Sum(page, "opserver_data_port_reused_connections_total")};
  }

  // A Pipeline channel on session_, spoken by hand (the library's own is
  // another call on the same session).
  struct RawChannel {
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<v1::PipelineRequest, v1::PipelineEvent>>
        stream;
    uint64_t fences = 0;

    // Cancelled and read to its end.
    ~RawChannel() {
      context.TryCancel();
      v1::PipelineEvent event;
      while (stream->Read(&event)) {
      }
      stream->Finish().IgnoreError();
    }
  };
  std::unique_ptr<RawChannel> OpenChannel() {
    auto channel = std::make_unique<RawChannel>();
    channel->context.set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    channel->stream = client_->operators().Pipeline(&channel->context);
    v1::PipelineRequest open;
    open.set_session(session_->token());
    EXPECT_TRUE(channel->stream->Write(open));
    return channel;
  }
  // Sends `commands`, then a fence on stream 0, and returns the fence's
  // result (code -1 when the channel ended first).
  v1::FenceResult SendAndFence(RawChannel& channel,
                               std::vector<v1::PipelineCommand> commands) {
    v1::PipelineRequest batch;
    for (v1::PipelineCommand& command : commands) {
      *batch.add_commands() = std::move(command);
    }
    const uint64_t id = ++channel.fences;
    batch.add_commands()->mutable_fence()->set_id(id);
    EXPECT_TRUE(channel.stream->Write(batch));
    v1::PipelineEvent event;
    while (channel.stream->Read(&event)) {
      for (const v1::FenceResult& fence : event.fences()) {
        if (fence.id() == id) return fence;
      }
    }
    v1::FenceResult ended;
    ended.set_code(-1);
    return ended;
  }
  static v1::PipelineCommand DataTransferCommand(Direction direction,
                                                 uint64_t buffer, uint64_t size,
                                                 const std::string& ticket) {
    v1::PipelineCommand command;
    v1::DataTransferCommand& transfer = *command.mutable_data_transfer();
    transfer.set_buffer(buffer);
    transfer.set_size(size);
    transfer.set_direction(direction);
    transfer.set_ticket(ticket);
    return command;
  }
  // A data connection kept by a raw upload of `data` to `buffer` (the
  // server then waits on it for the next ticket).
  UniqueFd KeptConnection(uint64_t buffer, const std::string& data) {
    auto open = OpenTransfer(kUp, buffer, 0, data.size(), 0, /*keep=*/true);
    EXPECT_TRUE(open->has_event);
    EXPECT_TRUE(open->event.keeps_connection());
    UniqueFd fd = Dial(open->event.ticket());
    EXPECT_TRUE(SendAll(fd.get(), data.data(), data.size()).ok());
    char ack = 0;
    EXPECT_EQ(recv(fd.get(), &ack, 1, 0), 1);
    EXPECT_EQ(ack, kDataUploadAck);
    EXPECT_TRUE(open->Finish().ok());
    return fd;
  }
  static std::string NewTicket() {
    absl::StatusOr<std::string> ticket = RandomBytes(kDataTicketBytes);
    EXPECT_TRUE(ticket.ok());
    return ticket.value_or(std::string(kDataTicketBytes, 't'));
  }

  // SynchronizeStream as a call of its own, so it always reaches the
  // server (the library may answer a synchronize itself), ordered after
  // everything queued on `stream` before it.
  void ServerSynchronize(uint64_t stream) {
    grpc::ClientContext context;
    v1::SynchronizeStreamRequest request;
    request.set_session(session_->token());
    request.set_stream(stream);
    v1::SynchronizeStreamResponse response;
    EXPECT_TRUE(client_->runtime()
                    .SynchronizeStream(&context, request, &response)
                    .ok());
  }

  uint64_t MustMalloc(uint64_t size) {
    auto buffer = session_->Malloc(size);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return buffer.ok() ? buffer->Release() : 0;
  }

  // Forwarders a test puts between the client and the server: destroyed
  // after both.
  std::unique_ptr<TcpForwarder> grpc_proxy_;
  std::unique_ptr<TcpForwarder> data_proxy_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Session> session_;
};

// A data-path mover lets go of the stream, the buffer and the session
// before it reports to the transfer's call. Once that call has ended, the
// session closes (Close's fence waits for the stream) and its memory goes,
// although the mover, held here after its report, has not counted itself
// out. A mover that let go only after its report could hold the last
// reference to a session whose server was being destroyed: a
// use-after-free once the server's sessions were gone (ASan saw it in
// capi_async_upload_test, whose server is destroyed right after a
// transfer).
TEST_F(DataPathTest, AMoverHoldsNoSessionOnceItHasReported) {
  // Shared with the mover, which may still be leaving the hook when the
  // test body ends (the server, ended after it, waits for the mover).
  struct Hook {
    absl::Notification reported, release;
    std::atomic<bool> first{true};
  };
  auto hook = std::make_shared<Hook>();
  Options options;
  options.transfer_limits.after_mover_report = [hook] {
    if (!hook->first.exchange(false)) return;
    hook->reported.Notify();
    hook->release.WaitForNotification();
  };
  // A stream the mover still held would keep Close's fence waiting.
  ConnectOptions connect;
  connect.wait_timeout = absl::Seconds(20);
  Start(options, connect);
  // Released however the test ends.
  absl::Cleanup released = [hook] {
    if (!hook->release.HasBeenNotified()) hook->release.Notify();
  };
  const uint64_t size = 4 << 20;
  const std::string data = RandomData(size, 31);
  const uint64_t buffer = MustMalloc(size);
  ASSERT_TRUE(session_->Upload(buffer, 0, data.data(), size).ok());
  // The call ended inside the mover's report; the hook runs just after.
  ASSERT_TRUE(hook->reported.WaitForNotificationWithTimeout(absl::Minutes(1)))
      << "not over the data path";
  absl::Status closed = session_->Close();
  ASSERT_TRUE(closed.ok()) << closed;
  // A closed session's memory goes once nothing holds it (polled: the
  // Attach call may let go just after Close's reply).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  v1::ServerStats stats = Stats();
  while (stats.sessions() != 0 || stats.devices(0).buffers() != 0) {
    ASSERT_LT(absl::Now(), deadline)
        << "the held mover still holds the closed session's buffer";
    absl::SleepFor(absl::Milliseconds(10));
    stats = Stats();
  }
  EXPECT_EQ(stats.devices(0).free_bytes(), stats.devices(0).capacity_bytes());
}

TEST_F(DataPathTest, RawUploadAndDownloadAreByteExact) {
  Start();
  ASSERT_GT(server_->data_port(), 0);
  const uint64_t size = (9 << 20) + 3;  // Several server chunks, and a tail.
  const uint64_t buffer = MustMalloc(size + 7 + 5);
  const std::string data = RandomData(size, 1);
  grpc::Status up = RawUpload(buffer, 7, data);
  ASSERT_TRUE(up.ok()) << up.error_message();
  EXPECT_TRUE(GrpcDownload(buffer, 7, size) == data);

  auto open = OpenTransfer(kDown, buffer, 7, size);
  ASSERT_TRUE(open->has_event);
  EXPECT_EQ(open->event.ticket().size(), kDataTicketBytes);
  EXPECT_EQ(open->event.port(), static_cast<uint32_t>(server_->data_port()));
  UniqueFd fd = Dial(open->event.ticket());
  std::string back(size + 1, '\0');
  absl::StatusOr<size_t> got = RecvFull(fd.get(), back.data(), back.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, size) << "the server sent more or less than asked for";
  back.resize(size);
  EXPECT_TRUE(back == data);
  EXPECT_TRUE(open->Finish().ok());
}

TEST_F(DataPathTest, ShortAndLongUploadsFailAndTheStreamGoesOn) {
  Start();
  const uint64_t buffer = MustMalloc(1 << 20);
  const std::string data = RandomData(1 << 20, 2);

  auto open = OpenTransfer(kUp, buffer, 0, data.size());
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), data.data(), 1000).ok());
  shutdown(fd.get(), SHUT_WR);
  grpc::Status short_upload = open->Finish();
  EXPECT_EQ(short_upload.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(short_upload.error_message(),
              HasSubstr("ended after 1000 of the 1048576 bytes"));

  grpc::Status long_upload = RawUpload(buffer, 0, data + "x");
  // Announced one byte more than the range holds.
  EXPECT_EQ(long_upload.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  open = OpenTransfer(kUp, buffer, 0, 10);
  ASSERT_TRUE(open->has_event);
  fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), data.data(), 11).ok());
  shutdown(fd.get(), SHUT_WR);
  grpc::Status overrun = open->Finish();
  EXPECT_EQ(overrun.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(overrun.error_message(), HasSubstr("sent more than the 10"));

  // The default stream is free again.
  ASSERT_TRUE(RawUpload(buffer, 0, data).ok());
  EXPECT_TRUE(GrpcDownload(buffer, 0, data.size()) == data);
}

// On a device the host cannot address the bytes go through the device's
// staging; a short upload leaves what it received all the same, as on one
// it can (above): the chunk being filled lands as far as it got.
TEST_F(DataPathTest, AShortUploadLeavesWhatItReceivedOnAStagedDevice) {
  Options options;
  options.transfer_limits.chunk_bytes = 1000;
  StartServer(options,
              std::make_unique<FakeDevice>(-1, /*host_addressable=*/false));
  ASSERT_NE(server_, nullptr);
  Connect(server_->address());
  const uint64_t buffer = MustMalloc(4000);
  const std::string data = RandomData(4000, 3);
  auto open = OpenTransfer(kUp, buffer, 0, data.size());
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), data.data(), 2500).ok());
  shutdown(fd.get(), SHUT_WR);
  grpc::Status short_upload = open->Finish();
  EXPECT_EQ(short_upload.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(short_upload.error_message(),
              HasSubstr("ended after 2500 of the 4000 bytes"));
  EXPECT_TRUE(GrpcDownload(buffer, 0, data.size()) ==
              data.substr(0, 2500) + std::string(1500, '\0'));
}

TEST_F(DataPathTest, BadRequestsAreRefusedBeforeAnyTicket) {
  Start();
  const uint64_t buffer = MustMalloc(4096);
  struct Case {
    const char* what;
    Direction direction;
    uint64_t buffer, offset, size, stream;
    grpc::StatusCode code;
  } cases[] = {
      {"no direction", v1::OpenDataTransferRequest::DIRECTION_UNSPECIFIED,
       buffer, 0, 10, 0, grpc::StatusCode::INVALID_ARGUMENT},
      {"past the end", kUp, buffer, 4000, 100, 0,
       grpc::StatusCode::INVALID_ARGUMENT},
      {"offset overflow", kDown, buffer, ~uint64_t{0}, 2, 0,
       grpc::StatusCode::INVALID_ARGUMENT},
      {"unknown buffer", kUp, buffer + 1000, 0, 10, 0,
       grpc::StatusCode::NOT_FOUND},
      {"unknown stream", kDown, buffer, 0, 10, 777,
       grpc::StatusCode::NOT_FOUND},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto open = OpenTransfer(c.direction, c.buffer, c.offset, c.size, c.stream);
    EXPECT_FALSE(open->has_event);
    grpc::Status status = open->Finish();
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
  }
}

TEST_F(DataPathTest, AWrongTicketIsClosedAndTheRightOneStillWorks) {
  Start();
  const uint64_t buffer = MustMalloc(4096);
  const std::string data = RandomData(4096, 3);
  auto open = OpenTransfer(kUp, buffer, 0, data.size());
  ASSERT_TRUE(open->has_event);
  std::string wrong = open->event.ticket();
  wrong.back() ^= 0x40;
  UniqueFd intruder = Dial(wrong);
  ASSERT_TRUE(intruder.valid());
  EXPECT_TRUE(ClosedByServer(intruder.get()));
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), data.data(), data.size()).ok());
  shutdown(fd.get(), SHUT_WR);
  EXPECT_TRUE(open->Finish().ok());
  // A ticket is good for one connection: replayed, it is refused.
  UniqueFd replay = Dial(open->event.ticket());
  EXPECT_TRUE(ClosedByServer(replay.get()));
  EXPECT_TRUE(GrpcDownload(buffer, 0, data.size()) == data);
}

TEST_F(DataPathTest, IdleClientsAreEndedByTheTransferIdleTimeout) {
  Options options;
  options.transfer_limits.idle_timeout = absl::Milliseconds(300);
  Start(options);
  const uint64_t buffer = MustMalloc(32 << 20);

  // Never connects: the ticket dies with the call.
  auto open = OpenTransfer(kUp, buffer, 0, 1000);
  ASSERT_TRUE(open->has_event);
  grpc::Status never = open->Finish();
  EXPECT_EQ(never.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(never.error_message(), HasSubstr("--transfer_idle_timeout_s"));
  UniqueFd late = Dial(open->event.ticket());
  EXPECT_TRUE(ClosedByServer(late.get()));

  // Connects, then stops sending.
  open = OpenTransfer(kUp, buffer, 0, 1000);
  ASSERT_TRUE(open->has_event);
  UniqueFd stalled = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(stalled.get(), "abc", 3).ok());
  EXPECT_EQ(open->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(ClosedByServer(stalled.get()));

  // A download whose client never reads: the server's send blocks on a
  // full socket until the watchdog wakes it.
  open = OpenTransfer(kDown, buffer, 0, 32 << 20);
  ASSERT_TRUE(open->has_event);
  UniqueFd deaf = Dial(open->event.ticket());
  EXPECT_EQ(open->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);

  // The stream is free again.
  const std::string data = RandomData(1000, 4);
  ASSERT_TRUE(RawUpload(buffer, 0, data).ok());
}

// A slow upload that keeps moving is not idle, however far it is from
// the end of a chunk: here 40 KiB in 1 KiB pieces, 100 ms apart, take
// 4 s against a 3 s idle timeout and a 4 MiB chunk (a gap between two
// pieces would have to stretch 30 times on a loaded machine to look idle).
TEST_F(DataPathTest, ASlowButMovingUploadIsNotIdle) {
  Options options;
  options.transfer_limits.idle_timeout = absl::Seconds(3);
  Start(options);
  const std::string data = RandomData(40 << 10, 12);
  const uint64_t buffer = MustMalloc(data.size());
  auto open = OpenTransfer(kUp, buffer, 0, data.size());
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  for (size_t at = 0; at < data.size(); at += 1024) {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(SendAll(fd.get(), data.data() + at, 1024).ok());
  }
  shutdown(fd.get(), SHUT_WR);
  grpc::Status status = open->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(GrpcDownload(buffer, 0, data.size()) == data);
}

TEST_F(DataPathTest, CancellingTheCallClosesTheDataConnection) {
  Start();
  const uint64_t buffer = MustMalloc(1 << 20);
  auto open = OpenTransfer(kUp, buffer, 0, 1 << 20);
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), "some", 4).ok());
  open->context->TryCancel();
  EXPECT_EQ(open->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(ClosedByServer(fd.get()));
  const std::string data = RandomData(1 << 20, 5);
  ASSERT_TRUE(RawUpload(buffer, 0, data).ok());
}

TEST_F(DataPathTest, DestroyingTheStreamEndsATransferInFlight) {
  Start();
  const uint64_t buffer = MustMalloc(1 << 20);
  auto stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const uint64_t handle = stream->handle();
  auto open = OpenTransfer(kUp, buffer, 0, 1 << 20, handle);
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), "some", 4).ok());
  std::thread destroy(
      [&] { EXPECT_TRUE(session_->DestroyStream(handle).ok()); });
  grpc::Status status = open->Finish();
  destroy.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_THAT(status.error_message(), HasSubstr("stream was destroyed"));
  EXPECT_TRUE(ClosedByServer(fd.get()));
}

// The race behind a rare failure of the test above, made certain: the
// client has the reply (ticket and port), but the server's reaction to
// that write has not run yet when the stream is destroyed. The client must
// still get the server's reason, not gRPC's "Cancelled on the server
// side" (the call used to be cancelled at once when a write was in
// flight).
TEST_F(DataPathTest, DestroyingTheStreamDuringALateWriteKeepsTheReason) {
  absl::Notification release;
  std::atomic<bool> hold{false};
  Options options;
  options.transfer_limits.before_write_done = [&] {
    if (hold.exchange(false)) {
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
  };
  Start(options);
  const uint64_t buffer = MustMalloc(1 << 20);
  auto stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const uint64_t handle = stream->handle();
  hold = true;  // The reply's write is the next one done.
  auto open = OpenTransfer(kUp, buffer, 0, 1 << 20, handle);
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), "some", 4).ok());
  std::thread destroy(
      [&] { EXPECT_TRUE(session_->DestroyStream(handle).ok()); });
  // The connection closes when the transfer is aborted: the abort has
  // happened while its write still counts as in flight.
  EXPECT_TRUE(ClosedByServer(fd.get()));
  EXPECT_FALSE(release.HasBeenNotified());
  release.Notify();
  grpc::Status status = open->Finish();
  destroy.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_THAT(status.error_message(), HasSubstr("stream was destroyed"));
}

TEST_F(DataPathTest, ShutdownEndsATransferInFlight) {
  Options options;
  options.shutdown_grace = absl::Milliseconds(200);
  Start(options);
  const uint64_t buffer = MustMalloc(1 << 20);
  auto open = OpenTransfer(kUp, buffer, 0, 1 << 20);
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), "some", 4).ok());
  // The session stays open: closing it would first wait for its default
  // stream, which the stalled transfer holds (until the idle timeout).
  server_->Shutdown();
  EXPECT_FALSE(open->Finish().ok());
  EXPECT_TRUE(ClosedByServer(fd.get()));
  server_.reset();  // Waits for the transfer's thread; must not hang.
}

// A transfer whose bytes need a thread when none can be started (as under
// RLIMIT_NPROC or a container's pids limit) is refused with
// RESOURCE_EXHAUSTED and its connection closed; the server goes on, and
// the next transfer, with threads again, works.
TEST_F(DataPathTest, NoThreadForTheBytesIsResourceExhausted) {
  std::atomic<bool> refuse{true};
  Options options;
  options.transfer_limits.start_thread = [&](std::function<void()> run) {
    if (refuse.load()) {
      throw std::system_error(EAGAIN, std::generic_category(),
                              "Resource temporarily unavailable");
    }
    std::thread(std::move(run)).detach();
  };
  Start(options);
  const uint64_t buffer = MustMalloc(1 << 20);
  const std::string data = RandomData(1 << 20, 11);
  auto open = OpenTransfer(kUp, buffer, 0, data.size());
  ASSERT_TRUE(open->has_event);
  UniqueFd fd = Dial(open->event.ticket());
  // The server may close the connection while this is sent: either way.
  SendAll(fd.get(), data.data(), data.size()).IgnoreError();
  grpc::Status refused = open->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("cannot start a thread"));
  EXPECT_TRUE(ClosedByServer(fd.get()));

  refuse = false;
  ASSERT_TRUE(RawUpload(buffer, 0, data).ok());
  EXPECT_TRUE(GrpcDownload(buffer, 0, data.size()) == data);
  EXPECT_EQ(Stats().data_path_transfers(), 1u);
}

// The client library moves large transfers over the data path: with
// messages capped below the library's upload chunk, gRPC's Upload cannot
// work, and with the data path the same upload does.
TEST_F(DataPathTest, TheClientLibraryUsesTheDataPath) {
  Options options;
  options.transfer_limits.max_message_bytes = 256 << 10;
  options.transfer_limits.chunk_bytes = 128 << 10;
  Start(options);
  const uint64_t size = (8 << 20) + 1;
  const std::string data = RandomData(size, 6);
  auto buffer = session_->Malloc(size);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(session_->Upload(buffer->handle(), 0, data.data(), size).ok());
  std::string back(size, '\0');
  ASSERT_TRUE(session_->Download(buffer->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(back == data);
  v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_port(), static_cast<uint32_t>(server_->data_port()));
  EXPECT_EQ(stats.data_path_transfers(), 2u);
  EXPECT_EQ(stats.data_path_bytes(), 2 * size);
  EXPECT_EQ(stats.grpc_transfer_bytes(), 0u);
  // Under data_path_bytes, and with the data path off: gRPC, which the
  // message cap refuses.
  const std::string small(2 << 20, 's');
  EXPECT_EQ(
      session_->Upload(buffer->handle(), 0, small.data(), small.size()).code(),
      absl::StatusCode::kResourceExhausted);
  ConnectOptions off;
  off.data_path = false;
  auto client = Client::Connect(server_->address(), off);
  ASSERT_TRUE(client.ok());
  auto session = (*client)->CreateSession("no_data_path");
  ASSERT_TRUE(session.ok());
  auto other = (*session)->Malloc(size);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*session)->Upload(other->handle(), 0, data.data(), size).code(),
            absl::StatusCode::kResourceExhausted);
}

// Data connections that the server closes before taking their ticket (as
// a listener flooded with connections may): the library retries the same
// ticket on a new connection, and once retries are spent it cancels the
// call and moves the bytes through gRPC instead. Either way the user's
// Upload and Download succeed, byte-exact.
TEST_F(DataPathTest, TheLibraryRetriesADroppedConnectionThenFallsBack) {
  std::atomic<int> drop{0};  // How many accepted connections to close.
  std::atomic<int> accepted{0};
  Options options;
  options.data_drop_accepted = [&] {
    accepted.fetch_add(1);
    int left = drop.load();
    while (left > 0 && !drop.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  };
  // A connection per transfer, so each transfer dials (kept connections:
  // TheLibraryDialsAgainWhenAKeptConnectionIsGone).
  ConnectOptions connect;
  connect.keep_data_connections = false;
  Start(options, connect);
  const uint64_t size = (8 << 20) + 5;
  auto buffer = session_->Malloc(size);
  ASSERT_TRUE(buffer.ok());

  // One connection dropped per transfer: the retry goes through.
  const std::string data = RandomData(size, 13);
  drop = 1;
  ASSERT_TRUE(session_->Upload(buffer->handle(), 0, data.data(), size).ok());
  drop = 1;
  std::string back(size, '\0');
  ASSERT_TRUE(session_->Download(buffer->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(back == data);
  EXPECT_EQ(accepted.load(), 4);
  v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_path_transfers(), 2u);
  EXPECT_EQ(stats.grpc_transfers(), 0u);

  // Every connection dropped: gRPC moves the bytes.
  const std::string other = RandomData(size, 14);
  drop = 1000;
  ASSERT_TRUE(session_->Upload(buffer->handle(), 0, other.data(), size).ok());
  ASSERT_TRUE(session_->Download(buffer->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(back == other);
  EXPECT_TRUE(GrpcDownload(buffer->handle(), 0, size) == other);
  stats = Stats();
  EXPECT_EQ(stats.data_path_transfers(), 2u);
  EXPECT_GE(stats.grpc_transfers(), 2u);
  drop = 0;
}

// The raw protocol of a kept connection (keep_connection): an upload ends
// with the server's acknowledgement instead of a half-close, a download
// with its last byte, and the next transfer's ticket follows on the same
// connection. A transfer without keep_connection ends it as before.
TEST_F(DataPathTest, AKeptConnectionCarriesTheNextTransfers) {
  Options options;
  options.metrics_listen = "127.0.0.1:0";
  Start(options);
  const std::string data = RandomData((1 << 20) + 3, 31);
  const uint64_t buffer = MustMalloc(data.size());
  auto up = OpenTransfer(kUp, buffer, 0, data.size(), 0, /*keep=*/true);
  ASSERT_TRUE(up->has_event);
  EXPECT_TRUE(up->event.keeps_connection());
  UniqueFd fd = Dial(up->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), data.data(), data.size()).ok());
  char ack = 0;
  ASSERT_EQ(recv(fd.get(), &ack, 1, 0), 1);
  EXPECT_EQ(ack, kDataUploadAck);
  ASSERT_TRUE(up->Finish().ok());

  auto down = OpenTransfer(kDown, buffer, 0, data.size(), 0, /*keep=*/true);
  ASSERT_TRUE(down->has_event);
  ASSERT_TRUE(SendAll(fd.get(), down->event.ticket().data(),
                      down->event.ticket().size())
                  .ok());
  std::string back(data.size(), '\0');
  absl::StatusOr<size_t> got = RecvFull(fd.get(), back.data(), back.size());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, data.size());
  EXPECT_TRUE(back == data);
  ASSERT_TRUE(down->Finish().ok());

  auto last = OpenTransfer(kDown, buffer, 5, 16);
  ASSERT_TRUE(last->has_event);
  EXPECT_FALSE(last->event.keeps_connection());
  ASSERT_TRUE(SendAll(fd.get(), last->event.ticket().data(),
                      last->event.ticket().size())
                  .ok());
  char tail[16];
  got = RecvFull(fd.get(), tail, sizeof(tail));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::string(tail, *got), data.substr(5, 16));
  EXPECT_TRUE(ClosedByServer(fd.get()));
  ASSERT_TRUE(last->Finish().ok());
  EXPECT_EQ(DataConnections(), std::make_pair(1.0, 2.0));
}

// A kept connection after a transfer that did not end well is closed, not
// kept: what is left on it is unknown. Bytes past a kept upload's end are
// not taken for a transfer: no ticket starts so, and the connection is
// closed after the upload's acknowledgement.
TEST_F(DataPathTest, AKeptConnectionEndsWithAnythingButAGoodEnd) {
  Start();
  const std::string data = RandomData(1 << 20, 32);
  const uint64_t buffer = MustMalloc(data.size());
  // Short: the half-close comes before the announced size.
  auto up = OpenTransfer(kUp, buffer, 0, data.size(), 0, /*keep=*/true);
  ASSERT_TRUE(up->has_event);
  UniqueFd fd = Dial(up->event.ticket());
  ASSERT_TRUE(SendAll(fd.get(), data.data(), data.size() / 2).ok());
  shutdown(fd.get(), SHUT_WR);
  EXPECT_TRUE(ClosedByServer(fd.get()));
  EXPECT_EQ(up->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // Long: the transfer takes exactly its bytes, and the rest closes it.
  up = OpenTransfer(kUp, buffer, 0, data.size(), 0, /*keep=*/true);
  ASSERT_TRUE(up->has_event);
  fd = Dial(up->event.ticket());
  const std::string more = data + std::string(kDataTicketBytes, '\xff');
  ASSERT_TRUE(SendAll(fd.get(), more.data(), more.size()).ok());
  char ack = 0;
  ASSERT_EQ(recv(fd.get(), &ack, 1, 0), 1);
  EXPECT_EQ(ack, kDataUploadAck);
  EXPECT_TRUE(up->Finish().ok());
  EXPECT_TRUE(ClosedByServer(fd.get()));
  EXPECT_TRUE(GrpcDownload(buffer, 0, data.size()) == data);
}

// The library keeps its data connection: every transfer after the first
// goes over the one connection, byte-exact. Without
// keep_data_connections, each dials its own.
TEST_F(DataPathTest, TheLibraryKeepsItsDataConnection) {
  Options options;
  options.metrics_listen = "127.0.0.1:0";
  Start(options);
  const uint64_t size = (4 << 20) + 7;
  const uint64_t buffer = MustMalloc(size);
  for (unsigned i = 0; i < 3; ++i) {
    const std::string data = RandomData(size, 40 + i);
    ASSERT_TRUE(session_->Upload(buffer, 0, data.data(), size).ok());
    std::string back(size, '\0');
    ASSERT_TRUE(session_->Download(buffer, 0, back.data(), size).ok());
    EXPECT_TRUE(back == data) << "round " << i;
  }
  EXPECT_EQ(DataConnections(), std::make_pair(1.0, 5.0));
  EXPECT_EQ(Stats().data_path_transfers(), 6u);

  ConnectOptions off;
  off.keep_data_connections = false;
  auto client = Client::Connect(server_->address(), off);
  ASSERT_TRUE(client.ok());
  auto session = (*client)->CreateSession("no_kept_connections");
  ASSERT_TRUE(session.ok());
  auto other = (*session)->Malloc(size);
  ASSERT_TRUE(other.ok());
  const std::string data = RandomData(size, 49);
  std::string back(size, '\0');
  ASSERT_TRUE((*session)->Upload(other->handle(), 0, data.data(), size).ok());
  ASSERT_TRUE((*session)->Download(other->handle(), 0, back.data(), size).ok());
  EXPECT_TRUE(back == data);
  EXPECT_EQ(DataConnections(), std::make_pair(3.0, 5.0));
}

// A kept connection the server has closed by the time the next ticket
// comes on it (as a listener may close an idle one just after the library
// checked it): the library dials again with the same ticket, and the
// transfer succeeds on the new connection, byte-exact, both ways.
TEST_F(DataPathTest, TheLibraryDialsAgainWhenAKeptConnectionIsGone) {
  std::atomic<bool> drop{false};
  Options options;
  options.metrics_listen = "127.0.0.1:0";
  options.data_drop_kept = [&] { return drop.exchange(false); };
  Start(options);
  const uint64_t size = (4 << 20) + 9;
  const uint64_t buffer = MustMalloc(size);
  const std::string data = RandomData(size, 50);
  ASSERT_TRUE(session_->Upload(buffer, 0, data.data(), size).ok());
  drop = true;
  std::string back(size, '\0');
  ASSERT_TRUE(session_->Download(buffer, 0, back.data(), size).ok());
  EXPECT_FALSE(drop.load());  // The kept connection was dropped.
  EXPECT_TRUE(back == data);
  const std::string other = RandomData(size, 51);
  drop = true;
  ASSERT_TRUE(session_->Upload(buffer, 0, other.data(), size).ok());
  EXPECT_FALSE(drop.load());
  EXPECT_TRUE(GrpcDownload(buffer, 0, size) == other);
  EXPECT_EQ(DataConnections(), std::make_pair(3.0, 0.0));
  const v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_path_transfers(), 3u);
  EXPECT_EQ(stats.grpc_transfers(), 1u);  // GrpcDownload.
}

// A server without the data path answers UNIMPLEMENTED, and the library
// falls back to gRPC's Upload and Download, byte-exact.
TEST_F(DataPathTest, WithoutADataPathTheLibraryFallsBackToGrpc) {
  Options options;
  options.data_port = -1;
  Start(options);
  EXPECT_EQ(server_->data_port(), 0);
  auto buffer = session_->Malloc(8 << 20);
  ASSERT_TRUE(buffer.ok());
  auto open = OpenTransfer(kUp, buffer->handle(), 0, 10);
  EXPECT_FALSE(open->has_event);
  grpc::Status status = open->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--data_port=-1"));
  const std::string data = RandomData(8 << 20, 7);
  for (int round = 0; round < 2; ++round) {  // Before and after the verdict.
    ASSERT_TRUE(
        session_->Upload(buffer->handle(), 0, data.data(), data.size()).ok());
    std::string back(data.size(), '\0');
    ASSERT_TRUE(
        session_->Download(buffer->handle(), 0, back.data(), back.size()).ok());
    EXPECT_TRUE(back == data);
  }
  v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_port(), 0u);
  EXPECT_EQ(stats.data_path_transfers(), 0u);
  EXPECT_EQ(stats.grpc_transfers(), 4u);
  EXPECT_EQ(stats.grpc_transfer_bytes(), 4 * data.size());
}

// The pipelined data_transfer command on a kept connection, by hand: a
// download and an upload, byte-exact, each ordered on its stream where the
// command stands; and a ticket sent before its command (the client need
// not wait for the server) is parked and taken once the command comes.
TEST_F(DataPathTest, ADataTransferCommandMovesItsBytesOverAKeptConnection) {
  Start();
  const uint64_t size = (1 << 20) + 3;
  const uint64_t buffer = MustMalloc(size);
  const std::string data = RandomData(size, 70);
  UniqueFd fd = KeptConnection(buffer, data);
  auto channel = OpenChannel();

  const std::string down_ticket = NewTicket();
  std::vector<v1::PipelineCommand> down;
  down.push_back(DataTransferCommand(kDown, buffer, size, down_ticket));
  v1::PipelineRequest batch;
  *batch.add_commands() = down[0];
  ASSERT_TRUE(channel->stream->Write(batch));
  ASSERT_TRUE(SendAll(fd.get(), down_ticket.data(), down_ticket.size()).ok());
  std::string back(size, '\0');
  absl::StatusOr<size_t> got = RecvFull(fd.get(), back.data(), size);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, size);
  EXPECT_TRUE(back == data);

  // The ticket first, then the command.
  const std::string other = RandomData(size, 71);
  const std::string up_ticket = NewTicket();
  ASSERT_TRUE(SendAll(fd.get(), up_ticket.data(), up_ticket.size()).ok());
  ASSERT_TRUE(SendAll(fd.get(), other.data(), other.size()).ok());
  std::vector<v1::PipelineCommand> up;
  up.push_back(DataTransferCommand(kUp, buffer, size, up_ticket));
  v1::FenceResult fence = SendAndFence(*channel, std::move(up));
  EXPECT_EQ(fence.code(), 0) << fence.message();
  char ack = 0;
  EXPECT_EQ(recv(fd.get(), &ack, 1, 0), 1);
  EXPECT_EQ(ack, kDataUploadAck);
  EXPECT_TRUE(GrpcDownload(buffer, 0, size) == other);
  const v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_path_transfers(), 3u);
}

// A data_transfer the server refuses is its stream's deferred error, with
// the exact status, and the connection that presents its ticket is
// closed (its client does not wait for bytes that never move); the
// stream and the session work on.
TEST_F(DataPathTest, ARefusedDataTransferFailsItsStreamAndClosesItsConnection) {
  Start();
  const uint64_t size = 1 << 20;
  const uint64_t buffer = MustMalloc(size);
  UniqueFd fd = KeptConnection(buffer, RandomData(size, 72));
  auto channel = OpenChannel();
  const std::string ticket = NewTicket();
  ASSERT_TRUE(SendAll(fd.get(), ticket.data(), ticket.size()).ok());
  std::vector<v1::PipelineCommand> commands;
  commands.push_back(DataTransferCommand(kUp, buffer, size + 1, ticket));
  v1::FenceResult fence = SendAndFence(*channel, std::move(commands));
  // As OpenDataTransfer refuses it.
  EXPECT_EQ(fence.code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(fence.message(), HasSubstr("data transfer of buffer"));
  EXPECT_THAT(fence.message(),
              HasSubstr("upload range [0, 0 + 1048577) reaches outside the "
                        "buffer of 1048576 bytes"));
  EXPECT_TRUE(ClosedByServer(fd.get()));
  // A malformed ticket and a missing direction are refused the same way.
  for (auto [direction, bad] : {std::pair<Direction, std::string>{kUp, "short"},
                                {Direction(), NewTicket()}}) {
    std::vector<v1::PipelineCommand> more;
    more.push_back(DataTransferCommand(direction, buffer, size, bad));
    fence = SendAndFence(*channel, std::move(more));
    EXPECT_EQ(fence.code(),
              static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  }
  fence = SendAndFence(*channel, {});
  EXPECT_EQ(fence.code(), 0) << fence.message();
  EXPECT_TRUE(session_->Malloc(64).ok());
}

// A data_transfer whose connection never comes fails its stream after the
// server's transfer idle time-out, and lets the stream go on.
TEST_F(DataPathTest, ADataTransferWithoutItsConnectionFailsAtTheIdleTimeout) {
  Options options;
  options.transfer_limits.idle_timeout = absl::Milliseconds(300);
  Start(options);
  const uint64_t size = 1 << 20;
  const uint64_t buffer = MustMalloc(size);
  auto channel = OpenChannel();
  std::vector<v1::PipelineCommand> commands;
  commands.push_back(DataTransferCommand(kUp, buffer, size, NewTicket()));
  v1::FenceResult fence = SendAndFence(*channel, std::move(commands));
  EXPECT_EQ(fence.code(),
            static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(fence.message(), HasSubstr("no connection presented its ticket"));
  fence = SendAndFence(*channel, {});
  EXPECT_EQ(fence.code(), 0) << fence.message();
}

// One its client cancels (cancel_data_transfer) ends at once, quietly:
// the fence would otherwise wait for the idle time-out and report it.
TEST_F(DataPathTest, ACancelledDataTransferEndsQuietly) {
  Options options;
  options.transfer_limits.idle_timeout = absl::Seconds(600);
  Start(options);
  const uint64_t size = 1 << 20;
  const uint64_t buffer = MustMalloc(size);
  auto channel = OpenChannel();
  const std::string ticket = NewTicket();
  std::vector<v1::PipelineCommand> commands;
  commands.push_back(DataTransferCommand(kDown, buffer, size, ticket));
  v1::PipelineCommand cancel;
  cancel.set_cancel_data_transfer(ticket);
  commands.push_back(cancel);
  v1::FenceResult fence = SendAndFence(*channel, std::move(commands));
  EXPECT_EQ(fence.code(), 0) << fence.message();
  EXPECT_EQ(Stats().data_path_transfers(), 0u);
}

// A session holds at most kMaxPipelinedTransfersPerSession data_transfer
// commands at once (a gate is no task: the stream's queue cap does not
// bound them): one more is refused, its stream's error, and cancelling
// the others lets the stream go on.
TEST_F(DataPathTest, DataTransfersInFlightAreBoundedPerSession) {
  Options options;
  options.transfer_limits.idle_timeout = absl::Seconds(600);
  Start(options);
  const uint64_t size = 1 << 20;
  const uint64_t buffer = MustMalloc(size);
  auto channel = OpenChannel();
  const size_t most = RuntimeService::kMaxPipelinedTransfersPerSession;
  std::vector<std::string> tickets;
  std::vector<v1::PipelineCommand> commands;
  for (size_t i = 0; i <= most; ++i) {
    tickets.push_back(NewTicket());
    commands.push_back(DataTransferCommand(kUp, buffer, size, tickets.back()));
  }
  for (const std::string& ticket : tickets) {
    v1::PipelineCommand cancel;
    cancel.set_cancel_data_transfer(ticket);
    commands.push_back(std::move(cancel));
  }
  v1::FenceResult fence = SendAndFence(*channel, std::move(commands));
  EXPECT_EQ(fence.code(),
            static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_THAT(fence.message(),
              HasSubstr("already has 64 data_transfer commands in flight"));
  fence = SendAndFence(*channel, {});
  EXPECT_EQ(fence.code(), 0) << fence.message();
  // All ended: as many may start again.
  commands.clear();
  tickets.clear();
  for (size_t i = 0; i < most; ++i) {
    tickets.push_back(NewTicket());
    commands.push_back(DataTransferCommand(kUp, buffer, size, tickets.back()));
  }
  for (const std::string& ticket : tickets) {
    v1::PipelineCommand cancel;
    cancel.set_cancel_data_transfer(ticket);
    commands.push_back(std::move(cancel));
  }
  fence = SendAndFence(*channel, std::move(commands));
  EXPECT_EQ(fence.code(), 0) << fence.message();
}

// A data_transfer stalled in the middle of its bytes does not hold up the
// server's shutdown: no call of its own is cancelled then, so the server
// ends it.
TEST_F(DataPathTest, ShutdownEndsAStalledDataTransfer) {
  Options options;
  options.shutdown_grace = absl::Milliseconds(200);
  Start(options);
  const uint64_t size = 1 << 20;
  const uint64_t buffer = MustMalloc(size);
  UniqueFd fd = KeptConnection(buffer, RandomData(size, 73));
  auto channel = OpenChannel();
  const std::string ticket = NewTicket();
  v1::PipelineRequest batch;
  *batch.add_commands() = DataTransferCommand(kUp, buffer, size, ticket);
  ASSERT_TRUE(channel->stream->Write(batch));
  ASSERT_TRUE(SendAll(fd.get(), ticket.data(), ticket.size()).ok());
  ASSERT_TRUE(SendAll(fd.get(), "some", 4).ok());
  // The command has taken effect: the transfer is the server's.
  v1::PipelineEvent event;
  while (event.acknowledged() < 1 && channel->stream->Read(&event)) {
  }
  ASSERT_EQ(event.acknowledged(), 1u);
  server_->Shutdown();
  EXPECT_TRUE(ClosedByServer(fd.get()));
  channel->context.TryCancel();
  server_.reset();  // Waits for the mover; must not hang.
}

// The library's UploadAsync and DownloadAsync: once a transfer has kept a
// data connection, each goes as a data_transfer command on the session's
// channel over it, with no call of its own; byte-exact, and a
// synchronize after them reports nothing. With
// ConnectOptions::pipelined_data_transfers off, each opens a call.
TEST_F(DataPathTest, AsyncCopiesGoAsDataTransferCommands) {
  Options options;
  options.metrics_listen = "127.0.0.1:0";
  Start(options);
  const uint64_t size = (4 << 20) + 11;
  const uint64_t buffer = MustMalloc(size);
  for (unsigned i = 0; i < 3; ++i) {
    const std::string data = RandomData(size, 80 + i);
    absl::StatusOr<remote::PendingRead> up =
        session_->UploadAsync(buffer, 0, data.data(), size);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE(up->Wait().ok());
    std::string back(size, '\0');
    absl::StatusOr<remote::PendingRead> down =
        session_->DownloadAsync(buffer, 0, back.data(), size);
    ASSERT_TRUE(down.ok()) << down.status();
    ASSERT_TRUE(down->Wait().ok());
    EXPECT_TRUE(back == data) << "round " << i;
  }
  EXPECT_TRUE(session_->Synchronize(0).ok());
  auto counts = [&] {
    const std::string page = scrape::Metrics(server_->metrics_address());
    return std::make_pair(scrape::Sum(page, "opserver_pipeline_commands_total",
                                      "command=\"data_transfer\""),
                          scrape::Sum(page, "grpc_server_call_started_total",
                                      "OpenDataTransfer"));
  };
  // The first opened the connection with a call.
  EXPECT_EQ(counts(), std::make_pair(5.0, 1.0));
  EXPECT_EQ(DataConnections(), std::make_pair(1.0, 5.0));

  ConnectOptions off;
  off.pipelined_data_transfers = false;
  auto client = Client::Connect(server_->address(), off);
  ASSERT_TRUE(client.ok());
  auto session = (*client)->CreateSession("no_pipelined_data_transfers");
  ASSERT_TRUE(session.ok());
  auto other = (*session)->Malloc(size);
  ASSERT_TRUE(other.ok());
  for (unsigned i = 0; i < 2; ++i) {
    const std::string data = RandomData(size, 90 + i);
    std::string back(size, '\0');
    absl::StatusOr<remote::PendingRead> up =
        (*session)->UploadAsync(other->handle(), 0, data.data(), size);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE(up->Wait().ok());
    absl::StatusOr<remote::PendingRead> down =
        (*session)->DownloadAsync(other->handle(), 0, back.data(), size);
    ASSERT_TRUE(down.ok()) << down.status();
    ASSERT_TRUE(down->Wait().ok());
    EXPECT_TRUE(back == data);
  }
  EXPECT_EQ(counts(), std::make_pair(5.0, 5.0));
}

// The library gives up a data_transfer whose server refused it: the copy
// fails at once (the server closed the connection that presented its
// ticket, and the connections it dialed again), and the stream's next
// synchronize reports why. Here the buffer was freed behind the library's
// back, by another client of the session.
TEST_F(DataPathTest, ARefusedAsyncCopyFailsAndItsStreamSaysWhy) {
  Start();
  const uint64_t size = (4 << 20) + 13;
  const uint64_t buffer = MustMalloc(size);
  const std::string data = RandomData(size, 74);
  absl::StatusOr<remote::PendingRead> first =
      session_->UploadAsync(buffer, 0, data.data(), size);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->Wait().ok());  // The connection is kept now.
  auto other = Client::Connect(server_->address(), ConnectOptions());
  ASSERT_TRUE(other.ok());
  grpc::ClientContext context;
  v1::FreeRequest request;
  request.set_session(session_->token());
  request.set_buffer(buffer);
  v1::FreeResponse response;
  ASSERT_TRUE((*other)->runtime().Free(&context, request, &response).ok());
  absl::StatusOr<remote::PendingRead> refused =
      session_->UploadAsync(buffer, 0, data.data(), size);
  ASSERT_TRUE(refused.ok()) << refused.status();
  const absl::Status moved = refused->Wait();
  EXPECT_EQ(moved.code(), absl::StatusCode::kUnavailable) << moved;
  EXPECT_THAT(moved.message(), HasSubstr("stream's deferred error says why"));
  const absl::Status synced = session_->Synchronize(0);
  EXPECT_EQ(synced.code(), absl::StatusCode::kNotFound) << synced;
  EXPECT_THAT(synced.message(), HasSubstr("data transfer of buffer"));
  EXPECT_TRUE(session_->Synchronize(0).ok());
}

// The movers of data-path transfers, held by the test until it lets them
// run (TransferLimits::start_thread): a transfer whose connection arrived
// moves nothing before that, whatever the machine's speed.
class HeldMovers {
 public:
  std::function<void(std::function<void()>)> Starter() {
    return [this](std::function<void()> run) {
      absl::MutexLock lock(&mu_);
      if (holding_) {
        held_.push_back(std::move(run));
      } else {
        std::thread(std::move(run)).detach();
      }
    };
  }
  // Waits (bounded) until `n` movers are held.
  bool WaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    wanted_ = n;
    return mu_.AwaitWithTimeout(absl::Condition(this, &HeldMovers::Enough),
                                absl::Minutes(1));
  }
  // Holds the movers started from now on again.
  void Hold() {
    absl::MutexLock lock(&mu_);
    holding_ = true;
  }
  // Runs the held movers, and every later one at once.
  void Release() {
    std::vector<std::function<void()>> held;
    {
      absl::MutexLock lock(&mu_);
      holding_ = false;
      held.swap(held_);
    }
    for (auto& run : held) std::thread(std::move(run)).detach();
  }

 private:
  bool Enough() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return held_.size() >= wanted_;
  }

  absl::Mutex mu_;
  bool holding_ ABSL_GUARDED_BY(mu_) = true;
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
};

// A server whose data-path movers are held (HeldMovers), a buffer, and an
// UploadAsync of kSize bytes into it whose connection has reached the
// server: its bytes cannot move until Release.
class HeldUploadTest : public DataPathTest {
 protected:
  static constexpr uint64_t kSize = (8 << 20) + 3;

  void SetUp() override {
    Options options;
    options.transfer_limits.start_thread = movers_.Starter();
    Start(options);
    data_ = RandomData(kSize, 21);
    buffer_ = MustMalloc(kSize);
    absl::StatusOr<remote::PendingRead> copy =
        session_->UploadAsync(buffer_, 0, data_.data(), kSize);
    ASSERT_TRUE(copy.ok()) << copy.status();
    copy_ = *std::move(copy);
    ASSERT_TRUE(movers_.WaitHeld(1));
  }

  HeldMovers movers_;
  std::string data_;
  uint64_t buffer_ = 0;
  std::optional<remote::PendingRead> copy_;
};

// UploadAsync returns once the server has ordered the transfer: here its
// bytes cannot move (the server's mover is held), and the call returned
// all the same; the bytes land once the mover runs.
TEST_F(HeldUploadTest, UploadAsyncReturnsBeforeItsBytesMove) {
  movers_.Release();
  EXPECT_TRUE(copy_->Wait().ok());
  EXPECT_TRUE(GrpcDownload(buffer_, 0, kSize) == data_);
  EXPECT_EQ(Stats().data_path_transfers(), 1u);
}

// With no thread to be had, an UploadAsync moves its bytes before it
// returns, and well (the copy it could not start is not cancelled).
TEST_F(HeldUploadTest, WithoutAThreadUploadAsyncMovesTheBytesItself) {
  movers_.Release();
  ASSERT_TRUE(copy_->Wait().ok());
  const std::string other = RandomData(kSize, 26);
  FailThreadStartsForTesting(true);
  absl::StatusOr<remote::PendingRead> copy =
      session_->UploadAsync(buffer_, 0, other.data(), kSize);
  FailThreadStartsForTesting(false);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_TRUE(copy->Wait().ok());
  EXPECT_TRUE(GrpcDownload(buffer_, 0, kSize) == other);
}

// DownloadAsync the same way: returns before its mover runs, with the
// destination untouched, and the bytes are there once Wait() returns.
TEST_F(HeldUploadTest, DownloadAsyncReturnsBeforeItsBytesMove) {
  movers_.Release();
  ASSERT_TRUE(copy_->Wait().ok());
  movers_.Hold();
  std::string back(kSize, 'p');
  absl::StatusOr<remote::PendingRead> read =
      session_->DownloadAsync(buffer_, 0, back.data(), kSize);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_TRUE(movers_.WaitHeld(1));
  EXPECT_EQ(back, std::string(kSize, 'p'));
  movers_.Release();
  EXPECT_TRUE(read->Wait().ok());
  EXPECT_TRUE(back == data_);
  // The download went as a data_transfer command, which has no call to
  // end: its client has every byte before the server's mover has counted
  // the transfer. A synchronize on the server is ordered after it.
  ServerSynchronize(0);
  EXPECT_EQ(Stats().data_path_transfers(), 2u);
}

// Dropped before its bytes moved, the copy is cancelled and the drop does
// not wait for the held mover; the transfer ends on the server, and the
// session works on.
TEST_F(HeldUploadTest, DroppingAnUploadAsyncCancelsIt) {
  copy_.reset();  // Returns with the mover still held.
  movers_.Release();
  EXPECT_TRUE(session_->Synchronize(0).ok());
  ASSERT_TRUE(session_->Upload(buffer_, 0, data_.data(), kSize).ok());
  EXPECT_TRUE(GrpcDownload(buffer_, 0, kSize) == data_);
  EXPECT_EQ(Stats().data_path_transfers(), 1u);  // The second one only.
}

// Closing the session waits for an UploadAsync still moving, which ends
// well: the copy's thread never outlives the session it uses.
TEST_F(HeldUploadTest, ClosingTheSessionWaitsForAnUploadAsync) {
  absl::Status closed;
  std::thread closing([&] { closed = session_->Close(); });
  movers_.Release();
  closing.join();
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_TRUE(copy_->Wait().ok());
  EXPECT_EQ(Stats().data_path_transfers(), 1u);
}

// What the server refuses at once is UploadAsync's own error; below the
// data-path size, or without a data path, it is an Upload done before it
// returns. Data connections the server keeps closing are tried again, but
// never end in gRPC: the transfer was ordered on its stream when the call
// returned, and a gRPC upload now would come after work queued since.
TEST_F(DataPathTest, UploadAsyncErrorsAndFallbacks) {
  std::atomic<int> drop{0};
  Options options;
  // New connections and kept ones alike.
  options.data_drop_accepted = [&] {
    int left = drop.load();
    while (left > 0 && !drop.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  };
  options.data_drop_kept = options.data_drop_accepted;
  Start(options);
  const uint64_t size = (8 << 20) + 5;
  const std::string data = RandomData(size, 24);
  const uint64_t buffer = MustMalloc(size);
  const absl::Status outside =
      session_->UploadAsync(buffer, 1, data.data(), size).status();
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;
  EXPECT_THAT(outside.message(), HasSubstr("reaches outside the buffer"));
  // Small: an Upload, done when the call returns (the message cap of the
  // default server allows it).
  absl::StatusOr<remote::PendingRead> small =
      session_->UploadAsync(buffer, 0, data.data(), 1 << 20);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(small->Wait().ok());
  EXPECT_EQ(Stats().grpc_transfers(), 1u);

  drop = 1;  // One dropped connection: the retry moves the bytes.
  absl::StatusOr<remote::PendingRead> retried =
      session_->UploadAsync(buffer, 0, data.data(), size);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_TRUE(retried->Wait().ok());
  EXPECT_TRUE(GrpcDownload(buffer, 0, size) == data);

  drop = 1000;  // Every connection dropped: UNAVAILABLE, and no gRPC.
  const std::string other = RandomData(size, 25);
  absl::StatusOr<remote::PendingRead> dropped =
      session_->UploadAsync(buffer, 0, other.data(), size);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  const absl::Status failed = dropped->Wait();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("kept closing the data connection"));
  drop = 0;
  const v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.grpc_transfers(), 1u + 1u);  // The small one, GrpcDownload.
  EXPECT_EQ(stats.data_path_transfers(), 1u);
  EXPECT_TRUE(session_->Synchronize(0).ok());
}

TEST_F(DataPathTest, BadDataPortIsRefused) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.data_port = 70000;
  auto server = Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("--data_port"));
}

// Issue 33, part 1: behind a proxy the host a client dialed is the
// proxy's, so the data port is not there. The server tells clients where
// to connect instead (--data_advertise), and a client that cannot connect
// there moves its bytes through gRPC.

// An advertised address nothing listens on (a port the proxy does not
// forward): the library cannot connect, says so once, and moves every
// transfer through gRPC, byte-exact. The server counts no data-path
// transfer. (The address is on 127.0.0.3, where the data listener, on
// 127.0.0.1, cannot be whatever its port.)
TEST_F(DataPathTest, AnUnreachableAdvertisedAddressFallsBackToGrpc) {
  const int closed = ClosedPort();
  ASSERT_NE(closed, 0);
  Options options;
  options.data_advertise = "127.0.0.3:" + std::to_string(closed);
  Start(options);
  v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_address(), options.data_advertise);
  EXPECT_NE(stats.data_port(), 0u);
  const std::string data = RandomData((8 << 20) + 3, 21);
  auto buffer = session_->Malloc(data.size());
  ASSERT_TRUE(buffer.ok());
  for (int round = 0; round < 2; ++round) {  // Before and after the verdict.
    ASSERT_TRUE(
        session_->Upload(buffer->handle(), 0, data.data(), data.size()).ok());
    std::string back(data.size(), '\0');
    ASSERT_TRUE(
        session_->Download(buffer->handle(), 0, back.data(), back.size()).ok());
    EXPECT_TRUE(back == data);
  }
  stats = Stats();
  EXPECT_EQ(stats.data_path_transfers(), 0u);
  EXPECT_EQ(stats.data_path_bytes(), 0u);
  EXPECT_EQ(stats.grpc_transfers(), 4u);
  EXPECT_EQ(stats.grpc_transfer_bytes(), 4 * data.size());
}

// The client dials the gRPC port through a forwarder on 127.0.0.2, where
// no data port is (a proxy). The server advertises, by name, a second
// forwarder in front of its data port (a forwarded port): the library
// connects there, and every byte goes over the data path, through it.
TEST_F(DataPathTest, TheLibraryConnectsToTheAdvertisedAddress) {
  auto grpc_proxy = TcpForwarder::Start("127.0.0.2");
  ASSERT_TRUE(grpc_proxy.ok()) << grpc_proxy.status();
  grpc_proxy_ = *std::move(grpc_proxy);
  auto data_proxy = TcpForwarder::Start("127.0.0.1");
  ASSERT_TRUE(data_proxy.ok()) << data_proxy.status();
  data_proxy_ = *std::move(data_proxy);
  Options options;
  options.data_advertise = "localhost:" + std::to_string(data_proxy_->port());
  StartServer(options);
  grpc_proxy_->SetTarget("127.0.0.1", server_->port());
  data_proxy_->SetTarget("127.0.0.1", server_->data_port());
  Connect(grpc_proxy_->address());
  ASSERT_NE(session_, nullptr);

  const std::string data = RandomData((8 << 20) + 7, 22);
  auto buffer = session_->Malloc(data.size());
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(
      session_->Upload(buffer->handle(), 0, data.data(), data.size()).ok());
  std::string back(data.size(), '\0');
  ASSERT_TRUE(
      session_->Download(buffer->handle(), 0, back.data(), back.size()).ok());
  EXPECT_TRUE(back == data);
  v1::ServerStats stats = Stats();
  EXPECT_EQ(stats.data_address(), options.data_advertise);
  EXPECT_EQ(stats.data_path_transfers(), 2u);
  EXPECT_EQ(stats.data_path_bytes(), 2 * data.size());
  EXPECT_EQ(stats.grpc_transfers(), 0u);
  // Both transfers went through the advertised address, on the one
  // connection the library kept.
  EXPECT_EQ(data_proxy_->joined(), 1u);
  EXPECT_GE(data_proxy_->bytes(), 2 * data.size());
}

// --data_advertise is checked at start, each mistake with its message.
TEST_F(DataPathTest, BadDataAdvertiseIsRefused) {
  struct Case {
    std::string advertise;
    int data_port;
    const char* message;
    bool tls = false;
  } cases[] = {
      {"localhost", 0,
       "--data_advertise: 'localhost' is not HOST:PORT (missing ':PORT')"},
      {":9000", 0, "--data_advertise: ':9000' is not HOST:PORT (empty host)"},
      {"host:0", 0,
       "--data_advertise: 'host:0' is not HOST:PORT (port must be 1..65535)"},
      {"host:65536", 0,
       "--data_advertise: 'host:65536' is not HOST:PORT (port must be "
       "1..65535)"},
      {"host:http", 0,
       "--data_advertise: 'host:http' is not HOST:PORT (port is not a "
       "number)"},
      {"::1:9000", 0,
       "--data_advertise: '::1:9000' is not HOST:PORT (IPv6 addresses need "
       "brackets)"},
      {"0.0.0.0:9000", 0,
       "--data_advertise: '0.0.0.0:9000' is not HOST:PORT (a wildcard "
       "address is nowhere to connect to)"},
      {"[::]:9000", 0,
       "--data_advertise: '[::]:9000' is not HOST:PORT (a wildcard address "
       "is nowhere to connect to)"},
      {"gpu host:9000", 0,
       "--data_advertise: 'gpu host:9000' is not HOST:PORT (bad character in "
       "host)"},
      {"gpu-host-1:9000", -1,
       "--data_advertise: the data path is off (--data_port=-1): drop "
       "--data_advertise or turn the data path on"},
      // Checked before the certificate files are read.
      {"gpu-host-1:9000", 0,
       "--data_advertise: the data path is off with TLS (transfers stay on "
       "the encrypted channel): drop --data_advertise",
       true},
  };
  for (const Case& c : cases) {
    Options options;
    options.listen = "127.0.0.1:0";
    options.data_advertise = c.advertise;
    options.data_port = c.data_port;
    if (c.tls) {
      options.tls_cert_file = "/nonexistent/server.pem";
      options.tls_key_file = "/nonexistent/server.key";
    }
    auto server = Server::Start(options);
    ASSERT_FALSE(server.ok()) << c.advertise;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(server.status().message(), c.message);
  }
  // Good ones start, canonically spelled.
  for (const auto& [advertise, shown] :
       std::vector<std::pair<std::string, std::string>>{
           {"gpu-host-1.example:9000", "gpu-host-1.example:9000"},
           {"[::1]:09000", "[::1]:9000"}}) {
    Options options;
    options.listen = "127.0.0.1:0";
    options.data_advertise = advertise;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = Client::Connect((*server)->address());
    ASSERT_TRUE(client.ok());
    grpc::ClientContext context;
    v1::ServerStats stats;
    ASSERT_TRUE(
        (*client)
            ->runtime()
            .GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
            .ok());
    EXPECT_EQ(stats.data_address(), shown);
  }
}

}  // namespace
}  // namespace opserver
