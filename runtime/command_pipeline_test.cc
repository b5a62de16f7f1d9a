#include "runtime/command_pipeline.h"

#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "common/task_position.h"
#include "devices/device_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "runtime/data_transfers.h"
#include "runtime/session_test_util.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// CommandPipeline without gRPC: one session on a CPU device, commands
// built by hand, fence results collected.
class CommandPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.threads = 1;
    options.memory_cache_bytes = 0;
    auto device = CreateDevice(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = *std::move(device);
  }

  void Open(size_t max_fences = 16) {
    session_ = std::make_unique<Session>("s", 1, "pipeline_test", device_.get(),
                                         &limits_, &account_,
                                         threads_);
    pipeline_ = std::make_unique<CommandPipeline>(
        limits_, max_fences,
        [this](uint64_t id, absl::Status status, std::string data) {
          absl::MutexLock lock(&mu_);
          ++answers_[id];
          fences_[id] = std::move(status);
          data_[id] = std::move(data);
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

  static v1::TensorDesc Desc(uint64_t buffer, int64_t n) {
    v1::TensorDesc desc;
    desc.set_buffer(buffer);
    desc.set_dtype(v1::FLOAT);
    desc.add_shape(n);
    return desc;
  }

  // ThresholdBackward(grad, self, 1.0) -> out under client id `id`.
  static v1::PipelineCommand Plan(uint64_t id, uint64_t grad, uint64_t self,
                                  uint64_t out, int64_t n) {
    v1::PipelineCommand command;
    command.mutable_plan()->set_executor(id);
    v1::GetWorkspaceSizeRequest& request =
        *command.mutable_plan()->mutable_request();
    request.set_op("ThresholdBackward");
    request.mutable_params()->set_threshold(1.0);
    (*request.mutable_tensors())["gradOutput"] = Desc(grad, n);
    (*request.mutable_tensors())["self"] = Desc(self, n);
    (*request.mutable_tensors())["out"] = Desc(out, n);
    return command;
  }
  static v1::PipelineCommand Launch(uint64_t id, uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_launch()->set_executor(id);
    command.mutable_launch()->set_stream(stream);
    return command;
  }
  static v1::PipelineCommand Fence(uint64_t id, bool session,
                                   uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_fence()->set_id(id);
    command.mutable_fence()->set_session(session);
    command.mutable_fence()->set_stream(stream);
    return command;
  }

  size_t Apply(
      const std::vector<v1::PipelineCommand>& commands, size_t from = 0,
      CommandPipeline::Resume resume = [] {}) {
    batch_.Clear();
    for (const auto& c : commands) *batch_.Add() = c;
    return pipeline_->Apply(*session_, batch_, from, SIZE_MAX, resume);
  }

  static v1::PipelineCommand Write(uint64_t buffer, uint64_t offset,
                                   std::string data, uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_write()->set_buffer(buffer);
    command.mutable_write()->set_offset(offset);
    command.mutable_write()->set_data(std::move(data));
    command.mutable_write()->set_stream(stream);
    return command;
  }
  static v1::PipelineCommand Read(uint64_t id, uint64_t buffer, uint64_t offset,
                                  uint64_t size, uint64_t stream = 0) {
    v1::PipelineCommand command = Fence(id, false, stream);
    command.mutable_fence()->set_read_buffer(buffer);
    command.mutable_fence()->set_read_offset(offset);
    command.mutable_fence()->set_read_size(size);
    return command;
  }
  static v1::PipelineCommand CreateEvent(uint64_t event) {
    v1::PipelineCommand command;
    command.mutable_create_event()->set_event(event);
    return command;
  }
  static v1::PipelineCommand RecordEvent(uint64_t event, uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_record_event()->set_event(event);
    command.mutable_record_event()->set_stream(stream);
    return command;
  }
  static v1::PipelineCommand EventFence(uint64_t id, uint64_t event) {
    v1::PipelineCommand command = Fence(id, false);
    command.mutable_fence()->set_event(event);
    return command;
  }
  // A fence's bytes, once it has its result.
  std::string FenceData(uint64_t id) {
    FenceResult(id).IgnoreError();
    absl::MutexLock lock(&mu_);
    return data_[id];
  }

  absl::Status FenceResult(uint64_t id) {
    std::pair<CommandPipelineTest*, uint64_t> args(this, id);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::pair<CommandPipelineTest*, uint64_t>* a)
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
  google::protobuf::RepeatedPtrField<v1::PipelineCommand> batch_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> fences_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> data_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int> answers_ ABSL_GUARDED_BY(mu_);  // Per fence id.
};

constexpr uint64_t kId = kClientExecutorBase;

TEST_F(CommandPipelineTest, PlanLaunchFenceRunInOrder) {
  Open();
  const uint64_t grad = WriteFloats(*session_, {4.5, 4.4, 4.3, 4.2});
  const uint64_t self = WriteFloats(*session_, {0.2, 1.2, 2.2, 3.2});
  const uint64_t out = WriteFloats(*session_, {-1, -1, -1, -1});
  EXPECT_EQ(
      Apply({Plan(kId, grad, self, out, 4), Launch(kId), Fence(1, false)}), 3u);
  EXPECT_TRUE(FenceResult(1).ok()) << FenceResult(1);
  EXPECT_THAT(ReadFloats(*session_, out, 4),
              ::testing::ElementsAre(0, 4.4f, 4.3f, 4.2f));
  // Consumed: a second launch fails the stream, as Execute would.
  EXPECT_EQ(Apply({Launch(kId), Fence(2, false)}), 2u);
  EXPECT_EQ(kernels::GetAclnnStatus(FenceResult(2)),
            kernels::kAclnnErrInnerNullptr);
}

// A stream's deferred error names the failing command's position on the
// stream (FenceResult.task); a stopped stream skips its later tasks until
// a fence collects the error, and says so.
TEST_F(CommandPipelineTest, DeferredErrorsNameTheirTaskAndStopModeSkips) {
  Open();
  const uint64_t out = WriteFloats(*session_, {-1, -1});
  const uint64_t unknown = kId + 77;  // Never planned.
  EXPECT_EQ(Apply({Launch(unknown), Fence(1, false)}), 2u);
  const uint64_t first = TaskPositionOf(FenceResult(1));
  EXPECT_GE(first, 1u);
  EXPECT_EQ(Apply({Launch(unknown), Fence(2, false)}), 2u);
  EXPECT_EQ(TaskPositionOf(FenceResult(2)), first + 1);
  v1::PipelineCommand stop;
  stop.mutable_stream_failure_mode()->set_stream(0);
  stop.mutable_stream_failure_mode()->set_stop(true);
  const std::string zeros(8, '\0');
  EXPECT_EQ(
      Apply({stop, Launch(unknown), Write(out, 0, zeros), Fence(3, false)}),
      4u);
  EXPECT_THAT(std::string(FenceResult(3).message()),
              ::testing::EndsWith(
                  "(the stream stops on failure: 1 later task was skipped)"));
  EXPECT_THAT(ReadFloats(*session_, out, 2), ::testing::ElementsAre(-1, -1));
  // Collected: the stream runs again.
  EXPECT_EQ(Apply({Write(out, 0, zeros), Fence(4, false)}), 2u);
  EXPECT_TRUE(FenceResult(4).ok()) << FenceResult(4);
  EXPECT_THAT(ReadFloats(*session_, out, 2), ::testing::ElementsAre(0, 0));
}

// The two new session commands check what they are given: an unknown
// stream, a time-out over the bound are the session's deferred errors.
TEST_F(CommandPipelineTest, FailureModeAndOpTimeoutsRefuseBadArguments) {
  Open();
  v1::PipelineCommand mode;
  mode.mutable_stream_failure_mode()->set_stream(99);
  mode.mutable_stream_failure_mode()->set_stop(true);
  EXPECT_EQ(Apply({mode, Fence(1, true)}), 2u);
  EXPECT_EQ(FenceResult(1).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(FenceResult(1).message()),
              ::testing::StartsWith("stream_failure_mode: "));
  v1::PipelineCommand timeouts;
  timeouts.mutable_op_timeouts()->set_execute_timeout_ms(kMaxOpTimeoutMs + 1);
  EXPECT_EQ(Apply({timeouts, Fence(2, true)}), 2u);
  EXPECT_EQ(FenceResult(2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FenceResult(2).message(),
            "op_timeouts: operator time-outs of 86400001 ms (execute) and 0 "
            "ms (wait): at most 86400000 ms each (0: none)");
  timeouts.mutable_op_timeouts()->set_execute_timeout_ms(kMaxOpTimeoutMs);
  timeouts.mutable_op_timeouts()->set_wait_timeout_ms(5);
  EXPECT_EQ(Apply({timeouts, Fence(3, true)}), 2u);
  EXPECT_TRUE(FenceResult(3).ok()) << FenceResult(3);
  EXPECT_EQ(session_->op_wait_timeout(), absl::Milliseconds(5));
}

TEST_F(CommandPipelineTest, RefusedPlanFailsItsLaunchesStreamOnly) {
  Open();
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});
  absl::StatusOr<uint64_t> other = session_->CreateStream();
  ASSERT_TRUE(other.ok());
  // A view past its buffer: 161002. Its launch is not run; the error goes
  // to the launch's stream, the other stream stays clean.
  EXPECT_EQ(
      Apply({Plan(kId, a, a, a, 64), Launch(kId, *other),
             Fence(1, false, *other), Fence(2, false, 0), Fence(3, true)}),
      5u);
  EXPECT_EQ(kernels::GetAclnnStatus(FenceResult(1)), 161002);
  EXPECT_THAT(FenceResult(1).message(), HasSubstr("ThresholdBackward"));
  EXPECT_TRUE(FenceResult(2).ok());
  EXPECT_TRUE(FenceResult(3).ok()) << "a launched plan's error is the stream's";
  // A refused plan that is never launched is the session's, reported once
  // when it is destroyed.
  v1::PipelineCommand destroy;
  destroy.set_destroy_executor(kId + 1);
  EXPECT_EQ(Apply({Plan(kId + 1, a, a, a, 64), destroy, Fence(4, true),
                   Fence(5, true)}),
            4u);
  EXPECT_EQ(kernels::GetAclnnStatus(FenceResult(4)), 161002);
  EXPECT_TRUE(FenceResult(5).ok());
}

TEST_F(CommandPipelineTest, IdsMustGrowAndStayClientIds) {
  Open();
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});
  EXPECT_EQ(Apply({Plan(kId + 5, a, a, a, 4), Plan(kId + 5, a, a, a, 4),
                   Plan(7, a, a, a, 4), Launch(7), Fence(1, false)}),
            5u);
  EXPECT_THAT(FenceResult(1).message(), HasSubstr("2^62"));
  EXPECT_EQ(Apply({Launch(kId + 5), Fence(2, false), Fence(3, true)}), 3u);
  EXPECT_TRUE(FenceResult(2).ok()) << "the first plan under the id stands";
  EXPECT_THAT(FenceResult(3).message(), HasSubstr("cannot be chosen"))
      << "the second plan under it is the session's error";
}

