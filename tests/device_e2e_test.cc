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

}  // namespace
}  // namespace opserver
