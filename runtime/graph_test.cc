#include "runtime/graph.h"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "devices/device_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"
#include "runtime/command_pipeline.h"
#include "runtime/executor.h"
#include "runtime/session_test_util.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Where the device's work ran, and a launch held until the stream is
// cancelled or interrupted: shared by every stream of a FailingDevice.
struct Probe {
  absl::Mutex mu;
  // The thread of each launch and memset, in order.
  std::vector<std::thread::id> threads ABSL_GUARDED_BY(mu);
  // The launch (counting from 1) that waits until CancelRunning or
  // SetInterrupted(true) (0: none), and whether it waits now.
  int hold_launch ABSL_GUARDED_BY(mu) = 0;
  bool holding ABSL_GUARDED_BY(mu) = false;
  bool stopped ABSL_GUARDED_BY(mu) = false;

  void Ran() {
    absl::MutexLock lock(&mu);
    threads.push_back(std::this_thread::get_id());
  }
  std::vector<std::thread::id> Threads() {
    absl::MutexLock lock(&mu);
    return threads;
  }
  // Holds launch `launch` (see hold_launch); CANCELLED once let go.
  absl::Status MaybeHold(int launch) {
    absl::MutexLock lock(&mu);
    if (launch != hold_launch) return absl::OkStatus();
    holding = true;
    mu.Await(absl::Condition(&stopped));
    holding = false;
    return absl::CancelledError("the held launch was stopped");
  }
  void AwaitHolding() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&holding));
  }
  void Stop() {
    absl::MutexLock lock(&mu);
    stopped = true;
  }
};