// A full stream holds the channel back (the launch waits) instead of
// failing launches: nothing is lost however fast the client sends.
TEST_F(CommandPipelineTest, FullStreamWaitsAndResumes) {
  limits_.max_queued_per_stream = 2;
  Open();
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});
  std::shared_ptr<Stream> stream = *session_->GetStream(0);
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream
                  ->Hold(
                      gate, [] {}, [] {})
                  .ok());  // Busy until reset.
  std::vector<v1::PipelineCommand> commands;
  for (uint64_t i = 0; i < 5; ++i) {
    commands.push_back(Plan(kId + i, a, a, a, 4));
    commands.push_back(Launch(kId + i));
  }
  commands.push_back(Fence(1, false));
  absl::Notification resumed;
  const size_t stopped = Apply(commands, 0, [&] { resumed.Notify(); });
  EXPECT_EQ(stopped, 5u) << "two launches queued, the third waits";
  EXPECT_FALSE(resumed.HasBeenNotified());
  gate.reset();                   // The stream runs what it holds...
  resumed.WaitForNotification();  // ...and the channel may go on.
  // Room for one launch is all a resume promises: the stream's thread (at
  // a lower priority than this one) may not have run the rest yet, so the
  // channel may stop again, and resumes again, until everything is in.
  size_t applied = stopped;
  for (int round = 0; applied < commands.size() && round < 10; ++round) {
    absl::Notification again;
    const size_t now = Apply(commands, applied, [&] { again.Notify(); });
    ASSERT_GT(now, applied) << "a resumed channel applies at least one";
    if (now < commands.size()) again.WaitForNotification();
    applied = now;
  }
  EXPECT_EQ(applied, commands.size());
  EXPECT_TRUE(FenceResult(1).ok()) << FenceResult(1);
}

