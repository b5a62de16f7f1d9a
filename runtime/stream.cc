#include "runtime/stream.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "common/task_position.h"
#include "common/thread_start.h"
#include "kernels/aclnn_status.h"
#include "runtime/deadline_timer.h"

namespace opserver {
namespace {

// The nice value of stream threads (see Stream::Loop).
constexpr int kStreamThreadNice = 10;

// ACL_ERROR_RT_TASK_TIMEOUT: a task ran past the operator execute
// time-out.
constexpr int32_t kAclErrorRtTaskTimeout = 107020;

// A synchronize's error once a stopped stream skipped `skipped` tasks.
absl::Status SayingSkipped(const absl::Status& status, uint64_t skipped) {
  absl::Status said(
      status.code(),
      absl::StrCat(status.message(), " (the stream stops on failure: ", skipped,
                   " later task", skipped == 1 ? " was" : "s were",
                   " skipped)"));
  status.ForEachPayload([&](absl::string_view key, const absl::Cord& value) {
    said.SetPayload(key, value);
  });
  return said;
}

}  // namespace

void StreamThreads::Add() {
  {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  if (parent_ != nullptr) parent_->Add();
}

void StreamThreads::Done() {
  {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  if (parent_ != nullptr) parent_->Done();
}

int StreamThreads::count() const {
  absl::MutexLock lock(&mu_);
  return count_;
}

bool StreamThreads::WaitForZero(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](int* n) ABSL_NO_THREAD_SAFETY_ANALYSIS { return *n == 0; },
          &count_),
      timeout);
}

std::shared_ptr<StreamThreads> StreamThreads::Default() {
  static auto* const threads =
      new std::shared_ptr<StreamThreads>(std::make_shared<StreamThreads>());
  return *threads;
}

// Guarded by the stream's State::mu.
struct Stream::GateState {
  std::function<void()> reached;
  std::function<void()> cancelled;
  bool released = false;    // The Gate is gone.
  bool forced = false;      // Opened by Cancel.
  bool holding = false;     // It holds the stream (State::busy).
  bool in_reached = false;  // `reached` runs now; opening waits for it.
};

struct Stream::State {
  State(size_t max, std::shared_ptr<StreamThreads> group,
        std::shared_ptr<DeviceStream> device_stream)
      : max_queued(max),
        threads(std::move(group)),
        device(std::move(device_stream)),
        asynchronous(device != nullptr && device->asynchronous()) {}

  // One queue entry: a task (work, droppable), a callback (always runs) or
  // a gate (see Hold).
  struct Item {
    Task task;
    std::function<void()> callback;
    std::shared_ptr<GateState> gate;
    // A synchronize's ticket (SynchronizeOrForget), for Forget; 0 if none.
    uint64_t ticket = 0;
    // A task's position on the stream (see common/task_position.h).
    uint64_t position = 0;
  };

  // Lets the stream go on once `gate` no longer holds it: released or
  // forced open, and its `reached` callback has returned.
  void OpenIfDoneLocked(GateState& gate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (gate.holding && !gate.in_reached && (gate.released || gate.forced)) {
      gate.holding = false;
      holder = nullptr;
      busy = false;
    }
  }

