// The state a Stream shares with its thread (internal to :stream).
#ifndef OPSERVER_RUNTIME_STREAM_STATE_H_
#define OPSERVER_RUNTIME_STREAM_STATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/task_position.h"
#include "devices/device.h"
#include "runtime/stream.h"

namespace opserver {

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
  // Runs `work` (a task, or the device's synchronize of issued tasks)
  // within the task time-out, if one is set: past it the device is asked
  // to stop it (DeviceStream::SetInterrupted) and the result is
  // ACL_ERROR_RT_TASK_TIMEOUT, whatever `work` returned. Whoever holds
  // `busy`.
  absl::Status Bounded(const std::function<absl::Status()>& work);
  // Runs `task`. On a host-only stream it is then done. On a synchronous
  // device the device stream is synchronized at once (it costs nothing),
  // so the task is done too. On an asynchronous one the task is kept, with
  // what it holds, as issued and not yet synchronized (`issued`) until
  // Complete(), which the thread calls once nothing is runnable (or at
  // kMaxUnsynchronizedTasks), so consecutive tasks do not each wait for
  // the device. A task that fails to issue completes the backlog before
  // its error is recorded, so errors stay in issue order. Only whoever
  // holds `busy` calls it.
  void RunTask(Task task, uint64_t position);
  // Synchronizes the device stream and completes the tasks issued since
  // the last time: its error is theirs (recorded now, before anything
  // queued after them), then their captures (buffers, staging memory,
  // budgets) are released. Only whoever holds `busy` calls it.
  void Complete();

  // What the thread does next (Loop).
  enum class Next {
    kStop,      // Stopping, and nothing is left.
    kComplete,  // Complete() the issued tasks; the stream is claimed.
    kGate,      // `item` is a gate now holding the stream.
    kRun,       // `item` is a task or callback to run; the stream is claimed.
    kSkip,      // `item` is a gate whose transfer ended first: nothing to do.
  };
  // Waits until the stream is free and has something to do, and takes it.
  // Issued tasks are completed (the device synchronized) once nothing
  // runnable is left (nothing queued) and before anything that is not a
  // task: a callback or gate observes the device done with everything
  // queued before it.
  Next TakeNext(Item& item);
  // Calls a gate's `reached`; the stream stays busy until the gate opens
  // (not when this returns).
  void RunGate(GateState& gate);
  // Runs a task or a callback, releases what it captured, then the stream.
  void RunItem(Item item);
  // The thread's last step: runs the WhenStopped callbacks once the device
  // stream and the state are gone and the thread has left its group.
  static void Finish(std::shared_ptr<State> state);

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

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_STREAM_STATE_H_