// A fence waits for its stream, or for its event's record, which takes as
// long as whatever holds the stream (an upload that stalls). A channel that
// ends (FencesWritten(SIZE_MAX): the client went away, the session closed)
// stops waiting at once: each such fence is answered CANCELLED then, once,
// so the call and what its fences hold go now; the stream reaching them
// later answers nothing more.
TEST_F(CommandPipelineTest, AnEndedChannelStopsWaitingForItsFences) {
  Open();
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});
  std::shared_ptr<Stream> stream = *session_->GetStream(0);
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream->Hold(gate, [] {}, [] {}).ok());
  constexpr uint64_t kEvent = kClientExecutorBase + 7;
  EXPECT_EQ(Apply({CreateEvent(kEvent), RecordEvent(kEvent),
                   EventFence(1, kEvent), Read(2, a, 0, 16)}),
            4u);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(answers_.empty()) << "the stream is held";
  }
  pipeline_->FencesWritten(SIZE_MAX, 0);
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t id : {1, 2}) {
      ASSERT_EQ(answers_[id], 1) << "fence " << id << " waits on";
      EXPECT_EQ(fences_[id].code(), absl::StatusCode::kCancelled) << id;
      EXPECT_THAT(std::string(fences_[id].message()),
                  HasSubstr("the channel ended"));
      EXPECT_EQ(data_[id], "");
    }
  }
  gate.reset();  // The stream reaches the record and the read now.
  absl::Notification synchronized;
  stream->Synchronize([&](absl::Status) { synchronized.Notify(); });
  synchronized.WaitForNotification();
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(answers_[1], 1);
  EXPECT_EQ(answers_[2], 1);
}