  // Nothing runs, waits or is issued and not yet synchronized: work
  // handed to the stream now may run at once on the caller's thread.
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !busy && queue.empty() && issued.empty();
  }
  // Claims the stream for the caller when idle; then the caller runs work
  // inline and calls Release().
  bool TryClaimIdle() {
    absl::MutexLock lock(&mu);
    if (!IdleLocked()) return false;
    busy = true;
    return true;
  }
  void Release() {
    absl::MutexLock lock(&mu);
    busy = false;
  }
  absl::Status RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (cancelled) return absl::CancelledError(cancel_reason);
    if (max_queued != 0 && queued_tasks >= max_queued) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the stream already has ", queued_tasks,
          " launches queued, the limit (--max_queued_per_stream); synchronize "
          "it before queueing more"));
    }
    return absl::OkStatus();
  }
  // Only whoever holds `busy` touches first_error.
  void Record(absl::Status status, uint64_t position) {
    if (!status.ok() && first_error.ok()) {
      first_error = WithTaskPosition(std::move(status), position);
    }
  }
  // The next position, for a task or a failure queued now.
  uint64_t NextPositionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return ++positions;
  }
  uint64_t NextPosition() {
    absl::MutexLock lock(&mu);
    return NextPositionLocked();
  }
  // With ACL_STOP_ON_FAILURE, a task that would start after the stream's
  // error is known (and not yet reported) is skipped. Whoever holds `busy`.
  bool SkipAfterFailure() {
    if (first_error.ok()) return false;
    absl::MutexLock lock(&mu);
    if (!stop_on_failure) return false;
    ++skipped;
    return true;
  }
  // Runs `task`. On a host-only stream it is then done. On a synchronous
  // device the device stream is synchronized at once (it costs nothing),
  // so the task is done too. On an asynchronous one the task is kept, with
  // what it holds, as issued and not yet synchronized (`issued`) until
  // Complete(), which the thread calls once nothing is runnable (or at
  // kMaxUnsynchronizedTasks), so consecutive tasks do not each wait for
  // the device. A task that fails to issue completes the backlog before
  // its error is recorded, so errors stay in issue order. Only whoever
  // holds `busy` calls it.
  // Runs `work` (a task, or the device's synchronize of issued tasks)
  // within the task time-out, if one is set: past it the device is asked
  // to stop it (DeviceStream::SetInterrupted) and the result is
  // ACL_ERROR_RT_TASK_TIMEOUT, whatever `work` returned. Whoever holds
  // `busy`.
  absl::Status Bounded(const std::function<absl::Status()>& work) {
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
    const uint64_t key = DeadlineTimer::Shared().At(
        absl::Now() + limit, [watch, stream = device] {
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
  void RunTask(Task task, uint64_t position) {
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
  // Synchronizes the device stream and completes the tasks issued since
  // the last time: its error is theirs (recorded now, before anything
  // queued after them), then their captures (buffers, staging memory,
  // budgets) are released. Only whoever holds `busy` calls it.
  void Complete() {
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

  const size_t max_queued;
  const std::shared_ptr<StreamThreads> threads;
  // Dropped by the thread as it stops (Loop), before it leaves its group.
  std::shared_ptr<DeviceStream> device;
  // DeviceStream::asynchronous(): tasks are completed in batches.
  const bool asynchronous;
  mutable absl::Mutex mu;
  std::deque<Item> queue ABSL_GUARDED_BY(mu);
  // Tasks run on an asynchronous device and not yet synchronized, in issue
  // order (see RunTask). The stream is not idle while any are held.
  std::vector<Task> issued ABSL_GUARDED_BY(mu);
  uint64_t first_issued ABSL_GUARDED_BY(mu) = 0;  // issued.front()'s position.
  // Positions handed out so far (tasks and failures queued).
  uint64_t positions ABSL_GUARDED_BY(mu) = 0;
  // SetStopOnFailure; tasks skipped since the last Synchronize.
  bool stop_on_failure ABSL_GUARDED_BY(mu) = false;
  // SetTaskTimeout; zero: none.
  absl::Duration task_timeout ABSL_GUARDED_BY(mu);
  uint64_t skipped ABSL_GUARDED_BY(mu) = 0;
  size_t queued_tasks ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  std::string cancel_reason ABSL_GUARDED_BY(mu);
  // A Fail() is queued with no Synchronize queued after it.
  bool failure_queued ABSL_GUARDED_BY(mu) = false;
  // Tasks dropped by Cancel that no Synchronize has reported yet.
  bool dropped ABSL_GUARDED_BY(mu) = false;
  // SynchronizeOrForget tickets handed out.
  uint64_t tickets ABSL_GUARDED_BY(mu) = 0;
  // An item (queued or inline) is running, or a gate holds the stream; the
  // thread waits for it.
  bool busy ABSL_GUARDED_BY(mu) = false;
  // Run by the thread once it has left its group (WhenStopped).
  std::vector<std::function<void()>> on_stopped ABSL_GUARDED_BY(mu);
  // The gate holding the stream, if any.
  std::shared_ptr<GateState> holder ABSL_GUARDED_BY(mu);
  absl::Status first_error;
};

Stream::Stream(size_t max_queued, std::shared_ptr<StreamThreads> threads)
    : Stream(nullptr, max_queued, std::move(threads)) {}

Stream::Stream(std::unique_ptr<DeviceStream> device_stream, size_t max_queued,
               std::shared_ptr<StreamThreads> threads)
    : state_(std::make_shared<State>(
          max_queued,
          threads != nullptr ? std::move(threads) : StreamThreads::Default(),
          std::move(device_stream))) {
  state_->threads->Add();
  // The state is moved into Loop, not copied: the thread's reference (the
  // last once the Stream is gone, and with it the device stream) must go
  // before the thread leaves its group. A capture lived until the thread
  // function returned, after that: whoever waits for the group (the session
  // manager) let the device go while its stream was still alive.
  // std::thread may throw (no more threads): the caller sees the exception
  // and the count is given back.
  try {
    NewThread([state = state_]() mutable { Loop(std::move(state)); }).detach();
  } catch (...) {
    state_->threads->Done();
    throw;
  }
}

Stream::~Stream() {
  Cancel();
  absl::MutexLock lock(&state_->mu);
  state_->stopping = true;
}

void Stream::Loop(std::shared_ptr<State> state) {
  // Queued work (launches, memsets, copies of any size) runs behind the
  // small calls gRPC's threads answer, as the work pool's does: under
  // contention a tenant's step is not queued behind another tenant's bulk
  // work for the CPU, and that work still has every cycle nobody else
  // wants. Best effort (Linux: per thread, no privilege needed).
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)),
                    kStreamThreadNice);
  for (;;) {
    State::Item item;
    bool complete = false;
    {
      absl::MutexLock lock(&state->mu);
      state->mu.Await(absl::Condition(
          +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !s->busy &&
                   (s->stopping || !s->queue.empty() || !s->issued.empty());
          },
          state.get()));
      // Issued tasks are completed (the device synchronized) once nothing
      // runnable is left (nothing queued) and before anything that is not
      // a task: a callback or gate observes the device done with
      // everything queued before it.
      if (!state->issued.empty() &&
          (state->queue.empty() || !state->queue.front().task)) {
        state->busy = true;
        complete = true;
      } else {
        if (state->queue.empty()) break;  // Stopping and drained.
        item = std::move(state->queue.front());
        state->queue.pop_front();
        if (item.task) --state->queued_tasks;
        // A gate whose transfer ended before reaching the stream holds
        // nothing.
        if (item.gate != nullptr && item.gate->released) continue;
        state->busy = true;
        if (item.gate != nullptr) {
          item.gate->holding = true;
          item.gate->in_reached = true;
          state->holder = item.gate;
        }
      }
    }
    if (complete) {
      state->Complete();
      state->Release();
      continue;
    }
    if (item.gate != nullptr) {
      // The stream stays busy until the gate opens (not when this returns).
      std::function<void()> reached = std::move(item.gate->reached);
      reached();
      reached = nullptr;
      absl::MutexLock lock(&state->mu);
      item.gate->in_reached = false;
      state->OpenIfDoneLocked(*item.gate);
      continue;
    }
    if (item.task) {
      state->RunTask(std::move(item.task), item.position);
    } else {
      item.callback();
    }
    item = State::Item();  // Release captures before reporting idle.
    state->Release();
  }
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
  state.reset();  // See the constructor: before Done().
  threads->Done();
  for (std::function<void()>& callback : stopped) callback();
}

