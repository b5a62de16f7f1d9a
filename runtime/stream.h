#ifndef OPSERVER_RUNTIME_STREAM_H_
#define OPSERVER_RUNTIME_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "devices/device.h"

namespace opserver {

// A stream as clients see it: an in-order queue of work run by its own host
// thread, so that work on one stream runs in issue order while different
// streams run concurrently. Each owns the DeviceStream (devices/device.h) its
// device made for it; tasks issue their launches and copies there
// (device_stream()).
//
// A task is done, and what it holds (its captures: buffers, staging
// memory, budgets) released, only once the device is done with what it
// issued: only after a DeviceStream::Synchronize that followed it, whose
// error counts as the task's. On a synchronous device
// (DeviceStream::asynchronous() false, the CPU) the stream synchronizes
// after every task, which costs nothing there. On an asynchronous one it
// does not wait per task: a task that issued its work without error is
// kept as issued, not yet synchronized, and the stream synchronizes the
// device and completes the tasks it keeps, in order, only
//   - when nothing runnable is left (the queue is empty: the stream is
//     going idle, or stopping after ~Stream or Cancel),
//   - before anything queued that is not a task: a Synchronize, WhenReached
//     (event records, transfers, fences), Fail callback or a gate (Hold),
//     so each observes the device done with everything queued before it,
//     and what it does on the device stream itself starts from an idle one,
//   - once kMaxUnsynchronizedTasks are kept,
//   - before recording the error of a task that failed to issue (so errors
//     stay in issue order).
// So the ordering below (Synchronize, WhenReached, gates) holds for
// asynchronous devices too, while consecutive launches are issued without
// waiting for the device between them.
//
// Errors are sticky until reported: the first failing task's status is kept
// and handed to the next Synchronize, then cleared, so no failure is lost
// and none is reported twice. It carries the failing task's position on the
// stream (common/task_position.h: 1 for the first task queued; each task
// and each Fail/FailWith counts one). Later tasks still run, unless the
// stream stops on failure (SetStopOnFailure). On an asynchronous
// device the error a Synchronize of the device returns stands for the tasks
// it completed (the device cannot say which one failed), recorded where the
// first of them stood: after every error recorded before them, before any
// recorded after.
//
// Callbacks given to Synchronize/WhenReached run on the stream's thread, or
// at once on the caller's when the stream is idle (nothing queued or
// running): a tiny launch or a synchronize of an idle stream then pays no
// thread hand-off. They must not block for long; gRPC reactors finish from
// there.
//
// Counts the threads of a group of streams, which may outlive their Stream
// objects: a session limits its streams by their threads (a destroyed
// stream still finishing a launch counts), and whoever owns what their tasks
// use (the device) waits for the last one. Groups nest: a thread counts in
// its group and every parent. Thread-safe.
class StreamThreads {
 public:
  explicit StreamThreads(std::shared_ptr<StreamThreads> parent = nullptr)
      : parent_(std::move(parent)) {}
  void Add();
  void Done();
  int count() const;
  // Waits up to `timeout` for the count to reach zero; true if it did.
  bool WaitForZero(absl::Duration timeout);
  // A process-wide group, for streams created without one.
  static std::shared_ptr<StreamThreads> Default();

 private:
  const std::shared_ptr<StreamThreads> parent_;
  mutable absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Work is bounded and cancellable, because clients choose it: at most
// `max_queued` tasks wait at once, and destroying the stream (or Cancel)
// drops every task that has not started. Destruction never waits for the
// running task: the thread finishes it, completes the tasks it keeps issued
// (synchronizing the device), runs the callbacks still queued, lets go of
// the device stream (destroyed then, unless a transfer still holds it) and
// exits on its own, then leaves its StreamThreads group.
class Stream {
 public:
  // Issues work on device_stream() and returns the error that kept it from
  // being issued (OK if none); the work may still be running on an
  // asynchronous device when it returns (see above).
  using Task = std::function<absl::Status()>;
  class Gate;

  // Tasks an asynchronous device's stream keeps issued and not yet
  // synchronized before it synchronizes anyway: it bounds what they hold
  // (buffers, staging bytes) and how long a failure goes unnoticed.
  static constexpr size_t kMaxUnsynchronizedTasks = 64;

  // `max_queued` = 0: unbounded (for tests and in-process users).
  // `threads` (null = StreamThreads::Default()) counts this stream's thread
  // until it exits. Throws std::system_error when no thread can be started.
  explicit Stream(size_t max_queued = 0,
                  std::shared_ptr<StreamThreads> threads = nullptr);
  // The same with `device_stream` (from Device::CreateStream) as the stream
  // its tasks run on; the constructor above makes a host-only stream (no
  // device stream, for tests of the queue itself).
  Stream(std::unique_ptr<DeviceStream> device_stream, size_t max_queued,
         std::shared_ptr<StreamThreads> threads);
  // Cancels the work not yet started and returns without waiting for the
  // running task.
  ~Stream();

  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues `task`; returns at once. With `inline_if_idle`, an idle stream
  // runs it on the calling thread instead (for tasks too small to be worth
  // a hand-off; on an asynchronous device it is then kept issued and the
  // stream's thread synchronizes it, so the caller never waits for the
  // device). RESOURCE_EXHAUSTED when `max_queued` tasks already wait,
  // CANCELLED (with Cancel's reason) after Cancel(); the task is not run
  // then.
  absl::Status Enqueue(Task task, bool inline_if_idle = false);