// A query fence answers at once, with one byte: 1 while its stream holds
// work (a gate here), 0 once it is idle; an unknown stream is NOT_FOUND.
TEST_F(CommandPipelineTest, QueryFenceSaysWhetherTheStreamIsBusy) {
  Open();
  auto query = [](uint64_t id, uint64_t stream) {
    v1::PipelineCommand command = Fence(id, false, stream);
    command.mutable_fence()->set_query(true);
    return command;
  };
  std::shared_ptr<Stream> stream = *session_->GetStream(0);
  EXPECT_EQ(Apply({query(1, 0)}), 1u);
  EXPECT_EQ(FenceData(1), std::string(1, '\0'));
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(stream->Hold(gate, [] {}, [] {}).ok());
  EXPECT_EQ(Apply({query(2, 0), query(3, 77)}), 2u);
  EXPECT_TRUE(FenceResult(2).ok());
  EXPECT_EQ(FenceData(2), std::string(1, '\1'));
  EXPECT_TRUE(absl::IsNotFound(FenceResult(3))) << FenceResult(3);
  EXPECT_EQ(FenceData(3), "");
  pipeline_->FencesWritten(3, 2);  // The two answer bytes.
  gate.reset();
  // Released: idle once its thread has let go of the gate (asked until
  // then, for up to a minute).
  std::string answer;
  for (uint64_t id = 4; id < 60000 && answer != std::string(1, '\0'); ++id) {
    if (id > 4) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(Apply({query(id, 0)}), 1u);
    answer = FenceData(id);
    pipeline_->FencesWritten(1, answer.size());
  }
  EXPECT_EQ(answer, std::string(1, '\0'));
}

// Fence results the client has not read count against max_fences.
TEST_F(CommandPipelineTest, FenceBudgetHoldsTheChannel) {
  Open(/*max_fences=*/1);
  absl::Notification resumed;
  const std::vector<v1::PipelineCommand> commands = {Fence(1, false),
                                                     Fence(2, true)};
  EXPECT_EQ(Apply(commands, 0, [&] { resumed.Notify(); }), 1u);
  EXPECT_TRUE(FenceResult(1).ok());
  EXPECT_FALSE(resumed.HasBeenNotified());
  pipeline_->FencesWritten(1, 0);
  EXPECT_TRUE(resumed.HasBeenNotified());
  EXPECT_EQ(Apply(commands, 1), 2u);
  EXPECT_TRUE(FenceResult(2).ok());
}

