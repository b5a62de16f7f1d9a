#include "runtime/graph.h"

#include <limits>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/validate.h"
#include "runtime/executor.h"
#include "runtime/log.h"
#include "runtime/memory_ops.h"

namespace opserver {

struct Graph::Task {
  enum class Kind { kLaunch, kMemset, kCopy, kWrite, kRecord, kWait };
  Kind kind = Kind::kLaunch;
  // Launch: the plan and its workspace.
  std::shared_ptr<Executor> executor;
  LaunchWorkspace workspace;
  // Memset, copy, write: where, from where, how much.
  std::shared_ptr<Buffer> dst;
  std::shared_ptr<Buffer> src;
  uint64_t dst_offset = 0;
  uint64_t src_offset = 0;
  uint64_t size = 0;
  int value = 0;
  std::string data;
  // Record, wait.
  std::shared_ptr<Event> event;
  // Describe's line.
  std::string line;
};

struct Graph::Step {
  enum class Kind { kRun, kRecord, kWait };
  Kind kind = Kind::kRun;
  size_t begin = 0;  // kRun: tasks [begin, end); else the event's task.
  size_t end = 0;
  // kRun on a device that captures graphs: the run as the device's own
  // graph (Device::CaptureGraph), replayed as one operation; null when the
  // tasks run one by one.
  std::shared_ptr<const DeviceGraph> device_graph;
  // kRun: the work of its tasks in elements (InlineElements), -1 when one
  // of them is too large to run on the thread that queues the replay.
  int64_t inline_elements = -1;
};

struct Graph::UsedBuffer {
  std::shared_ptr<Buffer> buffer;
  uint64_t handle = 0;
  size_t first_task = 0;
};

// Held by the queued parts of one replay: the graph stays while any is
// queued, and pending_replays counts the replay until the last is gone
// (run or dropped).
struct Graph::ReplayState {
  explicit ReplayState(std::shared_ptr<const Graph> graph)
      : graph(std::move(graph)) {
    this->graph->pending_->fetch_add(1);
  }
  ~ReplayState() { graph->pending_->fetch_sub(1); }
  const std::shared_ptr<const Graph> graph;
  // A part failed: the later parts of this replay do not run.
  std::atomic<bool> failed{false};
};

namespace {

using TaskKind = Graph::Task::Kind;

std::string StreamName(uint64_t stream) {
  return absl::StrCat("stream ", stream);
}

std::string DescribeLaunch(const v1::ExecuteRequest& launch,
                           const Executor& executor) {
  const kernels::OpCall& call = executor.plan->call();
  const kernels::TensorView* out = call.out.has_value() ? &*call.out : nullptr;
  std::string shape = out == nullptr
                          ? std::string("?")
                          : absl::StrCat(kernels::DTypeName(out->dtype), "[",
                                         absl::StrJoin(out->shape, ","), "]");
  std::string workspace =
      launch.workspace_size() == 0
          ? std::string()
          : absl::StrCat(", workspace buffer ", launch.workspace_buffer(), " +",
                         launch.workspace_offset(), " (",
                         launch.workspace_size(), " bytes)");
  return absl::StrCat("launch ", kernels::GetOpInfo(call.op).name, " ", shape,
                      " (executor ", launch.executor(), workspace, ", ",
                      StreamName(launch.stream()), ")");
}

// One task of a definition, validated and prepared; `used` collects the
// buffers it holds.
class TaskBuilder {
 public:
  explicit TaskBuilder(Session& session) : session_(session) {}

  absl::StatusOr<Graph::Task> Build(const v1::PipelineCommand& command) {
    using C = v1::PipelineCommand;
    switch (command.command_case()) {
      case C::kLaunch:
        return Launch(command.launch());
      case C::kMemset:
        return Memset(command.memset());
      case C::kCopy:
        return Copy(command.copy());
      case C::kWrite:
        return Write(command.write());
      case C::kRecordEvent:
        return EventTask(TaskKind::kRecord, command.record_event().event(),
                         command.record_event().stream(), "record_event");
      case C::kWaitEvent:
        return EventTask(TaskKind::kWait, command.wait_event().event(),
                         command.wait_event().stream(), "wait_event");
      default:
        break;
    }
    const google::protobuf::FieldDescriptor* field =
        C::descriptor()->FindFieldByNumber(command.command_case());
    return absl::InvalidArgumentError(absl::StrCat(
        "a graph holds launch, memset, copy, write, record_event and "
        "wait_event commands, not ",
        field != nullptr ? field->name() : std::string("an empty command")));
  }

