#include "runtime/executor.h"

#include <memory>
#include <thread>
#include <vector>

#include "devices/testing/fake_device.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "runtime/session.h"
#include "runtime/session_manager.h"
#include "runtime/session_test_util.h"

namespace opserver {
namespace {

// Launches on an asynchronous device (FakeDevice): they go to the launch
// stream's device stream, and are complete when the stream says so.
class LaunchTest : public ::testing::Test {
 protected:
  void Open(int max_streams = -1) {
    device_ = std::make_unique<FakeDevice>(max_streams);
    session_ = std::make_unique<Session>("s", 1, "executor_test", device_.get(),
                                         &limits_, &account_, threads_.get());
  }

  static v1::TensorDesc Desc(uint64_t buffer) {
    v1::TensorDesc desc;
    desc.set_buffer(buffer);
    desc.set_dtype(v1::FLOAT);
    desc.add_shape(4);
    return desc;
  }

  // ThresholdBackward(grad, self, 1.0) -> out, planned and registered.
  uint64_t PlanThreshold(uint64_t grad, uint64_t self, uint64_t out) {
    v1::GetWorkspaceSizeRequest request;
    request.set_op("ThresholdBackward");
    request.mutable_params()->set_threshold(1.0);
    (*request.mutable_tensors())["gradOutput"] = Desc(grad);
    (*request.mutable_tensors())["self"] = Desc(self);
    (*request.mutable_tensors())["out"] = Desc(out);
    absl::StatusOr<std::shared_ptr<Executor>> executor =
        PlanExecutor(request, *session_, limits_.max_launch_elements);
    EXPECT_TRUE(executor.ok()) << executor.status();
    absl::StatusOr<uint64_t> handle =
        session_->AddExecutor(*std::move(executor));
    EXPECT_TRUE(handle.ok()) << handle.status();
    return *handle;
  }

  SessionLimits limits_;
  MemoryAccounting account_;
  std::unique_ptr<FakeDevice> device_;  // Outlives the session.
  JoinedStreamThreads threads_;         // Joined between the two.
  std::unique_ptr<Session> session_;
};

TEST_F(LaunchTest, RunsOnTheLaunchStreamsDeviceStream) {
  Open();
  const uint64_t grad = WriteFloats(*session_, {4.5, 4.4, 4.3, 4.2});
  const uint64_t self = WriteFloats(*session_, {0.2, 1.2, 2.2, 3.2});
  const uint64_t out = WriteFloats(*session_, {-1, -1, -1, -1});
  absl::StatusOr<uint64_t> stream = session_->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  v1::ExecuteRequest request;
  request.set_executor(PlanThreshold(grad, self, out));
  request.set_stream(*stream);
  ASSERT_TRUE(LaunchExecutor(request, *session_).ok());
  EXPECT_TRUE((*session_->GetStream(*stream))->SynchronizeAndWait().ok());
  EXPECT_EQ(ReadFloats(*session_, out, 4),
            (std::vector<float>{0, 4.4f, 4.3f, 4.2f}));
  std::vector<std::shared_ptr<FakeStreamRecord>> streams = device_->streams();
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[0]->launches.load(), 0) << "the default stream's";
  EXPECT_EQ(streams[1]->launches.load(), 1);
  EXPECT_EQ(streams[1]->pending.load(), 0);
}

// Whether a launch runs on the thread that queues it is the device's
// answer (Device::inline_launch_elements), not the runtime's: the same
// 4-element launch on an idle stream runs here within the device's bound,
// and goes to the stream's thread past it or on a device that runs nothing
// here.
TEST_F(LaunchTest, TheDeviceDecidesWhetherALaunchRunsOnTheQueueingThread) {
  Open();
  const uint64_t grad = WriteFloats(*session_, {4.5, 4.4, 4.3, 4.2});
  const uint64_t self = WriteFloats(*session_, {0.2, 1.2, 2.2, 3.2});
  const uint64_t out = WriteFloats(*session_, {-1, -1, -1, -1});
  const std::thread::id here = std::this_thread::get_id();
  struct Case {
    int64_t bound;
    bool runs_here;
  };
  for (const Case& c : {Case{4, true}, Case{3, false}, Case{0, false}}) {
    device_->set_inline_launch_elements(c.bound);
    // A new stream is idle: nothing queued or running on it.
    absl::StatusOr<uint64_t> stream = session_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    v1::ExecuteRequest request;
    request.set_executor(PlanThreshold(grad, self, out));
    request.set_stream(*stream);
    ASSERT_TRUE(LaunchExecutor(request, *session_).ok());
    EXPECT_TRUE((*session_->GetStream(*stream))->SynchronizeAndWait().ok());
    const std::vector<std::thread::id> threads =
        device_->streams().back()->LaunchThreads();
    ASSERT_EQ(threads.size(), 1u) << "bound " << c.bound;
    EXPECT_EQ(threads[0] == here, c.runs_here) << "bound " << c.bound;
  }
  EXPECT_EQ(ReadFloats(*session_, out, 4),
            (std::vector<float>{0, 4.4f, 4.3f, 4.2f}));
}

// A session whose device could not give its default stream a device stream
// (only possible when it is built directly, not by SessionManager) refuses
// launches there, keeping the executor.
TEST_F(LaunchTest, AStreamWithoutADeviceStreamRefusesLaunches) {
  Open(/*max_streams=*/0);
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});
  v1::ExecuteRequest request;
  request.set_executor(PlanThreshold(a, a, a));
  absl::Status status = LaunchExecutor(request, *session_);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(session_->Stats().executors, 1u);
}

