#include "runtime/stream_state.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/aclnn_status.h"
#include "runtime/deadline_timer.h"

namespace opserver {
namespace {

// ACL_ERROR_RT_TASK_TIMEOUT: a task ran past the operator execute
// time-out.
constexpr int32_t kAclErrorRtTaskTimeout = 107020;

}  // namespace

absl::Status Stream::State::Bounded(const std::function<absl::Status()>& work) {
  absl::Duration limit;
  {
    absl::MutexLock lock(&mu);
    limit = task_timeout;
  }
  if (limit <= absl::ZeroDuration() || device == nullptr) return work();
  // The timer interrupts only while `work` runs: `done` is set under the
  // watch's lock, after which it does nothing.
  struct Watch {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    bool fired ABSL_GUARDED_BY(mu) = false;
  };
  auto watch = std::make_shared<Watch>();
  const uint64_t key =
      DeadlineTimer::Shared().At(absl::Now() + limit, [watch, stream = device] {
        absl::MutexLock lock(&watch->mu);
        if (watch->done) return;
        watch->fired = true;
        stream->SetInterrupted(true);
      });
  absl::Status status = work();
  DeadlineTimer::Shared().Cancel(key);
  bool fired;
  {
    absl::MutexLock lock(&watch->mu);
    watch->done = true;
    fired = watch->fired;
  }
  if (!fired) return status;
  device->SetInterrupted(false);
  return kernels::AclnnError(
      kAclErrorRtTaskTimeout, absl::StatusCode::kDeadlineExceeded,
      absl::StrCat("the task ran past the operator execute time-out of ",
                   absl::FormatDuration(limit),
                   " (aclrtSetOpExecuteTimeOut) and was stopped",
                   status.ok() ? "" : ": ", status.message()));
}

void Stream::State::RunTask(Task task, uint64_t position) {
  if (SkipAfterFailure()) return;
  absl::Status status = Bounded(task);
  if (device == nullptr) {
    Record(std::move(status), position);
    return;
  }
  if (!asynchronous) {
    Record(std::move(status), position);
    Record(Bounded([this] { return device->Synchronize(); }), position);
    return;
  }
  if (!status.ok()) {
    Complete();  // Before this task's own error.
    Record(std::move(status), position);
    return;
  }
  size_t held;
  {
    absl::MutexLock lock(&mu);
    if (issued.empty()) first_issued = position;
    issued.push_back(std::move(task));
    held = issued.size();
  }
  if (held >= kMaxUnsynchronizedTasks) Complete();
}

void Stream::State::Complete() {
  std::vector<Task> done;
  uint64_t position;
  {
    absl::MutexLock lock(&mu);
    done.swap(issued);
    position = first_issued;
  }
  // The device cannot say which of them failed: the first stands for all.
  if (device != nullptr) {
    Record(Bounded([this] { return device->Synchronize(); }), position);
  }
  done.clear();  // Outside the lock: captures may call back in.
}

Stream::State::Next Stream::State::TakeNext(Item& item) {
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !s->busy &&
               (s->stopping || !s->queue.empty() || !s->issued.empty());
      },
      this));
  if (!issued.empty() && (queue.empty() || !queue.front().task)) {
    busy = true;
    return Next::kComplete;
  }
  if (queue.empty()) return Next::kStop;  // Stopping and drained.
  item = std::move(queue.front());
  queue.pop_front();
  if (item.task) --queued_tasks;
  // A gate whose transfer ended before reaching the stream holds nothing.
  if (item.gate != nullptr && item.gate->released) return Next::kSkip;
  busy = true;
  if (item.gate == nullptr) return Next::kRun;
  item.gate->holding = true;
  item.gate->in_reached = true;
  holder = item.gate;
  return Next::kGate;
}

void Stream::State::RunGate(GateState& gate) {
  std::function<void()> reached = std::move(gate.reached);
  reached();
  reached = nullptr;
  absl::MutexLock lock(&mu);
  gate.in_reached = false;
  OpenIfDoneLocked(gate);
}

void Stream::State::RunItem(Item item) {
  if (item.task) {
    RunTask(std::move(item.task), item.position);
  } else {
    item.callback();
  }
  item = Item();  // Release captures before reporting idle.
  Release();
}

void Stream::State::Finish(std::shared_ptr<State> state) {
  std::shared_ptr<StreamThreads> threads = state->threads;
  std::vector<std::function<void()>> stopped;
  std::shared_ptr<DeviceStream> device;
  {
    absl::MutexLock lock(&state->mu);
    stopped.swap(state->on_stopped);
    // Nothing uses it any more; a gate still held (its transfer not ended
    // yet) keeps the state, not the device stream.
    device = std::move(state->device);
  }
  device.reset();
  state.reset();  // See Stream's constructor: before Done().
  threads->Done();
  for (std::function<void()>& callback : stopped) callback();
}

}  // namespace opserver