TEST_F(CommandPipelineTest, EmptyAndUnknownHandlesAreSessionErrors) {
  Open();
  v1::PipelineCommand free;
  free.set_free(999);
  EXPECT_EQ(
      Apply({v1::PipelineCommand(), free, Fence(1, true), Fence(2, true)}), 4u);
  EXPECT_EQ(FenceResult(1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(FenceResult(2).ok()) << "only the first error is kept";
  EXPECT_EQ(Apply({free, Fence(3, true)}), 2u);
  EXPECT_EQ(FenceResult(3).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(FenceResult(3).message(), HasSubstr("Free 999"));
}

// A refused plan that is never launched nor destroyed is still reported:
// by the next session fence, once (it used to stay silent until its id was
// destroyed, so a client that only fenced never heard of it).
TEST_F(CommandPipelineTest, UnlaunchedRefusedPlanIsReportedBySessionFence) {
  Open();
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});
  EXPECT_EQ(Apply({Plan(kId, a, a, a, 64), Fence(1, true), Fence(2, true)}),
            3u);
  EXPECT_EQ(kernels::GetAclnnStatus(FenceResult(1)), 161002);
  EXPECT_TRUE(FenceResult(2).ok()) << "reported once";
  // Its launch still fails, on the launch's stream, with the plan's error.
  EXPECT_EQ(Apply({Launch(kId), Fence(3, false)}), 2u);
  EXPECT_EQ(kernels::GetAclnnStatus(FenceResult(3)), 161002);
  // Destroying it after it was reported reports nothing more.
  v1::PipelineCommand destroy;
  destroy.set_destroy_executor(kId);
  EXPECT_EQ(Apply({destroy, Fence(4, true)}), 2u);
  EXPECT_TRUE(FenceResult(4).ok());
}

// A refused plan costs the server a bounded amount whatever its request
// holds: the client's op name is cut short in the kept error, and refused
// plans count against the session's handle limit.
TEST_F(CommandPipelineTest, RefusedPlansAreBoundedAndCharged) {
  limits_.max_handles_per_session = 4;
  Open();
  const uint64_t a = WriteFloats(*session_, {1, 2, 3, 4});  // 1 handle.
  v1::PipelineCommand huge = Plan(kId, a, a, a, 4);
  huge.mutable_plan()->mutable_request()->set_op(std::string(16 << 20, 'x'));
  EXPECT_EQ(
      Apply({huge, Plan(kId + 1, a, a, a, 64), Plan(kId + 2, a, a, a, 64)}),
      3u);
  EXPECT_EQ(session_->Stats().buffers, 1u);
  std::optional<absl::Status> kept =
      session_->RefusedPlan(kId, /*launch=*/false);
  ASSERT_TRUE(kept.has_value());
  EXPECT_LE(kept->message().size(), 2048u);
  EXPECT_THAT(kept->message(), HasSubstr("unknown operator"));
  // 1 buffer + 3 refused plans: the handle limit is reached, so the next
  // refusal is not kept but becomes the session's error at once.
  EXPECT_EQ(Apply({Plan(kId + 3, a, a, a, 64), Fence(1, true)}), 2u);
  EXPECT_FALSE(session_->RefusedPlan(kId + 3, false).has_value());
  EXPECT_FALSE(FenceResult(1).ok());
  // And a Malloc sees the handles the refusals hold.
  EXPECT_EQ(session_->Malloc(64).status().code(),
            absl::StatusCode::kResourceExhausted);
}

std::string Floats(std::initializer_list<float> values) {
  return std::string(reinterpret_cast<const char*>(std::data(values)),
                     values.size() * sizeof(float));
}

// Writes and read fences move bytes in order with the launches around them,
// without a call of their own.
TEST_F(CommandPipelineTest, WritesAndReadFencesAreOrderedWithLaunches) {
  Open();
  auto grad = session_->Malloc(16);
  auto self = session_->Malloc(16);
  auto out = session_->Malloc(16);
  ASSERT_TRUE(grad.ok() && self.ok() && out.ok());
  const std::vector<v1::PipelineCommand> commands = {
      Write(*grad, 0, Floats({4.5, 4.4, 4.3, 4.2})),
      Write(*self, 0, Floats({0.2, 1.2, 2.2, 3.2})),
      Plan(kId, *grad, *self, *out, 4),
      Launch(kId),
      Read(1, *out, 0, 16),
      Read(2, *out, 4, 8),
      Fence(3, true)};
  EXPECT_EQ(Apply(commands), commands.size());
  EXPECT_TRUE(FenceResult(1).ok()) << FenceResult(1);
  EXPECT_EQ(FenceData(1), Floats({0, 4.4, 4.3, 4.2}));
  EXPECT_EQ(FenceData(2), Floats({4.4, 4.3}));
  EXPECT_TRUE(FenceResult(3).ok()) << FenceResult(3);
}

TEST_F(CommandPipelineTest, BadWritesAndReadsAreReportedWhereTheyBelong) {
  Open();
  auto buffer = session_->Malloc(16);
  ASSERT_TRUE(buffer.ok());
  // A write past the end fails its stream: the next fence on it says so,
  // and reads nothing.
  EXPECT_EQ(Apply({Write(*buffer, 12, Floats({1, 2})), Read(1, *buffer, 0, 4)}),
            2u);
  EXPECT_EQ(FenceResult(1).code(), absl::StatusCode::kOutOfRange)
      << FenceResult(1);
  EXPECT_EQ(FenceData(1), "");
  // The stream's error was consumed by that fence; a bad read is the
  // read's own error.
  EXPECT_EQ(Apply({Read(2, *buffer, 8, 16), Read(3, 999, 0, 4),
                   Read(4, *buffer, 0, (1 << 20) + 1),
                   Read(5, *buffer, UINT64_MAX, 2)}),
            4u);
  EXPECT_EQ(FenceResult(2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(FenceResult(3).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FenceResult(4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FenceResult(5).code(), absl::StatusCode::kOutOfRange);
  // A write on an unknown stream, or over 1 MiB, is the session's (resp.
  // the stream's) error.
  EXPECT_EQ(
      Apply({Write(*buffer, 0, Floats({1}), /*stream=*/77), Fence(6, true)}),
      2u);
  EXPECT_EQ(FenceResult(6).code(), absl::StatusCode::kNotFound)
      << FenceResult(6);
  EXPECT_EQ(Apply({Write(*buffer, 0, std::string((1 << 20) + 1, 'x')),
                   Fence(7, false)}),
            2u);
  EXPECT_EQ(FenceResult(7).code(), absl::StatusCode::kInvalidArgument);
  // And the stream still works.
  EXPECT_EQ(Apply({Write(*buffer, 0, Floats({7})), Read(8, *buffer, 0, 4)}),
            2u);
  EXPECT_EQ(FenceData(8), Floats({7}));
}

// Read results the client has not read hold the channel past 8 MiB.
TEST_F(CommandPipelineTest, ReadBytesHoldTheChannel) {
  Open();
  const uint64_t mib = 1 << 20;
  auto buffer = session_->Malloc(mib);
  ASSERT_TRUE(buffer.ok());
  std::vector<v1::PipelineCommand> commands;
  for (uint64_t id = 1; id <= 9; ++id) {
    commands.push_back(Read(id, *buffer, 0, mib));
  }
  absl::Notification resumed;
  EXPECT_EQ(Apply(commands, 0, [&] { resumed.Notify(); }), 8u);
  EXPECT_EQ(FenceData(8).size(), mib);
  EXPECT_FALSE(resumed.HasBeenNotified());
  pipeline_->FencesWritten(1, mib);
  EXPECT_TRUE(resumed.HasBeenNotified());
  EXPECT_EQ(Apply(commands, 8), 9u);
  EXPECT_EQ(FenceData(9).size(), mib);
}

}  // namespace
}  // namespace opserver

namespace opserver {
namespace {

// The data path as the pipeline sees it: records what it is handed and
// holds each started transfer's stream until the test lets it go.
class RecordingTransfers : public DataTransfers {
 public:
  absl::Status Start(Request request) override {
    if (request.ticket == "refuse-me-at-start") {
      return absl::AlreadyExistsError("ticket: expected already");
    }
    auto gate = std::make_shared<Stream::Gate>();
    RETURN_IF_ERROR(request.stream->Hold(
        gate, [] {}, [] {}));
    absl::MutexLock lock(&mu);
    started.push_back(std::move(request));
    gates.push_back(std::move(gate));
    return absl::OkStatus();
  }
  void Refuse(const std::string& ticket) override {
    absl::MutexLock lock(&mu);
    refused.push_back(ticket);
  }
  void Cancel(const void* owner, const std::string& ticket) override {
    absl::MutexLock lock(&mu);
    cancelled.emplace_back(owner, ticket);
  }

  absl::Mutex mu;
  std::vector<Request> started ABSL_GUARDED_BY(mu);
  std::vector<std::shared_ptr<Stream::Gate>> gates ABSL_GUARDED_BY(mu);
  std::vector<std::string> refused ABSL_GUARDED_BY(mu);
  std::vector<std::pair<const void*, std::string>> cancelled
      ABSL_GUARDED_BY(mu);
};

class DataTransferPipelineTest : public CommandPipelineTest {
 protected:
  // A pipeline whose data_transfer commands reach `transfers_` (or, with
  // `data_path` false, none: a server without a data path).
  void OpenWith(bool data_path) {
    Open();
    pipeline_ = std::make_unique<CommandPipeline>(
        limits_, 16,
        [this](uint64_t id, absl::Status status, std::string) {
          absl::MutexLock lock(&mu_);
          fences_[id] = std::move(status);
        },
        nullptr, data_path ? &transfers_ : nullptr);
  }
  static v1::PipelineCommand Transfer(uint64_t buffer, uint64_t offset,
                                      uint64_t size, std::string ticket,
                                      uint64_t stream = 0, bool upload = true) {
    v1::PipelineCommand command;
    v1::DataTransferCommand& t = *command.mutable_data_transfer();
    t.set_buffer(buffer);
    t.set_offset(offset);
    t.set_size(size);
    t.set_stream(stream);
    t.set_direction(
        upload ? v1::OpenDataTransferRequest::DIRECTION_HOST_TO_DEVICE
               : v1::OpenDataTransferRequest::DIRECTION_DEVICE_TO_HOST);
    t.set_ticket(std::move(ticket));
    return command;
  }

  // What the transfers hold (streams, buffers) goes before the session.
  void TearDown() override {
    {
      absl::MutexLock lock(&transfers_.mu);
      transfers_.started.clear();
      transfers_.gates.clear();
    }
    CommandPipelineTest::TearDown();
  }

  RecordingTransfers transfers_;
};

// A checked data_transfer is handed over whole (range, direction, ticket,
// its own session) and ordered on its stream: a fence after it waits until
// the transfer lets the stream go.
TEST_F(DataTransferPipelineTest, ACheckedTransferIsHandedOverInOrder) {
  OpenWith(true);
  auto buffer = session_->Malloc(256);
  ASSERT_TRUE(buffer.ok());
  const uint64_t b = *buffer;
  ASSERT_EQ(Apply({Transfer(b, 16, 240, "ticket", 0, false), Fence(1, false)}),
            2u);
  {
    absl::MutexLock lock(&transfers_.mu);
    ASSERT_EQ(transfers_.started.size(), 1u);
    const DataTransfers::Request& r = transfers_.started[0];
    EXPECT_EQ(r.offset, 16u);
    EXPECT_EQ(r.size, 240u);
    EXPECT_FALSE(r.upload);
    EXPECT_EQ(r.ticket, "ticket");
    EXPECT_EQ(r.owner, session_.get());
    EXPECT_EQ(r.buffer->size(), 256u);
    EXPECT_TRUE(transfers_.refused.empty());
  }
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(fences_.count(1), 0u);  // The transfer holds the stream.
  }
  {
    absl::MutexLock lock(&transfers_.mu);
    transfers_.gates.clear();
  }
  EXPECT_TRUE(FenceResult(1).ok());
  v1::PipelineCommand cancel;
  cancel.set_cancel_data_transfer("ticket");
  ASSERT_EQ(Apply({cancel}), 1u);
  absl::MutexLock lock(&transfers_.mu);
  ASSERT_EQ(transfers_.cancelled.size(), 1u);
  EXPECT_EQ(transfers_.cancelled[0].first, session_.get());
}

// What the pipeline refuses never reaches the data path: its ticket is
// refused, and the error is the stream's (the session's, for an unknown
// stream), with the exact status; the data path's own refusal too.
TEST_F(DataTransferPipelineTest, RefusalsRefuseTheTicketAndDeferTheError) {
  OpenWith(true);
  auto buffer = session_->Malloc(64);
  ASSERT_TRUE(buffer.ok());
  const uint64_t b = *buffer;
  v1::PipelineCommand no_direction = Transfer(b, 0, 1, "t2");
  no_direction.mutable_data_transfer()->set_direction(
      v1::OpenDataTransferRequest::DIRECTION_UNSPECIFIED);
  const struct {
    v1::PipelineCommand command;
    absl::StatusCode code;
    bool session;
  } cases[] = {
      {Transfer(b, 1, 64, "t1"), absl::StatusCode::kInvalidArgument, false},
      {no_direction, absl::StatusCode::kInvalidArgument, false},
      {Transfer(b + 100, 0, 1, "t3"), absl::StatusCode::kNotFound, false},
      {Transfer(b, 0, 1, "refuse-me-at-start"),
       absl::StatusCode::kAlreadyExists, false},
      {Transfer(b, 0, 1, "t5", /*stream=*/77), absl::StatusCode::kNotFound,
       true},
  };
  uint64_t id = 10;
  for (const auto& c : cases) {
    ASSERT_EQ(Apply({c.command, Fence(++id, c.session)}), 2u);
    const absl::Status status = FenceResult(id);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr("data transfer of buffer"));
  }
  absl::MutexLock lock(&transfers_.mu);
  EXPECT_TRUE(transfers_.started.empty());
  EXPECT_EQ(
      transfers_.refused,
      (std::vector<std::string>{"t1", "t2", "t3", "refuse-me-at-start", "t5"}));
}

// A server without a data path refuses every data_transfer with
// UNIMPLEMENTED, naming why, on its stream.
TEST_F(DataTransferPipelineTest, WithoutADataPathItIsUnimplemented) {
  OpenWith(false);
  auto buffer = session_->Malloc(64);
  ASSERT_TRUE(buffer.ok());
  ASSERT_EQ(Apply({Transfer(*buffer, 0, 64, "t"), Fence(1, false)}), 2u);
  const absl::Status status = FenceResult(1);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("no data path"));
}

class CallbackPipelineTest : public CommandPipelineTest {
 protected:
  void OpenWithNotices(size_t max_fences = 16) {
    Open(max_fences);
    pipeline_->SetCallbackDone([this](uint64_t id, absl::Status status) {
      absl::MutexLock lock(&mu_);
      notices_.push_back({id, std::move(status)});
    });
  }
  static v1::PipelineCommand Callback(uint64_t id, bool block,
                                      uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_callback()->set_id(id);
    command.mutable_callback()->set_block(block);
    command.mutable_callback()->set_stream(stream);
    return command;
  }
  static v1::PipelineCommand Release(uint64_t id) {
    v1::PipelineCommand command;
    command.set_release_callback(id);
    return command;
  }
  // Waits until `n` notices came; returns them.
  std::vector<std::pair<uint64_t, absl::Status>> Notices(size_t n) {
    std::pair<CallbackPipelineTest*, size_t> args(this, n);
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](std::pair<CallbackPipelineTest*, size_t>* a)
             ABSL_NO_THREAD_SAFETY_ANALYSIS {
               return a->first->notices_.size() >= a->second;
             },
        &args));
    return notices_;
  }
  bool Answered(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return fences_.count(id) > 0;
  }
  std::vector<std::pair<uint64_t, absl::Status>> notices_
      ABSL_GUARDED_BY(mu_);
};