  // The single-use executors the launches consume.
  const std::vector<uint64_t>& consumed() const { return consumed_; }
  uint64_t write_bytes() const { return write_bytes_; }

 private:
  absl::Status CheckStream(uint64_t stream) {
    return session_.GetStream(stream).status();
  }

  absl::StatusOr<Graph::Task> Launch(const v1::ExecuteRequest& launch) {
    RETURN_IF_ERROR(CheckStream(launch.stream()));
    // A refused plan's launch reports the plan's error, as a launch does.
    if (std::optional<absl::Status> refused =
            session_.RefusedPlan(launch.executor(), /*launch=*/true)) {
      return *std::move(refused);
    }
    bool repeatable = false;
    ASSIGN_OR_RETURN(
        std::shared_ptr<Executor> executor,
        session_.ExecutorForLaunch(launch.executor(), /*consume=*/false,
                                   nullptr, &repeatable));
    if (!repeatable) {
      if (!launched_.insert(launch.executor()).second) {
        return kernels::AclnnError(
            kernels::kAclnnErrInnerNullptr,
            absl::StatusCode::kFailedPrecondition,
            absl::StrCat("executor ", launch.executor(),
                         " is launched twice in the graph and is not "
                         "repeatable (aclSetAclOpExecutorRepeatable)"));
      }
      consumed_.push_back(launch.executor());
    }
    ASSIGN_OR_RETURN(LaunchWorkspace workspace,
                     CheckWorkspace(launch, *executor, session_));
    Graph::Task task;
    task.kind = TaskKind::kLaunch;
    task.line = DescribeLaunch(launch, *executor);
    task.executor = std::move(executor);
    task.workspace = std::move(workspace);
    return task;
  }

  absl::StatusOr<Graph::Task> Memset(const v1::MemsetRequest& memset) {
    RETURN_IF_ERROR(CheckStream(memset.stream()));
    if (memset.value() > 0xff) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memset value ", memset.value(), " is not a byte (0 to 255)"));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> dst,
                     BufferRange(session_, memset.buffer(), memset.offset(),
                                 memset.size(), "memset of"));
    Graph::Task task;
    task.kind = TaskKind::kMemset;
    task.dst = std::move(dst);
    task.dst_offset = memset.offset();
    task.size = memset.size();
    task.value = static_cast<int>(memset.value());
    task.line =
        absl::StrCat("memset buffer ", memset.buffer(), " [", memset.offset(),
                     ", +", memset.size(), ") to ", memset.value(), " (",
                     StreamName(memset.stream()), ")");
    return task;
  }

  absl::StatusOr<Graph::Task> Copy(const v1::CopyDeviceToDeviceRequest& copy) {
    RETURN_IF_ERROR(CheckStream(copy.stream()));
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> src,
                     BufferRange(session_, copy.src_buffer(), copy.src_offset(),
                                 copy.size(), "copy source"));
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> dst,
                     BufferRange(session_, copy.dst_buffer(), copy.dst_offset(),
                                 copy.size(), "copy destination"));
    Graph::Task task;
    task.kind = TaskKind::kCopy;
    task.src = std::move(src);
    task.dst = std::move(dst);
    task.src_offset = copy.src_offset();
    task.dst_offset = copy.dst_offset();
    task.size = copy.size();
    task.line = absl::StrCat(
        "copy buffer ", copy.src_buffer(), " [", copy.src_offset(), ", +",
        copy.size(), ") to buffer ", copy.dst_buffer(), " at ",
        copy.dst_offset(), " (", StreamName(copy.stream()), ")");
    return task;
  }

  absl::StatusOr<Graph::Task> Write(const v1::WriteCommand& write) {
    RETURN_IF_ERROR(CheckStream(write.stream()));
    // The pipelined write's limit (CommandPipeline::kMaxCommandBytes).
    constexpr uint64_t kMaxWriteBytes = 1 << 20;
    if (write.data().size() > kMaxWriteBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("a write of ", write.data().size(),
                       " bytes is over the limit of ", kMaxWriteBytes));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> dst,
                     BufferRange(session_, write.buffer(), write.offset(),
                                 write.data().size(), "write of"));
    Graph::Task task;
    task.kind = TaskKind::kWrite;
    task.dst = std::move(dst);
    task.dst_offset = write.offset();
    task.size = write.data().size();
    task.data = write.data();
    write_bytes_ += task.size;
    task.line = absl::StrCat("write ", task.size, " bytes to buffer ",
                             write.buffer(), " at ", write.offset(), " (",
                             StreamName(write.stream()), ")");
    return task;
  }

  absl::StatusOr<Graph::Task> EventTask(TaskKind kind, uint64_t event,
                                        uint64_t stream,
                                        absl::string_view what) {
    RETURN_IF_ERROR(CheckStream(stream));
    ASSIGN_OR_RETURN(std::shared_ptr<Event> found, session_.GetEvent(event));
    Graph::Task task;
    task.kind = kind;
    task.event = std::move(found);
    task.line = absl::StrCat(what, " ", event, " (", StreamName(stream), ")");
    return task;
  }

  Session& session_;
  absl::flat_hash_set<uint64_t> launched_;
  std::vector<uint64_t> consumed_;
  uint64_t write_bytes_ = 0;
};