// A session on device 1 of two launches on device 1's streams: the launch
// runs there, and device 0 is never touched.
TEST(LaunchDevicesTest, ASessionOnDevice1LaunchesOnDevice1) {
  FakeDevice device0;
  FakeDevice device1;
  SessionLimits limits;
  SessionManager manager({&device0, &device1}, limits);
  absl::StatusOr<std::shared_ptr<Session>> session =
      manager.Create("executor_test", "owner", 1);
  ASSERT_TRUE(session.ok()) << session.status();
  Session& s = **session;
  const uint64_t grad = WriteFloats(s, {4.5, 4.4, 4.3, 4.2});
  const uint64_t self = WriteFloats(s, {0.2, 1.2, 2.2, 3.2});
  const uint64_t out = WriteFloats(s, {-1, -1, -1, -1});
  v1::GetWorkspaceSizeRequest plan;
  plan.set_op("ThresholdBackward");
  plan.mutable_params()->set_threshold(1.0);
  for (const auto& [name, buffer] :
       {std::pair<const char*, uint64_t>{"gradOutput", grad},
        {"self", self},
        {"out", out}}) {
    v1::TensorDesc& desc = (*plan.mutable_tensors())[name];
    desc.set_buffer(buffer);
    desc.set_dtype(v1::FLOAT);
    desc.add_shape(4);
  }
  absl::StatusOr<std::shared_ptr<Executor>> executor =
      PlanExecutor(plan, s, limits.max_launch_elements);
  ASSERT_TRUE(executor.ok()) << executor.status();
  absl::StatusOr<uint64_t> handle = s.AddExecutor(*std::move(executor));
  ASSERT_TRUE(handle.ok()) << handle.status();
  v1::ExecuteRequest request;
  request.set_executor(*handle);
  ASSERT_TRUE(LaunchExecutor(request, s).ok());
  EXPECT_TRUE((*s.GetStream(0))->SynchronizeAndWait().ok());
  EXPECT_EQ(ReadFloats(s, out, 4), (std::vector<float>{0, 4.4f, 4.3f, 4.2f}));
  std::vector<std::shared_ptr<FakeStreamRecord>> streams = device1.streams();
  ASSERT_EQ(streams.size(), 1u);
  EXPECT_EQ(streams[0]->launches.load(), 1);
  EXPECT_TRUE(device0.streams().empty());
}

}  // namespace
}  // namespace opserver