absl::Status Stream::Enqueue(Task task, bool inline_if_idle) {
  State& s = *state_;
  if (inline_if_idle && s.TryClaimIdle()) {
    absl::Status room;
    {
      absl::MutexLock lock(&s.mu);
      if (s.cancelled) room = absl::CancelledError(s.cancel_reason);
    }
    if (room.ok()) s.RunTask(std::move(task), s.NextPosition());
    s.Release();
    return room;
  }
  absl::MutexLock lock(&s.mu);
  RETURN_IF_ERROR(s.RoomLocked());
  State::Item item{std::move(task), nullptr};
  item.position = s.NextPositionLocked();
  s.queue.push_back(std::move(item));
  ++s.queued_tasks;
  return absl::OkStatus();
}

void Stream::Synchronize(std::function<void(absl::Status)> done) {
  SynchronizeOrForget(std::move(done));
}

uint64_t Stream::SynchronizeOrForget(std::function<void(absl::Status)> done) {
  State* s = state_.get();
  auto report = [s, done = std::move(done)] {
    absl::Status status = std::exchange(s->first_error, absl::OkStatus());
    uint64_t skipped;
    {
      absl::MutexLock lock(&s->mu);
      if (std::exchange(s->dropped, false) && status.ok()) {
        status = absl::CancelledError(
            "queued work was cancelled: the stream or its session was closed");
      }
      skipped = std::exchange(s->skipped, 0);
    }
    done(skipped == 0 ? std::move(status) : SayingSkipped(status, skipped));
  };
  if (s->TryClaimIdle()) {
    report();
    s->Release();
    return 0;
  }
  absl::MutexLock lock(&s->mu);
  s->failure_queued = false;
  const uint64_t ticket = ++s->tickets;
  s->queue.push_back(State::Item{nullptr, std::move(report), nullptr, ticket});
  return ticket;
}