// The work of tasks [begin, end) as runtime/executor.h counts it for
// running on the thread that queues a replay: launch elements, and bytes as
// fp32 elements. -1 when a task is too large to run there whatever the
// budget (a launch over the device's `bound`, bytes over 4 * `bound`), and
// for every run when the device runs nothing there (`bound` 0).
int64_t InlineElements(const std::vector<Graph::Task>& tasks, size_t begin,
                       size_t end, int64_t bound) {
  if (bound <= 0) return -1;
  int64_t total = 0;
  for (size_t i = begin; i < end; ++i) {
    const Graph::Task& t = tasks[i];
    if (t.kind == TaskKind::kLaunch) {
      const int64_t elements = t.executor->plan->numel();
      if (elements > bound) return -1;
      total += elements;
    } else {
      const uint64_t as_elements = t.size / 4 + (t.size % 4 != 0 ? 1 : 0);
      if (as_elements > static_cast<uint64_t>(bound)) return -1;
      total += static_cast<int64_t>(t.size / 4);
    }
    // Each task's work is bounded (a launch by --max_launch_elements, bytes
    // by the session's memory) and so is their count: no overflow.
  }
  return total;
}

}  // namespace

Graph::Graph(uint64_t id) : id_(id) {}

Graph::~Graph() = default;

uint64_t Graph::tasks() const { return tasks_.size(); }

std::vector<std::string> Graph::Describe() const {
  std::vector<std::string> lines;
  lines.reserve(tasks_.size());
  for (size_t i = 0; i < tasks_.size(); ++i) {
    lines.push_back(absl::StrCat(i + 1, ": ", tasks_[i].line));
  }
  return lines;
}

absl::Status Graph::Named(const absl::Status& error, size_t task) const {
  return kernels::AclnnError(
      kernels::GetAclnnStatus(error), error.code(),
      Truncated(absl::StrCat("replay of graph ", id_, ": task ", task + 1,
                             " of ", tasks_.size(), ": ", error.message()),
                kMaxKeptErrorBytes));
}

absl::Status Graph::Run(DeviceStream& device, const Step& step) const {
  if (step.device_graph == nullptr) {
    size_t failed = step.begin;
    absl::Status status = Issue(device, step.begin, step.end, &failed);
    return status.ok() ? status : Named(status, failed);
  }
  absl::Status status = device.ReplayGraph(*step.device_graph);
  if (status.ok()) return status;
  // The device ran the run as one: it cannot say which task failed.
  return kernels::AclnnError(
      kernels::GetAclnnStatus(status), status.code(),
      Truncated(
          absl::StrCat("replay of graph ", id_, ": tasks ", step.begin + 1,
                       " to ", step.end, " of ", tasks_.size(),
                       " (one device graph): ", status.message()),
          kMaxKeptErrorBytes));
}

