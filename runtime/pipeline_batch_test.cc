#include "runtime/pipeline_batch.h"

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "devices/device_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/session_test_util.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

// PipelineBatch over a CommandPipeline without gRPC, as the channel drives
// it: one session on a CPU device, fence results collected and never
// "written" unless a test says so (a client that does not read).
class PipelineBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.threads = 1;
    options.memory_cache_bytes = 0;
    auto device = CreateDevice(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
    session_ = std::make_unique<Session>("s", 1, "pipeline_batch_test",
                                         device_.get(), &limits_, &account_,
                                         threads_);
    pipeline_ = std::make_unique<CommandPipeline>(
        limits_, /*max_fences=*/1024,
        [this](uint64_t id, absl::Status status, std::string /*data*/) {
          absl::MutexLock lock(&mu_);
          fences_[id] = std::move(status);
        });
  }

  // The stream threads outlive the session that owned them: each finishes
  // its running task, whose callback may still hold a buffer (charged to
  // account_) or reach pipeline_. Wait for them before those go.
  void TearDown() override {
    session_.reset();
    EXPECT_TRUE(threads_->WaitForZero(absl::Minutes(1)));
    pipeline_.reset();
  }

  static v1::PipelineCommand Read(uint64_t id, uint64_t buffer, uint64_t size) {
    v1::PipelineCommand command;
    command.mutable_fence()->set_id(id);
    command.mutable_fence()->set_read_buffer(buffer);
    command.mutable_fence()->set_read_size(size);
    return command;
  }
  static v1::PipelineCommand SessionFence(uint64_t id) {
    v1::PipelineCommand command;
    command.mutable_fence()->set_id(id);
    command.mutable_fence()->set_session(true);
    return command;
  }
  static v1::PipelineCommand Free(uint64_t handle) {
    v1::PipelineCommand command;
    command.set_free(handle);
    return command;
  }

  absl::Status FenceResult(uint64_t id) {
    std::pair<PipelineBatchTest*, uint64_t> args(this, id);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::pair<PipelineBatchTest*, uint64_t>* a)
             ABSL_NO_THREAD_SAFETY_ANALYSIS {
               return a->first->fences_.count(a->second) > 0;
             },
        &args));
    return fences_[id];
  }

  SessionLimits limits_;
  MemoryAccounting account_;
  const std::shared_ptr<StreamThreads> threads_ =
      std::make_shared<StreamThreads>();
  std::unique_ptr<Device> device_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<CommandPipeline> pipeline_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> fences_ ABSL_GUARDED_BY(mu_);
};

// The third review, finding 5: 9 read fences of 1 MiB (the 9th waits: 8
// MiB of results are unread) and then a plan whose shape is 3.9 million
// packed zeros, 3.7 MiB on the wire and 31 MiB parsed. While the batch
// waits, it holds its wire bytes and nothing parsed.
TEST_F(PipelineBatchTest, AWaitingBatchHoldsOnlyItsWireBytes) {
  auto buffer = session_->Malloc(kMiB);
  ASSERT_TRUE(buffer.ok());
  v1::PipelineRequest request;
  request.set_session("s");
  for (uint64_t id = 1; id <= 9; ++id) {
    *request.add_commands() = Read(id, *buffer, kMiB);
  }
  v1::PlanCommand& plan = *request.add_commands()->mutable_plan();
  plan.set_executor(kClientExecutorBase + 1);
  plan.mutable_request()->set_op("ThresholdBackward");
  v1::TensorDesc& grad =
      (*plan.mutable_request()->mutable_tensors())["gradOutput"];
  grad.set_buffer(*buffer);
  grad.mutable_shape()->Resize(3'900'000, 0);
  *request.add_commands() = SessionFence(10);
  const std::string wire = request.SerializeAsString();
  const uint64_t parsed_bytes = request.SpaceUsedLong();
  request.Clear();
  ASSERT_LT(wire.size(), 4 * kMiB);  // Under --max_pipeline_batch_bytes.
  ASSERT_GT(parsed_bytes, 7 * wire.size());

  absl::StatusOr<PipelineBatch> batch = PipelineBatch::Open(wire, 65536);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->session(), "s");
  EXPECT_EQ(batch->size(), 11u);
  absl::Notification resumed;
  absl::StatusOr<PipelineBatch::Progress> progress =
      batch->ApplyNext(*pipeline_, *session_, 512, [&] { resumed.Notify(); });
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->applied, 8u);
  EXPECT_EQ(progress->fences, 8u);
  ASSERT_FALSE(batch->done());
  ASSERT_FALSE(resumed.HasBeenNotified());
  // Waiting: its wire bytes and its session name, nothing parsed.
  EXPECT_LE(batch->held_bytes(), wire.size() + 64)
      << "parsed, the batch was " << parsed_bytes << " bytes";

  // The client reads one result: the rest runs, and the plan is refused
  // with the error the plan gives (reported by the session fence).
  pipeline_->FencesWritten(1, kMiB);
  ASSERT_TRUE(resumed.HasBeenNotified());
  progress = batch->ApplyNext(*pipeline_, *session_, 512, [] {});
  ASSERT_TRUE(progress.ok()) << progress.status();
  EXPECT_EQ(progress->applied, 3u);
  EXPECT_EQ(progress->fences, 2u);
  EXPECT_TRUE(batch->done());
  EXPECT_TRUE(FenceResult(9).ok()) << FenceResult(9);
  EXPECT_THAT(FenceResult(10).message(),
              HasSubstr("ThresholdBackward GetWorkspaceSize (executor "));
}