bool Stream::Forget(uint64_t ticket) {
  State::Item dropped;  // Destroyed outside the lock.
  absl::MutexLock lock(&state_->mu);
  std::deque<State::Item>& queue = state_->queue;
  auto it = std::find_if(
      queue.begin(), queue.end(),
      [ticket](const auto& item) { return item.ticket == ticket; });
  if (ticket == 0 || it == queue.end()) return false;
  dropped = std::move(*it);
  queue.erase(it);
  return true;
}

void Stream::Fail(absl::Status error) {
  State* s = state_.get();
  if (s->TryClaimIdle()) {
    s->Record(std::move(error), s->NextPosition());
    s->Release();
    return;
  }
  absl::MutexLock lock(&s->mu);
  if (s->failure_queued) return;
  s->failure_queued = true;
  // A callback, not a task: Cancel does not drop it, and it does not count
  // against max_queued.
  s->queue.push_back(
      State::Item{nullptr, [s, error = std::move(error),
                            position = s->NextPositionLocked()]() mutable {
                    {
                      absl::MutexLock lock(&s->mu);
                      s->failure_queued = false;
                    }
                    s->Record(std::move(error), position);
                  }});
}

void Stream::WhenReached(std::function<void()> reached) {
  State& s = *state_;
  if (s.TryClaimIdle()) {
    reached();
    s.Release();
    return;
  }
  absl::MutexLock lock(&s.mu);
  s.queue.push_back(State::Item{nullptr, std::move(reached)});
}

void Stream::WhenReachedOrCancelled(std::function<void(absl::Status)> reached) {
  State* s = state_.get();
  WhenReached([s, reached = std::move(reached)] {
    absl::Status status;
    {
      absl::MutexLock lock(&s->mu);
      if (s->cancelled) status = absl::CancelledError(s->cancel_reason);
    }
    reached(std::move(status));
  });
}

void Stream::FailWith(std::function<absl::Status()> error) {
  State* s = state_.get();
  if (s->TryClaimIdle()) {
    s->Record(error(), s->NextPosition());
    s->Release();
    return;
  }
  absl::MutexLock lock(&s->mu);
  // A callback, not a task: Cancel does not drop it, and it does not count
  // against max_queued.
  s->queue.push_back(State::Item{nullptr, [s, error = std::move(error),
                                           position = s->NextPositionLocked()] {
                                   s->Record(error(), position);
                                 }});
}

void Stream::SetTaskTimeout(absl::Duration timeout) {
  absl::MutexLock lock(&state_->mu);
  state_->task_timeout = timeout;
}