TEST_F(CallbackPipelineTest, BlockingCallbackHoldsItsStreamUntilReleased) {
  OpenWithNotices();
  ASSERT_EQ(Apply({Callback(5, /*block=*/true), Fence(1, false)}), 2u);
  auto notices = Notices(1);
  EXPECT_EQ(notices[0].first, 5u);
  EXPECT_TRUE(notices[0].second.ok());
  // The fence after it waits for the release (a bounded check: the
  // stream stays held whatever the time, so nothing may answer it).
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(Answered(1));
  EXPECT_EQ(session_->callbacks().blocked(), 1u);
  ASSERT_EQ(Apply({Release(5)}), 1u);
  EXPECT_TRUE(FenceResult(1).ok());
  EXPECT_EQ(session_->callbacks().blocked(), 0u);
  // A release of nothing is ignored.
  ASSERT_EQ(Apply({Release(5), Fence(2, true)}), 2u);
  EXPECT_TRUE(FenceResult(2).ok());
}

TEST_F(CallbackPipelineTest, RefusedCallbackIsNoticedAndDeferred) {
  OpenWithNotices();
  ASSERT_EQ(Apply({Callback(9, false, /*stream=*/77), Fence(1, true)}), 2u);
  auto notices = Notices(1);
  EXPECT_EQ(notices[0].first, 9u);
  EXPECT_EQ(notices[0].second.code(), absl::StatusCode::kNotFound);
  absl::Status session = FenceResult(1);
  EXPECT_EQ(session.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(session.message(), ::testing::HasSubstr("callback 9"));
}

TEST_F(CallbackPipelineTest, NoticesHoldFencePlacesUntilWritten) {
  OpenWithNotices(/*max_fences=*/1);
  bool resumed = false;
  // The second callback waits for the first one's place.
  EXPECT_EQ(Apply({Callback(1, false), Callback(2, false)}, 0,
                  [&resumed] { resumed = true; }),
            1u);
  Notices(1);
  EXPECT_FALSE(resumed);
  pipeline_->FencesWritten(1, 0);
  EXPECT_TRUE(resumed);
  EXPECT_EQ(Apply({Callback(1, false), Callback(2, false)}, 1), 2u);
  EXPECT_EQ(Notices(2)[1].first, 2u);
}

TEST_F(CallbackPipelineTest, DisconnectedChannelHearsNothingMore) {
  OpenWithNotices();
  v1::PipelineCommand hold = Callback(1, true);
  ASSERT_EQ(Apply({hold, Callback(2, false)}), 2u);
  Notices(1);
  pipeline_->DisconnectCallbacks();
  ASSERT_EQ(Apply({Release(1), Fence(3, false)}), 2u);
  EXPECT_TRUE(FenceResult(3).ok());
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(notices_.size(), 1u);  // Callback 2's notice went nowhere.
}

}  // namespace
}  // namespace opserver