absl::Status Graph::Issue(DeviceStream& device, size_t begin, size_t end,
                          size_t* failed) const {
  for (size_t i = begin; i < end; ++i) {
    const Task& t = tasks_[i];
    absl::Status status;
    switch (t.kind) {
      case TaskKind::kLaunch:
        status = device.Launch(*t.executor->plan, t.workspace.data,
                               t.workspace.size);
        break;
      case TaskKind::kMemset:
        status = device.Memset(static_cast<char*>(t.dst->data()) + t.dst_offset,
                               t.value, t.size);
        break;
      case TaskKind::kCopy:
        status = device.CopyOnDevice(
            static_cast<char*>(t.dst->data()) + t.dst_offset,
            static_cast<const char*>(t.src->data()) + t.src_offset, t.size);
        break;
      case TaskKind::kWrite:
        status = device.CopyToDevice(
            static_cast<char*>(t.dst->data()) + t.dst_offset, t.data.data(),
            t.size);
        break;
      case TaskKind::kRecord:
      case TaskKind::kWait:
        break;  // Steps of their own.
    }
    if (!status.ok()) {
      *failed = i;
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status Graph::CaptureRuns(Device& device) {
  if (!device.captures_graphs()) return absl::OkStatus();
  for (Step& step : steps_) {
    if (step.kind != Step::Kind::kRun) continue;
    bool writes = false;
    for (size_t i = step.begin; i < step.end; ++i) {
      writes = writes || tasks_[i].kind == TaskKind::kWrite;
    }
    if (writes) continue;
    std::optional<size_t> failed;
    absl::StatusOr<std::unique_ptr<DeviceGraph>> captured =
        device.CaptureGraph([&](DeviceStream& stream) {
          size_t at = step.begin;
          absl::Status issued = Issue(stream, step.begin, step.end, &at);
          if (!issued.ok()) failed = at;
          return issued;
        });
    // The device declined: this run replays task by task.
    if (captured.status().code() == absl::StatusCode::kUnimplemented &&
        !failed.has_value()) {
      continue;
    }
    if (!captured.ok()) {
      const absl::Status& error = captured.status();
      const std::string where =
          failed.has_value()
              ? absl::StrCat("task ", *failed + 1, " of ", tasks_.size())
              : absl::StrCat("tasks ", step.begin + 1, " to ", step.end, " of ",
                             tasks_.size(), " (captured as one device graph)");
      return kernels::AclnnError(
          kernels::GetAclnnStatus(error), error.code(),
          Truncated(absl::StrCat(where, ": ", error.message()),
                    kMaxKeptErrorBytes));
    }
    step.device_graph = *std::move(captured);
  }
  return absl::OkStatus();
}

absl::Status Graph::Replay(Stream& stream, int64_t inline_launches) {
  for (const UsedBuffer& used : buffers_) {
    if (used.buffer->freed()) {
      return Named(
          absl::FailedPreconditionError(absl::StrCat(
              "buffer ", used.handle,
              " was freed after the graph was defined; the graph still holds "
              "its memory, but does not run on it (define the graph again "
              "on live buffers)")),
          used.first_task);
    }
  }
  std::shared_ptr<DeviceStream> device = stream.device_stream();
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        "the stream has no device stream (the device could not create one)");
  }
  // What may run here, in elements (runtime/executor.h).
  int64_t budget = 0;
  if (__builtin_mul_overflow(inline_launches, inline_bound_, &budget)) {
    budget = std::numeric_limits<int64_t>::max();
  }
  auto state = std::make_shared<ReplayState>(shared_from_this());
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& step = steps_[i];
    absl::Status status;
    switch (step.kind) {
      case Step::Kind::kRun:
        // The step lives as long as the graph, which `state` holds. The
        // whole run is one task (one hand-off at most, none for a small
        // run on an idle stream: it runs here, in order, as nothing is
        // queued ahead of it).
        status = stream.Enqueue(
            [state, device, &step]() -> absl::Status {
              if (state->failed.load()) return absl::OkStatus();
              absl::Status ran = state->graph->Run(*device, step);
              if (!ran.ok()) state->failed.store(true);
              return ran;
            },
            /*inline_if_idle=*/step.inline_elements >= 0 &&
                step.inline_elements <= budget);
        break;
      case Step::Kind::kRecord:
        status = tasks_[step.begin].event->Record(stream);
        break;
      case Step::Kind::kWait:
        status = tasks_[step.begin].event->Wait(stream);
        break;
    }
    if (status.ok()) continue;
    if (i == 0) return Named(status, step.begin);
    // Part of the replay is queued: the rest is the stream's error, in
    // order, and the parts queued run (they cannot be taken back).
    stream.Fail(Named(status, step.begin));
    break;
  }
  replays_.fetch_add(1);
  if (observer_ != nullptr) observer_->GraphReplayed(tasks_.size());
  return absl::OkStatus();
}