// Slices go on where the last stopped, the session field counts wherever
// it is (here after the commands), and other top-level fields are skipped.
TEST_F(PipelineBatchTest, SlicesGoOnWhereTheLastStopped) {
  v1::PipelineRequest commands;
  for (uint64_t id = 1; id <= 5; ++id) {
    *commands.add_commands() = Free(1000 + id);  // Unknown: the session's.
    *commands.add_commands() = SessionFence(id);
  }
  v1::PipelineRequest session;
  session.set_session("named last");
  std::string wire = commands.SerializeAsString();
  wire += std::string("\x98\x06\x07", 3);  // Field 99, varint 7: unknown.
  wire += session.SerializeAsString();
  absl::StatusOr<PipelineBatch> batch = PipelineBatch::Open(wire, 10);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->session(), "named last");
  EXPECT_EQ(batch->size(), 10u);
  size_t applied = 0, fences = 0;
  while (!batch->done()) {
    absl::StatusOr<PipelineBatch::Progress> progress =
        batch->ApplyNext(*pipeline_, *session_, 3, [] {});
    ASSERT_TRUE(progress.ok()) << progress.status();
    ASSERT_GT(progress->applied, 0u);
    ASSERT_LE(progress->applied, 3u);
    applied += progress->applied;
    fences += progress->fences;
    EXPECT_EQ(batch->applied(), applied);
  }
  EXPECT_EQ(applied, 10u);
  EXPECT_EQ(fences, 5u);
  // Each fence reports the free just before it, so each command ran once,
  // in order.
  for (uint64_t id = 1; id <= 5; ++id) {
    EXPECT_THAT(FenceResult(id).message(),
                HasSubstr(absl::StrCat("Free ", 1000 + id)))
        << FenceResult(id);
  }
}

TEST_F(PipelineBatchTest, TooManyCommandsAreRefusedBeforeAnyIsParsed) {
  v1::PipelineRequest request;
  for (int i = 0; i < 5; ++i) *request.add_commands() = SessionFence(i + 1);
  absl::StatusOr<PipelineBatch> batch =
      PipelineBatch::Open(request.SerializeAsString(), 4);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(batch.status().message(),
            "a Pipeline batch of 5 commands is over the limit of 4 "
            "(--max_pipeline_batch_commands): send smaller batches");
}

TEST_F(PipelineBatchTest, BytesThatAreNotAPipelineRequestAreRefused) {
  v1::PipelineRequest valid;
  valid.set_session("s");
  *valid.add_commands() = SessionFence(1);
  const std::string whole = valid.SerializeAsString();
  for (const std::string& wire : {
           std::string("\xff\xff\xff", 3),      // A tag cut short.
           std::string("\x00", 1),              // Tag 0.
           whole.substr(0, whole.size() - 1),   // A command cut short.
           std::string("\x0a\x02\xc3\x28", 4),  // A session not UTF-8.
           std::string("\x0c", 1),              // An end-group tag.
       }) {
    absl::StatusOr<PipelineBatch> batch = PipelineBatch::Open(wire, 100);
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument)
        << absl::CEscape(wire);
    EXPECT_EQ(batch.status().message(),
              "a Pipeline batch that is not a PipelineRequest");
  }
}

// A command whose own bytes do not parse is found when its slice is
// parsed: nothing of that slice runs, and the batch reports it.
TEST_F(PipelineBatchTest, ACommandThatDoesNotParseStopsItsSlice) {
  v1::PipelineRequest request;
  *request.add_commands() = SessionFence(1);
  std::string wire = request.SerializeAsString();
  wire += std::string("\x12\x02\x3a\x05", 4);  // A fence cut short.
  absl::StatusOr<PipelineBatch> batch = PipelineBatch::Open(wire, 100);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 2u);
  absl::StatusOr<PipelineBatch::Progress> first =
      batch->ApplyNext(*pipeline_, *session_, 1, [] {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->applied, 1u);
  EXPECT_TRUE(FenceResult(1).ok());
  absl::StatusOr<PipelineBatch::Progress> second =
      batch->ApplyNext(*pipeline_, *session_, 1, [] {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(second.status().message(),
            "a Pipeline batch that is not a PipelineRequest");
  EXPECT_EQ(batch->applied(), 1u);
}

}  // namespace
}  // namespace opserver
