// A server over several devices, end to end through the C++ client: a
// session's memory, streams, launches and transfers (gRPC and the data
// path, in place and staged) are on the device it was created on, and the
// per-device reports say so.

#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<v1::ServerStats> ServerStats(remote::Client& client) {
  grpc::ClientContext context;
  client.SetDeadline(&context);
  v1::ServerStats stats;
  grpc::Status status = client.runtime().GetServerStats(
      &context, v1::GetServerStatsRequest(), &stats);
  if (!status.ok()) {
    return remote::FromGrpcStatus(status, context, "GetServerStats");
  }
  return stats;
}

// Server stats once no device holds a buffer any more, or after 60 s. A
// closed session's memory goes when the last call using it (its Attach
// call, its Pipeline channel, a data-path mover) lets go, which can be
// just after CloseSession's reply: polled, not assumed.
absl::StatusOr<v1::ServerStats> StatsOnceEmpty(remote::Client& client) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (;;) {
    absl::StatusOr<v1::ServerStats> stats = ServerStats(client);
    if (!stats.ok()) return stats;
    bool empty = stats->sessions() == 0;
    for (const v1::DeviceStats& d : stats->devices()) {
      empty = empty && d.buffers() == 0 && d.free_bytes() == d.capacity_bytes();
    }
    if (empty || absl::Now() > deadline) return stats;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// The threshold each device's session uses, so results show which inputs
// (and which device's buffers) an output came from.
float Threshold(uint32_t device) { return 0.5f + device; }

// What one session on `device` does: uploads inputs of `n` floats (large
// enough for the data path), runs ThresholdBackward `launches` times on a
// stream of its own, downloads the output and checks every element. Leaves
// its three buffers allocated.
void RunOnDevice(remote::Session& session, uint32_t device, int64_t n,
                 int launches) {
  std::vector<float> grad(n), self(n);
  for (int64_t i = 0; i < n; ++i) {
    grad[i] = static_cast<float>(i % 7 + 1 + 10 * device);
    self[i] = static_cast<float>(i % 5);
  }
  const uint64_t bytes = static_cast<uint64_t>(n) * sizeof(float);
  auto g = session.Malloc(bytes);
  auto x = session.Malloc(bytes);
  auto out = session.Malloc(bytes);
  ASSERT_TRUE(g.ok() && x.ok() && out.ok());
  const uint64_t gh = g->Release(), xh = x->Release(), oh = out->Release();
  ASSERT_TRUE(session.Upload(gh, 0, grad.data(), bytes).ok());
  ASSERT_TRUE(session.Upload(xh, 0, self.data(), bytes).ok());
  auto stream = session.CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (int i = 0; i < launches; ++i) {
    auto executor = session.ThresholdBackward(
        remote::TensorDesc::Contiguous(gh, kernels::DType::kFloat, {n}),
        remote::TensorDesc::Contiguous(xh, kernels::DType::kFloat, {n}),
        Threshold(device),
        remote::TensorDesc::Contiguous(oh, kernels::DType::kFloat, {n}));
    ASSERT_TRUE(executor.ok()) << executor.status();
    ASSERT_TRUE(executor->Execute(stream->handle()).ok());
  }
  ASSERT_TRUE(stream->Synchronize().ok());
  std::vector<float> result(n, -1);
  ASSERT_TRUE(
      session.Download(oh, 0, result.data(), bytes, stream->handle()).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = self[i] > Threshold(device) ? grad[i] : 0.0f;
    if (result[i] != want) ++wrong;
  }
  EXPECT_EQ(wrong, 0) << "device " << device;
  auto stats = session.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->device(), device);
  EXPECT_EQ(stats->buffers(), 3u);
}