void Stream::SetStopOnFailure(bool stop) {
  absl::MutexLock lock(&state_->mu);
  state_->stop_on_failure = stop;
}

void Stream::WhenStopped(std::function<void()> stopped) {
  // The thread takes these only after ~Stream, which cannot have begun.
  absl::MutexLock lock(&state_->mu);
  state_->on_stopped.push_back(std::move(stopped));
}

absl::Status Stream::Hold(const std::shared_ptr<Gate>& gate,
                          std::function<void()> reached,
                          std::function<void()> cancelled) {
  auto held = std::make_shared<GateState>();
  held->cancelled = std::move(cancelled);
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.cancelled) {
      return absl::CancelledError(
          "the stream was destroyed or its session closed");
    }
    gate->stream_ = state_;
    gate->state_ = held;
    if (!s.IdleLocked()) {
      held->reached = std::move(reached);
      s.queue.push_back(State::Item{nullptr, nullptr, std::move(held)});
      return absl::OkStatus();
    }
    // Idle: the gate holds the stream from now on.
    s.busy = true;
    held->holding = true;
    held->in_reached = true;
    s.holder = held;
  }
  reached();
  reached = nullptr;
  absl::MutexLock lock(&s.mu);
  held->in_reached = false;
  s.OpenIfDoneLocked(*held);
  return absl::OkStatus();
}

Stream::Gate::~Gate() {
  if (stream_ == nullptr) return;
  std::function<void()> reached, cancelled;  // Destroyed outside the lock.
  absl::MutexLock lock(&stream_->mu);
  state_->released = true;
  if (!state_->in_reached) reached = std::move(state_->reached);
  cancelled = std::move(state_->cancelled);
  stream_->OpenIfDoneLocked(*state_);
}

absl::Status Stream::SynchronizeAndWait() {
  absl::Notification notification;
  absl::Status result;
  Synchronize([&](absl::Status status) {
    result = std::move(status);
    notification.Notify();
  });
  notification.WaitForNotification();
  return result;
}

void Stream::Cancel(absl::string_view why) {
  // A `cancelled` callback may end the last user of this Stream object.
  const std::shared_ptr<State> state = state_;
  std::deque<State::Item> dropped;  // Destroyed outside the lock.
  std::vector<std::function<void()>> notify;
  {
    State& s = *state;
    absl::MutexLock lock(&s.mu);
    if (!s.cancelled) s.cancel_reason = std::string(why);
    s.cancelled = true;
    std::deque<State::Item> kept;
    for (State::Item& item : s.queue) {
      if (item.task) s.dropped = true;
      if (item.gate != nullptr && item.gate->cancelled) {
        notify.push_back(std::move(item.gate->cancelled));
      }
      (item.callback ? kept : dropped).push_back(std::move(item));
    }
    s.queue = std::move(kept);
    s.queued_tasks = 0;
    // Nothing runs on a cancelled stream any more, so the holding transfer
    // no longer orders anything: the stream goes on now (teardown must not
    // wait for a stalled client), and the transfer is ended.
    if (std::shared_ptr<GateState> holder = s.holder; holder != nullptr) {
      holder->forced = true;
      if (holder->cancelled) notify.push_back(std::move(holder->cancelled));
      s.OpenIfDoneLocked(*holder);
    }
  }
  // The running launch stops early too: nothing it computes is wanted now,
  // and teardown and shutdown wait for it.
  if (state->device != nullptr) state->device->CancelRunning();
  for (std::function<void()>& cancelled : notify) cancelled();
}

absl::Status Stream::CheckRoom() const {
  absl::MutexLock lock(&state_->mu);
  return state_->RoomLocked();
}

const std::shared_ptr<DeviceStream>& Stream::device_stream() const {
  return state_->device;
}

size_t Stream::queued() const {
  absl::MutexLock lock(&state_->mu);
  return state_->queued_tasks;
}

bool Stream::busy() const {
  absl::MutexLock lock(&state_->mu);
  return !state_->IdleLocked();
}

}  // namespace opserver