  // Calls `done` once everything queued before this call has run (or was
  // cancelled) and the device has finished it, with the first error since
  // the previous Synchronize (OK if none; CANCELLED if queued work was
  // dropped).
  void Synchronize(std::function<void(absl::Status)> done);
  // The same for a caller that may stop waiting (an RPC cancelled or past
  // its deadline): returns a ticket for Forget, or 0 when `done` was
  // called already.
  uint64_t SynchronizeOrForget(std::function<void(absl::Status)> done);
  // Drops the synchronize `ticket` while it is still queued: `done` is
  // destroyed uncalled, and the error it would have taken stays for the
  // next Synchronize. False when it has run or is running.
  bool Forget(uint64_t ticket);

  // Calls `reached` once everything queued before this call has run and
  // the device has finished it (its errors recorded); does not consume the
  // sticky error. Used to order transfers after compute, and for event
  // records.
  void WhenReached(std::function<void()> reached);
  // The same, telling `reached` whether the stream got there or was
  // cancelled first: OK, or CANCELLED with Cancel's reason when the stream
  // was cancelled before running it (the work queued before it may have
  // been dropped). For event records, which must not pass for complete
  // then.
  void WhenReachedOrCancelled(std::function<void(absl::Status)> reached);

  // Calls `stopped` once this stream is destroyed and its thread has left
  // its StreamThreads group, on that thread: after the running task and the
  // callbacks still queued. So whoever waits for it (DestroyStream) finds
  // the group's count without this stream.
  void WhenStopped(std::function<void()> stopped);

  // Holds the stream for the length of a transfer: once
  // everything queued before this call has run, `reached` is called and
  // the stream stays busy, so work queued after the gate waits, until
  // `gate` is destroyed (whoever holds the last reference: the transfer, or
  // the zero-copy slices it sent). A gate destroyed before it is reached is
  // skipped. Cancel() opens every gate (no more work runs on a cancelled
  // stream) and calls `cancelled` for those whose transfer still holds them,
  // so the transfer ends instead of pinning its session; `reached` then
  // never runs for a gate still queued. Both callbacks run on the stream's
  // thread, the Cancel caller's or, when the stream is idle, at once on
  // this caller's (so the caller must not hold a lock they take). CANCELLED
  // (and nothing is called) when the stream was cancelled already.
  absl::Status Hold(const std::shared_ptr<Gate>& gate,
                    std::function<void()> reached,
                    std::function<void()> cancelled);

  // Records `error` as the stream's deferred error in issue order, as if a
  // task queued now had failed with it: the first Synchronize after this
  // call reports it unless an earlier failure comes first. For work the
  // stream never ran (a pipelined launch the server refused). Bounded: a
  // failure queued behind no Synchronize is not queued twice, as only the
  // first could be reported.
  void Fail(absl::Status error);
  // The same with the error `error()` returns once the stream reaches this
  // call (nothing when OK): for an error not known yet when it is queued,
  // such as how the event record a wait was released by completed.
  void FailWith(std::function<absl::Status()> error);

  // ACL_STOP_ON_FAILURE (true) or ACL_CONTINUE_ON_FAILURE (false, the
  // default): once the stream has an error not yet reported, a stopped
  // stream skips the tasks that would start after it (work already issued
  // to an asynchronous device still runs), until a Synchronize takes the
  // error, whose message then says how many were skipped. Callbacks, event
  // records and gates are not tasks: they still run.
  void SetStopOnFailure(bool stop);

  // The operator execute time-out (aclrtSetOpExecuteTimeOut; zero, the
  // default: none) for the tasks that start from now on: a task not done
  // `timeout` after it started (on an asynchronous device: the device's
  // synchronize that completes it) is interrupted on the device
  // (DeviceStream::SetInterrupted) and fails with DEADLINE_EXCEEDED, aclnn
  // status 107020 (ACL_ERROR_RT_TASK_TIMEOUT).
  void SetTaskTimeout(absl::Duration timeout);

  // Blocking form of Synchronize, for callers off the RPC threads.
  absl::Status SynchronizeAndWait();

  // Drops every task that has not started (their captures, e.g. buffers,
  // are released now); later Enqueue calls fail with CANCELLED saying `why`
  // (the first Cancel's). Callbacks still run. Tasks already issued on an
  // asynchronous device are not dropped: the thread still synchronizes the
  // device before it releases what they hold.
  void Cancel(absl::string_view why = "the stream was destroyed");

  // The error Enqueue would return now (OK if it would accept a task), for
  // callers that must not consume anything for a task the stream refuses.
  absl::Status CheckRoom() const;

  // The device stream tasks issue their operations on; null for a host-only
  // stream. Only a task (or a callback or gate holding the stream) may use
  // it, and it must capture the pointer, not the Stream: it stays valid
  // until the stream's thread has exited, which may be after ~Stream.
  const std::shared_ptr<DeviceStream>& device_stream() const;

  // Tasks waiting to run (not counting the running one, nor those issued
  // and not yet synchronized).
  size_t queued() const;
  // True while a task or callback runs or waits, or issued tasks wait for
  // the device.
  bool busy() const;

 private:
  struct State;
  struct GateState;
  static void Loop(std::shared_ptr<State> state);

  // Shared with the thread, which may outlive the Stream object.
  std::shared_ptr<State> state_;
};

// A transfer's hold on its stream (see Stream::Hold); destroying the last
// reference releases it. Thread-safe.
class Stream::Gate {
 public:
  Gate() = default;
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // Makes `error` the stream's deferred error (unless it has one already),
  // as a task standing where the gate stands that failed, its position
  // not known (0): for a transfer that fails while it holds the stream,
  // so work queued after it sees the failure (ACL_STOP_ON_FAILURE skips
  // it). Only while the gate holds the stream (reached, not yet released
  // nor opened by Cancel); ignored otherwise.
  void Fail(absl::Status error);

 private:
  friend class Stream;
  // Set once by Hold, before anyone else can see the gate through the
  // stream.
  std::shared_ptr<State> stream_;
  std::shared_ptr<GateState> state_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_STREAM_H_