// Two CPU devices (Options::devices): two sessions on them run operators
// at the same time from two threads, each device's stats show its own
// buffers, and closing the sessions returns both devices to zero.
TEST(MultiDeviceTest, SessionsOnTwoCpuDevicesRunAtOnce) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  options.devices = 2;
  options.device_memory_bytes = 256ull << 20;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  remote::ConnectOptions connect;
  connect.data_path_bytes = 1 << 20;  // The inputs go over the data path.
  auto client = remote::Client::Connect((*server)->address(), connect);
  ASSERT_TRUE(client.ok()) << client.status();

  auto devices = (*client)->ListDevices();
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*devices)[i].index(), i);
    EXPECT_EQ((*devices)[i].kind(), "cpu");
    EXPECT_EQ((*devices)[i].memory_bytes(), 128ull << 20);
    EXPECT_EQ((*devices)[i].threads(), 2u);
  }
  auto info = (*client)->GetDeviceInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->memory_bytes(), 128ull << 20) << "device 0's, as before";

  // Different sizes, so each device's figures can only be its own.
  const int64_t elements[2] = {1 << 19, 3 << 18};
  absl::BlockingCounter ran(2);
  absl::Notification checked;
  std::vector<std::thread> threads;
  for (uint32_t device : {0u, 1u}) {
    threads.emplace_back([&, device] {
      auto session = (*client)->CreateSession(
          absl::StrCat("multi_device_test ", device), true, device);
      EXPECT_TRUE(session.ok()) << session.status();
      if (session.ok()) {
        EXPECT_EQ((*session)->device(), device);
        RunOnDevice(**session, device, elements[device], 20);
      }
      ran.DecrementCount();
      checked.WaitForNotification();
      if (session.ok()) {
        EXPECT_TRUE((*session)->Close().ok());
      }
    });
  }
  ran.Wait();
  auto stats = ServerStats(**client);
  checked.Notify();
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->devices_size(), 2);
  uint64_t total = 0;
  for (uint32_t i = 0; i < 2; ++i) {
    const v1::DeviceStats& d = stats->devices(i);
    const uint64_t bytes = 3 * elements[i] * sizeof(float);
    total += bytes;
    EXPECT_EQ(d.device(), i);
    EXPECT_EQ(d.sessions(), 1u);
    EXPECT_EQ(d.buffers(), 3u);
    EXPECT_EQ(d.buffer_bytes(), bytes);
    EXPECT_EQ(d.capacity_bytes(), 128ull << 20);
    EXPECT_LE(d.free_bytes(), d.capacity_bytes() - bytes);
  }
  EXPECT_EQ(stats->buffers(), 6u);
  EXPECT_EQ(stats->buffer_bytes(), total);
  EXPECT_GT(stats->data_path_transfers(), 0u);

  auto after = StatsOnceEmpty(**client);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->sessions(), 0u);
  for (const v1::DeviceStats& d : after->devices()) {
    EXPECT_EQ(d.sessions(), 0u) << d.device();
    EXPECT_EQ(d.buffers(), 0u) << d.device();
    EXPECT_EQ(d.buffer_bytes(), 0u) << d.device();
    EXPECT_EQ(d.free_bytes(), d.capacity_bytes()) << d.device();
  }
}

TEST(MultiDeviceTest, BadDeviceCountsAreRefusedAtStart) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.device_memory_bytes = 1 << 20;
  for (int devices : {0, 65}) {
    options.devices = devices;
    absl::Status status = Server::Start(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("--devices: devices must be 1"));
  }
  std::vector<std::unique_ptr<Device>> with_null;
  with_null.push_back(std::make_unique<FakeDevice>());
  with_null.push_back(nullptr);
  EXPECT_EQ(Server::Start(options, std::move(with_null)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ThresholdBackward(threshold 1) of {2, 3} on literal values, on `device`
// (none: the field left out).
v1::EvaluateRequest EvaluateRequest(std::optional<uint32_t> device) {
  v1::EvaluateRequest request;
  request.set_op("ThresholdBackward");
  request.mutable_params()->set_threshold(1);
  for (const char* name : {"gradOutput", "self"}) {
    v1::ValueTensor& t = (*request.mutable_inputs())[name];
    t.set_dtype(v1::FLOAT);
    t.add_shape(2);
    t.add_values(2);
    t.add_values(3);
  }
  request.mutable_output()->set_dtype(v1::FLOAT);
  request.mutable_output()->add_shape(2);
  if (device.has_value()) request.set_device(*device);
  return request;
}

absl::StatusOr<v1::EvaluateResponse> Evaluate(
    remote::Client& client, const v1::EvaluateRequest& request) {
  grpc::ClientContext context;
  client.SetDeadline(&context);
  v1::EvaluateResponse response;
  grpc::Status status =
      client.operators().Evaluate(&context, request, &response);
  if (!status.ok()) return remote::FromGrpcStatus(status, context, "Evaluate");
  return response;
}

// The third review, finding 8: Evaluate runs on the device its request
// names, so a tenant that fills device 0 leaves Evaluate on device 1
// working; a device past the last is refused as CreateSession refuses it.
TEST(MultiDeviceEvaluateTest, EvaluateRunsOnTheDeviceItNames) {
  constexpr uint64_t kCapacity = 4 << 20;
  std::vector<std::unique_ptr<Device>> devices;
  devices.push_back(std::make_unique<FakeDevice>(-1, true, kCapacity));
  devices.push_back(std::make_unique<FakeDevice>(-1, true, kCapacity));
  Options options;
  options.listen = "127.0.0.1:0";
  auto server = Server::Start(options, std::move(devices));
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = remote::Client::Connect((*server)->address());
  ASSERT_TRUE(client.ok()) << client.status();

  // A tenant takes all of device 0.
  auto tenant = (*client)->CreateSession("filler", true, 0);
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  std::vector<remote::DeviceBuffer> held;
  for (;;) {
    auto buffer = (*tenant)->Malloc(64 << 10);
    if (!buffer.ok()) {
      ASSERT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted)
          << buffer.status();
      break;
    }
    held.push_back(*std::move(buffer));
    ASSERT_LE(held.size(), kCapacity / (64 << 10));
  }

  for (std::optional<uint32_t> device0 :
       {std::optional<uint32_t>(), std::optional<uint32_t>(0)}) {
    absl::StatusOr<v1::EvaluateResponse> full =
        Evaluate(**client, EvaluateRequest(device0));
    EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted)
        << full.status();
    EXPECT_THAT(full.status().message(), HasSubstr("cannot allocate"));
  }
  absl::StatusOr<v1::EvaluateResponse> on1 =
      Evaluate(**client, EvaluateRequest(1));
  ASSERT_TRUE(on1.ok()) << on1.status();
  EXPECT_THAT(on1->output().values(), ElementsAre(2, 3));

  for (uint32_t device : {2u, 0xFFFFFFFFu}) {
    absl::StatusOr<v1::EvaluateResponse> none =
        Evaluate(**client, EvaluateRequest(device));
    EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(none.status().message(),
              absl::StrCat("Evaluate: device ", device,
                           " does not exist: the server has 2 devices (0 to "
                           "1); GetDeviceInfo lists them"));
  }
}