// The CPU device, whose streams fail the launch numbered `fail_launch`
// (counting every stream's launches from 1) with INTERNAL "injected": a
// replay's error must name the task that failed. Every launch and memset
// is noted in the Probe.
class FailingStream : public DeviceStream {
 public:
  FailingStream(std::unique_ptr<DeviceStream> inner,
                std::shared_ptr<std::atomic<int>> launches, int fail_launch,
                std::shared_ptr<Probe> probe)
      : inner_(std::move(inner)),
        launches_(std::move(launches)),
        fail_launch_(fail_launch),
        probe_(std::move(probe)) {}
  absl::Status CopyToDevice(void* dst, const void* src,
                            uint64_t bytes) override {
    return inner_->CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyFromDevice(void* dst, const void* src,
                              uint64_t bytes) override {
    return inner_->CopyFromDevice(dst, src, bytes);
  }
  absl::Status Memset(void* dst, int value, uint64_t bytes) override {
    probe_->Ran();
    return inner_->Memset(dst, value, bytes);
  }
  absl::Status CopyOnDevice(void* dst, const void* src,
                            uint64_t bytes) override {
    return inner_->CopyOnDevice(dst, src, bytes);
  }
  absl::Status Launch(const DevicePlan& plan, void* workspace,
                      uint64_t size) override {
    probe_->Ran();
    const int launch = launches_->fetch_add(1) + 1;
    if (launch == fail_launch_) return absl::InternalError("injected");
    if (absl::Status s = probe_->MaybeHold(launch); !s.ok()) return s;
    return inner_->Launch(plan, workspace, size);
  }
  absl::Status Synchronize() override { return inner_->Synchronize(); }
  absl::Status ReplayGraph(const DeviceGraph& graph) override;
  void CancelRunning() override {
    probe_->Stop();
    inner_->CancelRunning();
  }
  void SetInterrupted(bool on) override {
    if (on) probe_->Stop();
    inner_->SetInterrupted(on);
  }

 private:
  const std::unique_ptr<DeviceStream> inner_;
  const std::shared_ptr<std::atomic<int>> launches_;
  const int fail_launch_;
  const std::shared_ptr<Probe> probe_;
};

// A device graph of the FailingDevice: the operations the capture
// recorded, each run on the replay's stream.
struct RecordedGraph : public DeviceGraph {
  std::vector<std::function<absl::Status(DeviceStream&)>> operations;
  std::atomic<int>* replays = nullptr;
};

absl::Status FailingStream::ReplayGraph(const DeviceGraph& graph) {
  const auto& recorded = static_cast<const RecordedGraph&>(graph);
  recorded.replays->fetch_add(1);
  for (const auto& operation : recorded.operations) {
    if (absl::Status s = operation(*inner_); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A stream that records what a capture issues, running none of it.
class RecordingStream : public DeviceStream {
 public:
  explicit RecordingStream(RecordedGraph* graph) : graph_(graph) {}
  absl::Status CopyToDevice(void*, const void*, uint64_t) override {
    return absl::InternalError("a host copy cannot be captured");
  }
  absl::Status CopyFromDevice(void*, const void*, uint64_t) override {
    return absl::InternalError("a host copy cannot be captured");
  }
  absl::Status Memset(void* dst, int value, uint64_t bytes) override {
    graph_->operations.push_back(
        [=](DeviceStream& stream) { return stream.Memset(dst, value, bytes); });
    return absl::OkStatus();
  }
  absl::Status CopyOnDevice(void* dst, const void* src,
                            uint64_t bytes) override {
    graph_->operations.push_back([=](DeviceStream& stream) {
      return stream.CopyOnDevice(dst, src, bytes);
    });
    return absl::OkStatus();
  }
  absl::Status Launch(const DevicePlan& plan, void* workspace,
                      uint64_t size) override {
    graph_->operations.push_back([&plan, workspace, size](DeviceStream& s) {
      return s.Launch(plan, workspace, size);
    });
    return absl::OkStatus();
  }
  absl::Status Synchronize() override {
    return absl::InternalError("a capturing stream cannot synchronize");
  }

 private:
  RecordedGraph* const graph_;
};

class FailingDevice : public Device {
 public:
  explicit FailingDevice(std::unique_ptr<Device> inner)
      : inner_(std::move(inner)) {}
  DeviceDescription Describe() const override { return inner_->Describe(); }
  uint64_t FreeBytes() const override { return inner_->FreeBytes(); }
  absl::StatusOr<void*> Allocate(uint64_t bytes, uint64_t owner) override {
    return inner_->Allocate(bytes, owner);
  }
  void Deallocate(void* block, uint64_t bytes) override {
    inner_->Deallocate(block, bytes);
  }
  absl::StatusOr<std::unique_ptr<DevicePlan>> Prepare(
      kernels::ValidCall valid) const override {
    return inner_->Prepare(std::move(valid));
  }
  absl::StatusOr<std::unique_ptr<DeviceStream>> CreateStream() override {
    absl::StatusOr<std::unique_ptr<DeviceStream>> inner =
        inner_->CreateStream();
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<DeviceStream>(
        new FailingStream(*std::move(inner), launches_, fail_launch, probe));
  }
  void* HostAddress(void* device_ptr) override {
    return inner_->HostAddress(device_ptr);
  }
  // Graphs: with `captures`, CaptureGraph records into a RecordedGraph
  // (refused with INTERNAL "capture refused" when `refuse_capture`).
  bool captures_graphs() const override { return captures; }
  absl::StatusOr<std::unique_ptr<DeviceGraph>> CaptureGraph(
      const GraphIssuer& issue) override {
    if (refuse_capture) return absl::InternalError("capture refused");
    auto graph = std::make_unique<RecordedGraph>();
    graph->replays = &device_replays;
    RecordingStream stream(graph.get());
    if (absl::Status s = issue(stream); !s.ok()) return s;
    captured_operations.push_back(graph->operations.size());
    return graph;
  }
  // The inner device's, unless a test sets `inline_bound` (>= 0) before
  // it defines graphs.
  int64_t inline_launch_elements() const override {
    return inline_bound >= 0 ? inline_bound : inner_->inline_launch_elements();
  }
  // Set before the session's streams are created.
  int fail_launch = 0;
  int64_t inline_bound = -1;
  bool captures = false;
  bool refuse_capture = false;
  // The operations of each capture, in order; the device graphs' replays.
  std::vector<size_t> captured_operations;
  std::atomic<int> device_replays{0};
  const std::shared_ptr<Probe> probe = std::make_shared<Probe>();

 private:
  const std::unique_ptr<Device> inner_;
  const std::shared_ptr<std::atomic<int>> launches_ =
      std::make_shared<std::atomic<int>>(0);
};

constexpr uint64_t kId = kClientExecutorBase;

// Graphs through the Pipeline's commands, without gRPC: one session on the
// CPU device, fence results collected.
class GraphTest : public ::testing::Test {
 protected:
  void Open(int fail_launch = 0) {
    DeviceOptions options;
    options.threads = 1;
    options.memory_cache_bytes = 0;
    auto device = CreateDevice(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::make_unique<FailingDevice>(*std::move(device));
    device_->fail_launch = fail_launch;
    session_ = std::make_unique<Session>("s", 1, "graph_test", device_.get(),
                                         &limits_, &account_, threads_.get());
    pipeline_ = std::make_unique<CommandPipeline>(
        limits_, 64, [this](uint64_t id, absl::Status status, std::string) {
          absl::MutexLock lock(&mu_);
          fences_[id] = std::move(status);
        });
  }

  // The stream threads outlive the session: each finishes its running
  // task, whose callback may reach pipeline_. Wait for them first.
  void TearDown() override {
    session_.reset();
    EXPECT_TRUE(threads_.get()->WaitForZero(absl::Minutes(1)));
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
  static v1::PipelineCommand Memset(uint64_t buffer, uint64_t size,
                                    uint32_t value, uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_memset()->set_buffer(buffer);
    command.mutable_memset()->set_size(size);
    command.mutable_memset()->set_value(value);
    command.mutable_memset()->set_stream(stream);
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
  static v1::PipelineCommand Define(uint64_t graph,
                                    std::vector<v1::PipelineCommand> tasks) {
    v1::PipelineCommand command;
    command.mutable_define_graph()->set_graph(graph);
    for (v1::PipelineCommand& task : tasks) {
      *command.mutable_define_graph()->add_tasks() = std::move(task);
    }
    return command;
  }
  static v1::PipelineCommand Replay(uint64_t graph, uint64_t stream = 0) {
    v1::PipelineCommand command;
    command.mutable_replay_graph()->set_graph(graph);
    command.mutable_replay_graph()->set_stream(stream);
    return command;
  }
  static v1::PipelineCommand Destroy(uint64_t graph) {
    v1::PipelineCommand command;
    command.set_destroy_graph(graph);
    return command;
  }

  void Apply(const std::vector<v1::PipelineCommand>& commands) {
    google::protobuf::RepeatedPtrField<v1::PipelineCommand> batch;
    for (const auto& c : commands) *batch.Add() = c;
    ASSERT_EQ(pipeline_->Apply(*session_, batch, 0, SIZE_MAX, [] {}),
              commands.size());
  }
  absl::Status FenceResult(uint64_t id) {
    auto ready = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return fences_.count(id) > 0;
    };
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&ready));
    return fences_[id];
  }
  // The session's deferred error, through a session fence numbered `id`.
  absl::Status SessionError(uint64_t id) {
    Apply({Fence(id, true)});
    return FenceResult(id);
  }
  absl::Status StreamError(uint64_t id, uint64_t stream = 0) {
    Apply({Fence(id, false, stream)});
    return FenceResult(id);
  }
  std::shared_ptr<Stream> GetStream(uint64_t id) {
    return *session_->GetStream(id);
  }
  // Whether fence `id` was answered already (without waiting for it).
  bool FenceAnswered(uint64_t id) {
    absl::MutexLock lock(&mu_);
    return fences_.count(id) > 0;
  }
  std::vector<std::thread::id> Threads() { return device_->probe->Threads(); }
  // Waits (up to a minute) until stream `id` is idle: a fence answered on
  // the stream's thread is answered before that thread lets the stream go.
  void AwaitIdle(uint64_t id = 0) {
    std::shared_ptr<Stream> stream = GetStream(id);
    const absl::Time deadline = absl::Now() + absl::Minutes(1);
    while (stream->busy() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_FALSE(stream->busy());
  }
  void HoldLaunch(int launch) {
    absl::MutexLock lock(&device_->probe->mu);
    device_->probe->hold_launch = launch;
  }

  // grad 4.5..4.2 over self 0.2..3.2 at threshold 1: out is 0, 4.4, 4.3,
  // 4.2; `out` starts as -1s (the poison).
  struct Step {
    uint64_t grad, self, out;
  };
  Step MakeStep() {
    return Step{WriteFloats(*session_, {4.5, 4.4, 4.3, 4.2}),
                WriteFloats(*session_, {0.2, 1.2, 2.2, 3.2}),
                WriteFloats(*session_, {-1, -1, -1, -1})};
  }

  SessionLimits limits_;
  MemoryAccounting account_;
  std::unique_ptr<FailingDevice> device_;
  JoinedStreamThreads threads_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<CommandPipeline> pipeline_;
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> fences_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GraphTest, DefinitionDoesNotRunAndReplaysDo) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4), Define(kId + 1, {Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok());
  EXPECT_TRUE(StreamError(2).ok());
  // Defined, not run: the poison is still there.
  EXPECT_THAT(ReadFloats(*session_, s.out, 4), ElementsAre(-1, -1, -1, -1));
  // The executor went into the graph.
  EXPECT_EQ(session_->Stats().executors, 0u);
  EXPECT_EQ(session_->Stats().graphs, 1u);
  EXPECT_EQ(session_->Stats().graph_tasks, 1u);
  Apply({Replay(kId + 1)});
  EXPECT_TRUE(StreamError(3).ok()) << StreamError(3);
  EXPECT_THAT(ReadFloats(*session_, s.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  // Again, on another stream, after the output was poisoned again.
  const uint64_t other = *session_->CreateStream();
  Apply({Memset(s.out, 16, 0xff)});
  EXPECT_TRUE(StreamError(4).ok());
  EXPECT_THAT(ReadFloats(*session_, s.out, 4)[0], ::testing::IsNan());
  Apply({Replay(kId + 1, other)});
  EXPECT_TRUE(StreamError(5, other).ok());
  EXPECT_THAT(ReadFloats(*session_, s.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  absl::StatusOr<std::shared_ptr<Graph>> graph = session_->GetGraph(kId + 1);
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ((*graph)->replays(), 2u);
  EXPECT_EQ((*graph)->pending_replays(), 0u);
  EXPECT_THAT((*graph)->Describe(),
              ElementsAre(HasSubstr("1: launch ThresholdBackward FLOAT[4] "
                                    "(executor 4611686018427387904, stream "
                                    "0)")));
}

// On a device that captures graphs, each run of device work without a
// write is captured once at definition (nothing runs) and replayed as one
// device operation; a run with a write is replayed task by task. A
// capture the device refuses refuses the definition, naming the run.
TEST_F(GraphTest, ADeviceThatCapturesGraphsReplaysEachRunAsOne) {
  Open();
  device_->captures = true;
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4),
         Define(kId + 1, {Memset(s.out, 16, 0), Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok()) << SessionError(1);
  EXPECT_THAT(device_->captured_operations, ElementsAre(2u));
  EXPECT_THAT(ReadFloats(*session_, s.out, 4), ElementsAre(-1, -1, -1, -1));
  Apply({Replay(kId + 1), Replay(kId + 1)});
  EXPECT_TRUE(StreamError(2).ok()) << StreamError(2);
  EXPECT_EQ(device_->device_replays.load(), 2);
  EXPECT_THAT(ReadFloats(*session_, s.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));

  // A write's bytes are host memory: not captured, run as tasks.
  v1::PipelineCommand write;
  write.mutable_write()->set_buffer(s.out);
  write.mutable_write()->set_data(std::string(16, '\0'));
  Apply({Define(kId + 2, {write})});
  EXPECT_TRUE(SessionError(3).ok()) << SessionError(3);
  EXPECT_THAT(device_->captured_operations, ElementsAre(2u));
  Apply({Replay(kId + 2)});
  EXPECT_TRUE(StreamError(4).ok()) << StreamError(4);
  EXPECT_EQ(device_->device_replays.load(), 2);
  EXPECT_THAT(ReadFloats(*session_, s.out, 4), ElementsAre(0, 0, 0, 0));

  device_->refuse_capture = true;
  Apply({Define(kId + 3, {Memset(s.out, 16, 0), Memset(s.out, 8, 1)})});
  absl::Status refused = SessionError(5);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal) << refused;
  EXPECT_EQ(refused.message(),
            "DefineGraph 4611686018427387907: tasks 1 to 2 of 2 (captured as "
            "one device graph): capture refused");
  EXPECT_EQ(session_->Stats().graphs, 2u);
}

TEST_F(GraphTest, AnUnknownHandleRefusesTheWholeDefinition) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4),
         Define(kId + 1, {Launch(kId), Memset(999, 4, 0)})});
  absl::Status error = SessionError(1);
  EXPECT_EQ(error.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(error.message(),
              HasSubstr("DefineGraph 4611686018427387905: task 2 of 2: no "
                        "buffer 999 in this session"));
  // Nothing of it remains: no graph, and the executor is not consumed.
  EXPECT_EQ(session_->Stats().graphs, 0u);
  EXPECT_EQ(session_->Stats().graph_tasks, 0u);
  EXPECT_EQ(session_->Stats().executors, 1u);
  EXPECT_EQ(session_->GetGraph(kId + 1).status().code(),
            absl::StatusCode::kNotFound);
  // Unknown executor, stream and event too, each named.
  v1::PipelineCommand wait;
  wait.mutable_wait_event()->set_event(12345);
  Apply({Define(kId + 2, {Launch(kId + 77)})});
  EXPECT_EQ(kernels::GetAclnnStatus(SessionError(2)),
            kernels::kAclnnErrInnerNullptr);
  Apply({Define(kId + 3, {Launch(kId, 5)})});
  EXPECT_THAT(SessionError(3).message(),
              HasSubstr("task 1 of 1: no stream 5 in this session"));
  Apply({Define(kId + 4, {wait})});
  EXPECT_THAT(SessionError(4).message(),
              HasSubstr("task 1 of 1: no event 12345 in this session"));
  EXPECT_EQ(session_->Stats().executors, 1u);
  EXPECT_EQ(session_->Stats().graphs, 0u);
}

TEST_F(GraphTest, OtherKindsAndEmptyGraphsAreRefused) {
  Open();
  Apply({Define(kId, {Fence(9, true)})});
  absl::Status error = SessionError(1);
  EXPECT_EQ(error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(error.message(),
              HasSubstr("task 1 of 1: a graph holds launch, memset, copy, "
                        "write, record_event and wait_event commands, not "
                        "fence"));
  Apply({Define(kId + 1, {})});
  error = SessionError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(error.message(), HasSubstr("a graph needs at least one task"));
}

TEST_F(GraphTest, ASingleUseExecutorLaunchedTwiceIsRefused) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4),
         Define(kId + 1, {Launch(kId), Launch(kId)})});
  absl::Status error = SessionError(1);
  EXPECT_EQ(error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(error.message(),
              HasSubstr("task 2 of 2: executor 4611686018427387904 is "
                        "launched twice in the graph and is not repeatable"));
  // Repeatable, it may be, and stays in the session.
  v1::PipelineCommand repeatable;
  repeatable.set_set_executor_repeatable(kId);
  Apply({repeatable, Define(kId + 2, {Launch(kId), Launch(kId)})});
  EXPECT_TRUE(SessionError(2).ok());
  EXPECT_EQ(session_->Stats().executors, 1u);
  EXPECT_EQ(session_->Stats().graph_tasks, 2u);
}

TEST_F(GraphTest, GraphCountAndTaskLimits) {
  limits_.max_graphs_per_session = 2;
  limits_.max_graph_tasks_per_session = 3;
  Open();
  const Step s = MakeStep();
  Apply({Define(kId, {Memset(s.out, 4, 0)}),
         Define(kId + 1, {Memset(s.out, 4, 0)})});
  EXPECT_TRUE(SessionError(1).ok());
  Apply({Define(kId + 2, {Memset(s.out, 4, 0)})});
  absl::Status error = SessionError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(error.message(), HasSubstr("the session has 2 graphs, the limit "
                                         "(--max_graphs_per_session)"));
  // Destroyed, a graph stops counting.
  Apply({Destroy(kId)});
  EXPECT_TRUE(SessionError(3).ok());
  EXPECT_EQ(session_->Stats().graphs, 1u);
  // One task is held: three more do not fit, two do.
  Apply({Define(kId + 3, {Memset(s.out, 4, 0), Memset(s.out, 4, 0),
                          Memset(s.out, 4, 0)})});
  error = SessionError(4);
  EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(error.message(),
              HasSubstr("a graph of 3 tasks does not fit: the session's "
                        "graphs hold 1 of 3 tasks "
                        "(--max_graph_tasks_per_session)"));
  // Over the limit alone: refused before its tasks are looked at.
  Apply({Define(kId + 4, {Memset(s.out, 4, 0), Memset(s.out, 4, 0),
                          Memset(s.out, 4, 0), Memset(s.out, 4, 0)})});
  EXPECT_THAT(SessionError(5).message(),
              HasSubstr("a graph of 4 tasks is over the limit of 3 tasks per "
                        "session"));
  Apply({Define(kId + 5, {Memset(s.out, 4, 0), Memset(s.out, 4, 0)})});
  EXPECT_TRUE(SessionError(6).ok());
  EXPECT_EQ(session_->Stats().graph_tasks, 3u);
}

TEST_F(GraphTest, GraphMemoryIsChargedToTheSession) {
  limits_.session_memory_bytes = 64 << 10;
  Open();
  const uint64_t buffer = *session_->Malloc(4096);
  // Four 4 KiB writes and the graph's own bytes fit; twelve do not.
  std::vector<v1::PipelineCommand> small, large;
  for (int i = 0; i < 12; ++i) {
    v1::PipelineCommand write;
    write.mutable_write()->set_buffer(buffer);
    write.mutable_write()->set_data(std::string(4096, 'x'));
    if (i < 4) small.push_back(write);
    large.push_back(write);
  }
  Apply({Define(kId, small)});
  EXPECT_TRUE(SessionError(1).ok());
  Apply({Define(kId + 1, large)});
  absl::Status error = SessionError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(error.message(), HasSubstr("a graph of 12 tasks"));
  EXPECT_EQ(session_->Stats().graphs, 1u);
  // Destroyed, its charge is returned: the large one still does not fit,
  // but a Malloc of what the small one held does.
  Apply({Destroy(kId)});
  EXPECT_TRUE(SessionError(3).ok());
  EXPECT_TRUE(session_->Malloc(48 << 10).ok());
}

TEST_F(GraphTest, AReplayAfterAFreeIsRefusedAndTouchesNothing) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4), Define(kId + 1, {Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok());
  v1::PipelineCommand free;
  free.set_free(s.out);
  Apply({free, Replay(kId + 1)});
  absl::Status error = StreamError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(error.message(),
              HasSubstr("replay of graph 4611686018427387905: task 1 of 1: "
                        "buffer " +
                        std::to_string(s.out) +
                        " was freed after the graph was defined"));
  absl::StatusOr<std::shared_ptr<Graph>> graph = session_->GetGraph(kId + 1);
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ((*graph)->replays(), 0u);
  // A new buffer of the same size is not written by a replay.
  const uint64_t fresh = WriteFloats(*session_, {-1, -1, -1, -1});
  Apply({Replay(kId + 1)});
  EXPECT_FALSE(StreamError(3).ok());
  EXPECT_THAT(ReadFloats(*session_, fresh, 4), ElementsAre(-1, -1, -1, -1));
}

TEST_F(GraphTest, AFailingTaskIsNamedAndTheRestOfTheReplayDoesNotRun) {
  Open(/*fail_launch=*/2);
  const Step a = MakeStep();
  const Step b = MakeStep();
  const Step c = MakeStep();
  Apply({Plan(kId, a.grad, a.self, a.out, 4),
         Plan(kId + 1, b.grad, b.self, b.out, 4),
         Plan(kId + 2, c.grad, c.self, c.out, 4),
         Define(kId + 3, {Launch(kId), Launch(kId + 1), Launch(kId + 2)}),
         Replay(kId + 3)});
  absl::Status error = StreamError(1);
  EXPECT_EQ(error.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(error.message(),
            "replay of graph 4611686018427387907: task 2 of 3: injected");
  EXPECT_THAT(ReadFloats(*session_, a.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_THAT(ReadFloats(*session_, c.out, 4), ElementsAre(-1, -1, -1, -1));
  // The next replay runs whole.
  Apply({Replay(kId + 3)});
  EXPECT_TRUE(StreamError(2).ok());
  EXPECT_THAT(ReadFloats(*session_, c.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
}

TEST_F(GraphTest, DestroyWaitsForTheReplaysQueued) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4), Define(kId + 1, {Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok());
  std::shared_ptr<Graph> graph = *session_->GetGraph(kId + 1);
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(GetStream(0)
                  ->Hold(
                      gate, [] {}, nullptr)
                  .ok());
  Apply({Replay(kId + 1), Replay(kId + 1), Destroy(kId + 1)});
  // Gone from the session at once; its replays are still queued.
  EXPECT_EQ(session_->Stats().graphs, 0u);
  EXPECT_EQ(session_->GetGraph(kId + 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(graph->pending_replays(), 2u);
  EXPECT_THAT(ReadFloats(*session_, s.out, 4), ElementsAre(-1, -1, -1, -1));
  // A replay after the destroy is refused on its stream.
  Apply({Replay(kId + 1)});
  gate.reset();
  absl::Status error = StreamError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(error.message(), HasSubstr("ReplayGraph: no graph"));
  EXPECT_EQ(graph->pending_replays(), 0u);
  EXPECT_EQ(graph->replays(), 2u);
  EXPECT_THAT(ReadFloats(*session_, s.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_TRUE(SessionError(3).ok());
}

TEST_F(GraphTest, ClosingTheSessionDropsQueuedReplays) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4), Define(kId + 1, {Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok());
  std::shared_ptr<Graph> graph = *session_->GetGraph(kId + 1);
  std::shared_ptr<Buffer> out = *session_->GetBuffer(s.out);
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(GetStream(0)
                  ->Hold(
                      gate, [] {}, nullptr)
                  .ok());
  Apply({Replay(kId + 1), Replay(kId + 1)});
  EXPECT_EQ(graph->pending_replays(), 2u);
  session_.reset();  // With the gate still held.
  EXPECT_EQ(graph->pending_replays(), 0u);
  const float* values = static_cast<const float*>(out->data());
  EXPECT_EQ(values[1], -1.0f);
  gate.reset();
}

TEST_F(GraphTest, EventsInsideAndOutsideTheGraph) {
  Open();
  const Step s = MakeStep();
  const uint64_t other = *session_->CreateStream();
  const uint64_t inside = *session_->CreateEvent(0);
  const uint64_t outside = *session_->CreateEvent(0);
  v1::PipelineCommand record_inside, wait_inside, wait_outside;
  record_inside.mutable_record_event()->set_event(inside);
  wait_inside.mutable_wait_event()->set_event(inside);
  wait_inside.mutable_wait_event()->set_stream(other);
  wait_outside.mutable_wait_event()->set_event(outside);
  // wait(outside), memset, record(inside), wait(inside) on the other
  // stream (joined), launch.
  Apply({Plan(kId + 10, s.grad, s.self, s.out, 4),
         Define(kId + 11, {wait_outside, Memset(s.out, 16, 0), record_inside,
                           wait_inside, Launch(kId + 10, other)})});
  EXPECT_TRUE(SessionError(1).ok());
  // `outside` is recorded on a held stream: the replay waits for it.
  auto gate = std::make_shared<Stream::Gate>();
  std::shared_ptr<Stream> held = GetStream(other);
  ASSERT_TRUE(held->Hold(
                      gate, [] {}, nullptr)
                  .ok());
  ASSERT_TRUE((*session_->GetEvent(outside))->Record(*held).ok());
  Apply({Replay(kId + 11)});
  std::shared_ptr<Event> record = *session_->GetEvent(inside);
  EXPECT_FALSE(record->Complete());  // The replay has not reached it.
  EXPECT_TRUE(GetStream(0)->busy());
  EXPECT_THAT(ReadFloats(*session_, s.out, 4), ElementsAre(-1, -1, -1, -1));
  gate.reset();
  EXPECT_TRUE(StreamError(2).ok());
  EXPECT_TRUE(record->Complete());
  EXPECT_TRUE(record->Recorded());
  EXPECT_THAT(ReadFloats(*session_, s.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_THAT((*session_->GetGraph(kId + 11))->Describe(),
              ElementsAre(HasSubstr("1: wait_event"), HasSubstr("2: memset"),
                          HasSubstr("3: record_event"),
                          HasSubstr("4: wait_event"), HasSubstr("5: launch")));
}

// A replay of small tasks on an idle stream is one unit of work run at
// once on the thread that applies the command (a Pipeline worker): no
// hand-off to the stream's thread, and the fence behind it finds the
// stream idle, so it is answered before Apply returns.
TEST_F(GraphTest, ASmallReplayOnAnIdleStreamRunsOnTheApplyingThread) {
  Open();
  const Step a = MakeStep();
  const Step b = MakeStep();
  Apply(
      {Plan(kId, a.grad, a.self, a.out, 4),
       Plan(kId + 1, b.grad, b.self, b.out, 4),
       Define(kId + 2, {Memset(a.out, 16, 0), Launch(kId), Launch(kId + 1)})});
  EXPECT_TRUE(SessionError(1).ok());
  EXPECT_TRUE(Threads().empty());  // Defined, not run.
  AwaitIdle();
  Apply({Replay(kId + 2), Fence(2, false)});
  EXPECT_TRUE(FenceAnswered(2));
  EXPECT_TRUE(FenceResult(2).ok()) << FenceResult(2);
  const std::thread::id here = std::this_thread::get_id();
  EXPECT_THAT(Threads(), ElementsAre(here, here, here));
  EXPECT_THAT(ReadFloats(*session_, a.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_THAT(ReadFloats(*session_, b.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
}

// Whether a replay runs on the applying thread is the device's answer
// (Device::inline_launch_elements), not the runtime's: on a device that
// runs nothing there, a small replay on an idle stream goes to the stream's
// thread.
TEST_F(GraphTest, OnADeviceThatRunsNothingInlineASmallReplayGoesToItsThread) {
  Open();
  device_->inline_bound = 0;
  const Step a = MakeStep();
  Apply({Plan(kId, a.grad, a.self, a.out, 4),
         Define(kId + 1, {Memset(a.out, 16, 0), Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok());
  AwaitIdle();
  Apply({Replay(kId + 1)});
  EXPECT_TRUE(StreamError(2).ok()) << StreamError(2);
  const std::vector<std::thread::id> threads = Threads();
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0], threads[1]);
  EXPECT_NE(threads[0], std::this_thread::get_id());
  EXPECT_THAT(ReadFloats(*session_, a.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
}

// With work queued ahead of it, the replay does not jump the queue: it is
// queued behind that work and runs after it, on the stream's thread.
TEST_F(GraphTest, AReplayBehindQueuedWorkRunsAfterItOnTheStreamsThread) {
  Open();
  const Step s = MakeStep();
  Apply({Plan(kId, s.grad, s.self, s.out, 4), Define(kId + 1, {Launch(kId)})});
  EXPECT_TRUE(SessionError(1).ok());
  auto gate = std::make_shared<Stream::Gate>();
  ASSERT_TRUE(GetStream(0)
                  ->Hold(
                      gate, [] {}, nullptr)
                  .ok());
  // The memset poisons the output; the replay after it overwrites it.
  Apply({Memset(s.out, 16, 0xff), Replay(kId + 1), Fence(2, false)});
  EXPECT_FALSE(FenceAnswered(2));
  EXPECT_TRUE(Threads().empty());
  gate.reset();
  EXPECT_TRUE(FenceResult(2).ok()) << FenceResult(2);
  const std::vector<std::thread::id> threads = Threads();
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0], threads[1]);
  EXPECT_NE(threads[1], std::this_thread::get_id());
  EXPECT_THAT(ReadFloats(*session_, s.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
}

// Past the device's inline bound (runtime/executor.h) a replay goes to the
// stream's thread even when the stream is idle, so a large one never holds
// the Pipeline worker other sessions take turns at: a launch over the
// bound, a memset over 4 bytes per element of it, or small tasks that add
// up to more than kWorkerReplayLaunches launches of it. At the bound it
// runs inline.
TEST_F(GraphTest, AReplayOverTheInlineBoundsGoesToTheStreamsThread) {
  Open();
  const int64_t bound = device_->inline_launch_elements();
  ASSERT_GT(bound, 0);
  const uint64_t bound_bytes = static_cast<uint64_t>(bound) * 4;
  const int64_t n = bound + 1;
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  const uint64_t grad = WriteFloats(*session_, ones);
  const uint64_t self = WriteFloats(*session_, ones);
  const uint64_t out = WriteFloats(*session_, ones);
  const uint64_t bytes = *session_->Malloc(bound_bytes + 1);
  std::vector<v1::PipelineCommand> at_bound(kWorkerReplayLaunches,
                                            Memset(bytes, bound_bytes, 0));
  std::vector<v1::PipelineCommand> over = at_bound;
  over.push_back(Memset(bytes, 4, 0));
  Apply({Plan(kId, grad, self, out, n), Define(kId + 1, {Launch(kId)}),
         Define(kId + 2, {Memset(bytes, bound_bytes + 1, 0)}),
         Define(kId + 3, at_bound), Define(kId + 4, over)});
  EXPECT_TRUE(SessionError(1).ok()) << SessionError(1);
  uint64_t fence = 2;
  // Replays `graph` on the idle stream: whether all of it ran here.
  auto ran_here = [&](uint64_t graph) {
    AwaitIdle();
    const size_t before = Threads().size();
    Apply({Replay(graph)});
    EXPECT_TRUE(StreamError(fence++).ok());
    const std::vector<std::thread::id> threads = Threads();
    EXPECT_GT(threads.size(), before);
    for (size_t i = before; i < threads.size(); ++i) {
      if (threads[i] != std::this_thread::get_id()) return false;
    }
    return true;
  };
  EXPECT_FALSE(ran_here(kId + 1));
  EXPECT_FALSE(ran_here(kId + 2));
  EXPECT_TRUE(ran_here(kId + 3));
  EXPECT_FALSE(ran_here(kId + 4));
  // The large launch ran: self 1 is not over the threshold 1.
  EXPECT_THAT(ReadFloats(*session_, out, 2), ElementsAre(0, 0));

  // The unary ReplayGraph, on gRPC's callback thread, runs no more there
  // than one unary launch: the bound in all.
  Apply(
      {Define(kId + 5, {Memset(bytes, bound_bytes, 0)}),
       Define(kId + 6, {Memset(bytes, bound_bytes, 0), Memset(bytes, 4, 0)})});
  EXPECT_TRUE(SessionError(fence++).ok());
  auto unary_ran_here = [&](uint64_t graph) {
    AwaitIdle();
    const size_t before = Threads().size();
    EXPECT_TRUE(
        ReplayGraph(*session_, graph, *GetStream(0), kUnaryReplayLaunches)
            .ok());
    EXPECT_TRUE(StreamError(fence++).ok());
    const std::vector<std::thread::id> threads = Threads();
    EXPECT_GT(threads.size(), before);
    for (size_t i = before; i < threads.size(); ++i) {
      if (threads[i] != std::this_thread::get_id()) return false;
    }
    return true;
  };
  EXPECT_TRUE(unary_ran_here(kId + 5));
  EXPECT_FALSE(unary_ran_here(kId + 6));
  EXPECT_TRUE(ran_here(kId + 6));
}

// Closing the session (CancelWork, as CloseSession and SIGTERM do) while a
// replay runs inline stops it at the running task: the applying thread
// returns, the rest of the replay does not run, and the stream's error
// names the task.
TEST_F(GraphTest, CancellingTheSessionsWorkStopsAReplayRunningInline) {
  Open();
  HoldLaunch(2);
  const Step a = MakeStep();
  const Step b = MakeStep();
  const Step c = MakeStep();
  Apply({Plan(kId, a.grad, a.self, a.out, 4),
         Plan(kId + 1, b.grad, b.self, b.out, 4),
         Plan(kId + 2, c.grad, c.self, c.out, 4),
         Define(kId + 3, {Launch(kId), Launch(kId + 1), Launch(kId + 2)})});
  EXPECT_TRUE(SessionError(1).ok());
  AwaitIdle();
  std::thread applier([this] { Apply({Replay(kId + 3)}); });
  const std::thread::id applying = applier.get_id();
  device_->probe->AwaitHolding();
  session_->CancelWork();
  applier.join();
  EXPECT_THAT(Threads(), ElementsAre(applying, applying));
  absl::Status error = StreamError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(error.message(),
            "replay of graph 4611686018427387907: task 2 of 3: the held "
            "launch was stopped");
  EXPECT_THAT(ReadFloats(*session_, a.out, 4),
              ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_THAT(ReadFloats(*session_, c.out, 4), ElementsAre(-1, -1, -1, -1));
  // A cancelled stream takes no more replays.
  Apply({Replay(kId + 3)});
  EXPECT_EQ(StreamError(3).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Threads().size(), 2u);
}

// The operator execute time-out (aclrtSetOpExecuteTimeOut) bounds a replay
// run inline as it bounds one on the stream's thread: the held task is
// interrupted, the rest does not run, and the error is 107020 naming the
// task.
TEST_F(GraphTest, AnInlineReplayPastTheOpTimeoutIsStoppedAndNamed) {
  Open();
  HoldLaunch(2);
  const Step a = MakeStep();
  const Step b = MakeStep();
  const Step c = MakeStep();
  Apply({Plan(kId, a.grad, a.self, a.out, 4),
         Plan(kId + 1, b.grad, b.self, b.out, 4),
         Plan(kId + 2, c.grad, c.self, c.out, 4),
         Define(kId + 3, {Launch(kId), Launch(kId + 1), Launch(kId + 2)})});
  EXPECT_TRUE(SessionError(1).ok());
  GetStream(0)->SetTaskTimeout(absl::Milliseconds(20));
  AwaitIdle();
  // Returns once the time-out has stopped the held launch.
  Apply({Replay(kId + 3)});
  const std::thread::id here = std::this_thread::get_id();
  EXPECT_THAT(Threads(), ElementsAre(here, here));
  absl::Status error = StreamError(2);
  EXPECT_EQ(error.code(), absl::StatusCode::kDeadlineExceeded) << error;
  EXPECT_EQ(kernels::GetAclnnStatus(error), 107020);
  EXPECT_THAT(error.message(),
              HasSubstr("replay of graph 4611686018427387907: task 2 of 3: "
                        "the held launch was stopped"));
  EXPECT_THAT(ReadFloats(*session_, c.out, 4), ElementsAre(-1, -1, -1, -1));
}

TEST_F(GraphTest, GraphIdsFollowTheClientIdRule) {
  Open();
  const Step s = MakeStep();
  Apply({Define(kId + 5, {Memset(s.out, 4, 0)}),
         Define(kId + 5, {Memset(s.out, 4, 0)})});
  absl::Status error = SessionError(1);
  EXPECT_EQ(kernels::GetAclnnStatus(error), kernels::kAclnnErrParamInvalid);
  EXPECT_THAT(error.message(), HasSubstr("graph id 4611686018427387909 cannot "
                                         "be chosen"));
  EXPECT_EQ(session_->Stats().graphs, 1u);
}

}  // namespace
}  // namespace opserver