absl::Status DefineGraph(Session& session,
                         const v1::DefineGraphCommand& define) {
  const uint64_t count = static_cast<uint64_t>(define.tasks_size());
  if (count == 0) {
    return absl::InvalidArgumentError("a graph needs at least one task");
  }
  // The cheap refusal first: a definition over the limit is not looked at.
  const uint64_t limit = session.limits().max_graph_tasks_per_session;
  if (count > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a graph of ", count, " tasks is over the limit of ", limit,
        " tasks per session (--max_graph_tasks_per_session)"));
  }
  std::shared_ptr<Graph> graph(new Graph(define.graph()));
  graph->tasks_.reserve(count);
  TaskBuilder builder(session);
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<Graph::Task> task =
        builder.Build(define.tasks(static_cast<int>(i)));
    if (!task.ok()) {
      return kernels::AclnnError(kernels::GetAclnnStatus(task.status()),
                                 task.status().code(),
                                 absl::StrCat("task ", i + 1, " of ", count,
                                              ": ", task.status().message()));
    }
    graph->tasks_.push_back(*std::move(task));
  }
  // The replay's steps, and every buffer once.
  absl::flat_hash_map<const Buffer*, uint64_t> handles =
      session.BufferHandles();
  absl::flat_hash_map<const Buffer*, size_t> seen;
  auto use = [&](const std::shared_ptr<Buffer>& buffer, size_t task) {
    if (buffer == nullptr || !seen.emplace(buffer.get(), task).second) return;
    auto handle = handles.find(buffer.get());
    graph->buffers_.push_back(Graph::UsedBuffer{
        buffer, handle != handles.end() ? handle->second : 0, task});
  };
  absl::flat_hash_set<const Event*> recorded;
  for (size_t i = 0; i < graph->tasks_.size(); ++i) {
    Graph::Task& t = graph->tasks_[i];
    if (t.kind == TaskKind::kRecord || t.kind == TaskKind::kWait) {
      // A wait on a record earlier in the graph holds by the order alone.
      if (t.kind == TaskKind::kWait && recorded.contains(t.event.get())) {
        continue;
      }
      if (t.kind == TaskKind::kRecord) recorded.insert(t.event.get());
      graph->steps_.push_back(Graph::Step{t.kind == TaskKind::kRecord
                                              ? Graph::Step::Kind::kRecord
                                              : Graph::Step::Kind::kWait,
                                          i, i + 1});
      continue;
    }
    if (graph->steps_.empty() ||
        graph->steps_.back().kind != Graph::Step::Kind::kRun) {
      graph->steps_.push_back(Graph::Step{Graph::Step::Kind::kRun, i, i});
    }
    graph->steps_.back().end = i + 1;
    if (t.executor != nullptr) {
      for (const std::shared_ptr<Buffer>& b : t.executor->buffers) use(b, i);
    }
    use(t.workspace.buffer, i);
    use(t.dst, i);
    use(t.src, i);
  }
  graph->inline_bound_ = session.device()->inline_launch_elements();
  for (Graph::Step& step : graph->steps_) {
    if (step.kind != Graph::Step::Kind::kRun) continue;
    step.inline_elements = InlineElements(graph->tasks_, step.begin, step.end,
                                          graph->inline_bound_);
  }
  const uint64_t bytes =
      kGraphBytes + count * kGraphTaskBytes + builder.write_bytes();
  ASSIGN_OR_RETURN(MemoryCharge charge,
                   session.ChargeMemory(
                       bytes, absl::StrCat("a graph of ", count, " tasks")));
  graph->charge_ = std::move(charge);
  graph->observer_ = session.observer();
  // Last, once everything cheaper has passed: a capture costs the device
  // (and, on CANN over libaclnn_remote, a round trip).
  RETURN_IF_ERROR(graph->CaptureRuns(*session.device()));
  return session.AddGraph(define.graph(), std::move(graph), count,
                          builder.consumed());
}

absl::Status ReplayGraph(Session& session, uint64_t graph, Stream& stream,
                         int64_t inline_launches) {
  ASSIGN_OR_RETURN(std::shared_ptr<Graph> found, session.GetGraph(graph));
  return found->Replay(stream, inline_launches);
}

}  // namespace opserver