// Over two FakeDevices, the second one's memory not host-addressable: a
// session on device 1 stages every transfer (gRPC and data path) through
// device 1's streams and launches there; device 0 sees only Evaluate.
class FakeDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::unique_ptr<Device>> devices;
    devices.push_back(std::make_unique<FakeDevice>());
    devices.push_back(std::make_unique<FakeDevice>(
        /*max_streams=*/-1, /*host_addressable=*/false, kCapacity1));
    device0_ = static_cast<FakeDevice*>(devices[0].get());
    device1_ = static_cast<FakeDevice*>(devices[1].get());
    Options options;
    options.listen = "127.0.0.1:0";
    auto server = Server::Start(options, std::move(devices));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    remote::ConnectOptions connect;
    connect.data_path_bytes = 64 << 10;
    auto client = remote::Client::Connect(server_->address(), connect);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  static constexpr uint64_t kCapacity1 = 64ull << 20;
  std::unique_ptr<Server> server_;
  FakeDevice* device0_ = nullptr;  // Owned by server_.
  FakeDevice* device1_ = nullptr;
  std::unique_ptr<remote::Client> client_;
};

TEST_F(FakeDevicesTest, GetDeviceInfoListsEveryDevice) {
  auto info = client_->GetDeviceInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->devices_size(), 2);
  EXPECT_EQ(info->devices(0).index(), 0u);
  EXPECT_EQ(info->devices(1).index(), 1u);
  EXPECT_EQ(info->devices(0).kind(), "fake");
  EXPECT_EQ(info->devices(0).memory_bytes(), FakeDevice::kDefaultMemoryBytes);
  EXPECT_EQ(info->devices(1).memory_bytes(), kCapacity1);
  // The top level stays device 0's.
  EXPECT_EQ(info->kind(), "fake");
  EXPECT_EQ(info->memory_bytes(), FakeDevice::kDefaultMemoryBytes);
}

