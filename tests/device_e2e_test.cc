// End-to-end over an asynchronous device whose memory the host cannot
// address (FakeDevice): every transfer stages through a device stream and
// every operation finishes only at DeviceStream::Synchronize, so results
// are right only if the server synchronizes where the Device interface says.

#include <memory>
#include <vector>

#include "client/client.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;

class DeviceE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options;
    options.listen = "127.0.0.1:0";
    auto device = std::make_unique<FakeDevice>(/*max_streams=*/-1,
                                               /*host_addressable=*/false);
    device_ = device.get();
    auto server = Server::Start(options, std::move(device));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto client = remote::Client::Connect(server_->address());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    auto session = client_->CreateSession("device_e2e_test");
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
  }

  void TearDown() override {
    session_.reset();
    client_.reset();
    server_.reset();
  }

  uint64_t Malloc(uint64_t size) {
    auto buffer = session_->Malloc(size);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    return buffer.ok() ? buffer->Release() : 0;
  }

  std::unique_ptr<Server> server_;
  FakeDevice* device_ = nullptr;  // Owned by server_.
  std::unique_ptr<remote::Client> client_;
  std::unique_ptr<remote::Session> session_;
};

TEST_F(DeviceE2ETest, TransfersAndLaunchesGoThroughDeviceStreams) {
  const uint64_t grad = Malloc(16), self = Malloc(16), out = Malloc(16);
  const std::vector<float> grad_values = {4.5, 4.4, 4.3, 4.2};
  ASSERT_TRUE(session_->Upload(grad, 0, grad_values.data(), 16).ok());
  ASSERT_TRUE(
      session_
          ->WriteValues(self, 0, kernels::DType::kFloat, {0.2, 1.2, 2.2, 3.2})
          .ok());
  auto stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto executor = session_->ThresholdBackward(
      remote::TensorDesc::Contiguous(grad, kernels::DType::kFloat, {4}),
      remote::TensorDesc::Contiguous(self, kernels::DType::kFloat, {4}), 1.0,
      remote::TensorDesc::Contiguous(out, kernels::DType::kFloat, {4}));
  ASSERT_TRUE(executor.ok()) << executor.status();
  ASSERT_TRUE(executor->Execute(stream->handle()).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  std::vector<float> downloaded(4);
  ASSERT_TRUE(
      session_->Download(out, 0, downloaded.data(), 16, stream->handle()).ok());
  EXPECT_THAT(downloaded, ElementsAre(0, 4.4f, 4.3f, 4.2f));
  auto read = session_->ReadValues(out, 0, kernels::DType::kFloat, 4);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(*read, ElementsAre(0, 4.4f, 4.3f, 4.2f));

  // Two streams (the default and the created one), one launch on the
  // second, and nothing left unfinished on either.
  auto streams = device_->streams();
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[0]->launches.load(), 0);
  EXPECT_EQ(streams[1]->launches.load(), 1);
  EXPECT_GT(streams[0]->copies.load(), 0);
  EXPECT_EQ(streams[0]->pending.load() + streams[1]->pending.load(), 0);
}

TEST_F(DeviceE2ETest, AnAsynchronousKernelFaultIsTheStreamsError) {
  const uint64_t a = Malloc(16);
  auto executor = session_->ThresholdBackward(
      remote::TensorDesc::Contiguous(a, kernels::DType::kFloat, {4}),
      remote::TensorDesc::Contiguous(a, kernels::DType::kFloat, {4}), 1.0,
      remote::TensorDesc::Contiguous(a, kernels::DType::kFloat, {4}));
  ASSERT_TRUE(executor.ok()) << executor.status();
  device_->FailNextSynchronize(absl::InternalError("kernel fault"));
  ASSERT_TRUE(executor->Execute().ok());
  absl::Status status = session_->Synchronize();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_TRUE(session_->Synchronize().ok());
}

// The server keeps an asynchronous device's launches and pipelined writes
// issued, not synchronized, across a batch (runtime/stream.h): each write's
// bytes must stay held until the device has run it, the launches must see
// the writes queued before them, an event recorded after the batch must
// release a waiting stream only once the device is done, and a fence must
// read what the device wrote.
TEST_F(DeviceE2ETest, PipelinedBatchesKeepOrderAndWhatTheyHold) {
  constexpr int kRows = 100;
  const uint64_t grad = Malloc(16), self = Malloc(16);
  const uint64_t out = Malloc(kRows * 16), last = Malloc(16);
  ASSERT_TRUE(
      session_
          ->WriteValues(self, 0, kernels::DType::kFloat, {0.2, 1.2, 2.2, 3.2})
          .ok());
  auto stream = session_->CreateStream();
  auto second = session_->CreateStream();
  ASSERT_TRUE(stream.ok() && second.ok());
  auto grad_desc =
      remote::TensorDesc::Contiguous(grad, kernels::DType::kFloat, {4});
  auto self_desc =
      remote::TensorDesc::Contiguous(self, kernels::DType::kFloat, {4});
  for (int i = 0; i < kRows; ++i) {
    const float row[4] = {1.0f * i, i + 1.0f, i + 2.0f, i + 3.0f};
    ASSERT_TRUE(
        session_->WriteAsync(grad, 0, row, sizeof(row), stream->handle()).ok());
    remote::TensorDesc out_desc =
        remote::TensorDesc::Contiguous(out, kernels::DType::kFloat, {4});
    out_desc.buffer_offset = i * 16;
    auto executor =
        session_->ThresholdBackward(grad_desc, self_desc, 1.0, out_desc);
    ASSERT_TRUE(executor.ok()) << executor.status();
    ASSERT_TRUE(executor->Execute(stream->handle()).ok());
  }
  // The second stream copies the last row once the first has reached the
  // event (a launch reading it: LeakyRelu with a positive self is the
  // identity).
  auto event = session_->CreateEvent();
  ASSERT_TRUE(event.ok()) << event.status();
  ASSERT_TRUE(session_->RecordEvent(*event, stream->handle()).ok());
  ASSERT_TRUE(session_->StreamWaitEvent(second->handle(), *event).ok());
  remote::TensorDesc last_row =
      remote::TensorDesc::Contiguous(out, kernels::DType::kFloat, {4});
  last_row.buffer_offset = (kRows - 1) * 16;
  remote::ScalarValue slope;
  slope.value = 0.5;
  auto copy = session_->LeakyReluBackward(
      last_row, self_desc, slope, false,
      remote::TensorDesc::Contiguous(last, kernels::DType::kFloat, {4}));
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(copy->Execute(second->handle()).ok());
  ASSERT_TRUE(second->Synchronize().ok());
  std::vector<float> copied(4);
  ASSERT_TRUE(
      session_->Download(last, 0, copied.data(), 16, second->handle()).ok());
  EXPECT_THAT(copied, ElementsAre(0, kRows * 1.0f, kRows + 1.0f, kRows + 2.0f));
  ASSERT_TRUE(stream->Synchronize().ok());
  std::vector<float> rows(kRows * 4);
  ASSERT_TRUE(
      session_->Download(out, 0, rows.data(), rows.size() * 4, stream->handle())
          .ok());
  for (int i = 0; i < kRows; ++i) {
    EXPECT_THAT(
        std::vector<float>(rows.begin() + 4 * i, rows.begin() + 4 * i + 4),
        ElementsAre(0, i + 1.0f, i + 2.0f, i + 3.0f))
        << "row " << i;
  }
  ASSERT_TRUE(session_->DestroyEvent(*event).ok());
  for (const auto& record : device_->streams()) {
    EXPECT_EQ(record->pending.load(), 0);
  }
}

}  // namespace
}  // namespace opserver