TEST_F(FakeDevicesTest, ADeviceOutOfRangeIsRefused) {
  for (uint32_t device : {2u, 1000u}) {
    auto session = client_->CreateSession("out of range", true, device);
    EXPECT_EQ(session.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(session.status().message(),
                HasSubstr(absl::StrCat("device ", device,
                                       " does not exist: the server has 2 "
                                       "devices (0 to 1)")));
  }
  auto stats = ServerStats(*client_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->sessions(), 0u);
  EXPECT_TRUE(device0_->streams().empty());
  EXPECT_TRUE(device1_->streams().empty());
}

TEST_F(FakeDevicesTest, ASessionOnDevice1UsesOnlyDevice1) {
  auto session = client_->CreateSession("device 1", true, 1);
  ASSERT_TRUE(session.ok()) << session.status();
  remote::Session& s = **session;
  // A small upload (gRPC) and a large one (the data path), both staged.
  const int64_t n = 1 << 16;  // 256 KiB of floats.
  std::vector<float> grad(n), self(n);
  for (int64_t i = 0; i < n; ++i) {
    grad[i] = static_cast<float>(i % 9 + 1);
    self[i] = static_cast<float>(i % 3);
  }
  const uint64_t bytes = n * sizeof(float);
  auto g = s.Malloc(bytes);
  auto x = s.Malloc(bytes);
  auto out = s.Malloc(bytes);
  auto small = s.Malloc(16);
  ASSERT_TRUE(g.ok() && x.ok() && out.ok() && small.ok());
  ASSERT_TRUE(s.Upload(g->handle(), 0, grad.data(), bytes).ok());
  ASSERT_TRUE(s.Upload(x->handle(), 0, self.data(), bytes).ok());
  const std::vector<float> four = {1, 2, 3, 4};
  ASSERT_TRUE(s.Upload(small->handle(), 0, four.data(), 16).ok());
  std::vector<float> back(4);
  ASSERT_TRUE(s.Download(small->handle(), 0, back.data(), 16).ok());
  EXPECT_THAT(back, ElementsAre(1, 2, 3, 4));
  auto executor = s.ThresholdBackward(
      remote::TensorDesc::Contiguous(g->handle(), kernels::DType::kFloat, {n}),
      remote::TensorDesc::Contiguous(x->handle(), kernels::DType::kFloat, {n}),
      1.5,
      remote::TensorDesc::Contiguous(out->handle(), kernels::DType::kFloat,
                                     {n}));
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE(executor->Execute().ok());
  ASSERT_TRUE(s.Synchronize().ok());
  std::vector<float> result(n, -1);
  ASSERT_TRUE(s.Download(out->handle(), 0, result.data(), bytes).ok());
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (result[i] != (self[i] > 1.5f ? grad[i] : 0.0f)) ++wrong;
  }
  EXPECT_EQ(wrong, 0);

  // Every copy and launch went to device 1's streams; device 0 has none.
  EXPECT_TRUE(device0_->streams().empty());
  int copies = 0, launches = 0;
  for (const auto& record : device1_->streams()) {
    copies += record->copies.load();
    launches += record->launches.load();
  }
  EXPECT_GT(copies, 0);
  EXPECT_EQ(launches, 1);

  // Stats: the session's device, and device 1's memory to the byte (the
  // fake device counts what was asked for).
  auto session_stats = s.Stats();
  ASSERT_TRUE(session_stats.ok()) << session_stats.status();
  EXPECT_EQ(session_stats->device(), 1u);
  auto stats = ServerStats(*client_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->devices_size(), 2);
  EXPECT_EQ(stats->devices(0).sessions(), 0u);
  EXPECT_EQ(stats->devices(0).buffers(), 0u);
  EXPECT_EQ(stats->devices(0).free_bytes(), FakeDevice::kDefaultMemoryBytes);
  EXPECT_EQ(stats->devices(1).sessions(), 1u);
  EXPECT_EQ(stats->devices(1).buffers(), 4u);
  EXPECT_EQ(stats->devices(1).buffer_bytes(), 3 * bytes + 16);
  EXPECT_EQ(stats->devices(1).capacity_bytes(), kCapacity1);
  EXPECT_EQ(stats->devices(1).free_bytes(), kCapacity1 - 3 * bytes - 16);
  EXPECT_GT(stats->data_path_transfers(), 0u);

  // Evaluate needs no session and, naming no device, runs on device 0.
  absl::StatusOr<v1::EvaluateResponse> response =
      Evaluate(*client_, EvaluateRequest(/*device=*/std::nullopt));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_THAT(response->output().values(), ElementsAre(2, 3));
  EXPECT_EQ(device0_->streams().size(), 1u);

  // Closing gives device 1 everything back.
  g->Release();
  x->Release();
  out->Release();
  small->Release();
  ASSERT_TRUE(s.Close().ok());
  auto after = StatsOnceEmpty(*client_);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->devices(1).sessions(), 0u);
  EXPECT_EQ(after->devices(1).buffers(), 0u);
  EXPECT_EQ(after->devices(1).free_bytes(), kCapacity1);
}

// A client that names no device (as every client before devices did) gets
// device 0.
TEST_F(FakeDevicesTest, NoDeviceMeansDevice0) {
  grpc::ClientContext context;
  client_->SetDeadline(&context);
  v1::CreateSessionRequest request;
  request.set_client_name("old client");
  v1::CreateSessionResponse created;
  ASSERT_TRUE(
      client_->runtime().CreateSession(&context, request, &created).ok());
  grpc::ClientContext stats_context;
  client_->SetDeadline(&stats_context);
  v1::GetSessionStatsRequest stats_request;
  stats_request.set_session(created.session());
  v1::SessionStats stats;
  ASSERT_TRUE(client_->runtime()
                  .GetSessionStats(&stats_context, stats_request, &stats)
                  .ok());
  EXPECT_EQ(stats.device(), 0u);
  EXPECT_EQ(device0_->streams().size(), 1u);
  EXPECT_TRUE(device1_->streams().empty());
}

}  // namespace
}  // namespace opserver
