// Events with CANN's aclrtEvent semantics, on the server's host-side
// streams (runtime/stream.h), without the transport: the Runtime service's
// event calls and the Pipeline channel's event commands both go through
// this class.
//
// An event marks a point in a stream's work. Record captures everything
// queued on its stream before it and completes once the stream reaches it;
// the server takes its completion time then (steady clock). A stream that
// waits on the event runs its later work only once the most recent record
// issued before the wait has completed, without blocking any thread: the
// wait is a Stream::Hold whose gate the completion releases.
//
// A record whose stream is cancelled (destroyed, or its session closed)
// before reaching it completes too, so nothing waits on it forever, but
// with an error, not as a normal completion: the work before it may never
// have run. Then:
//   - a stream waiting on it goes on, with a deferred CANCELLED error at
//     the wait's place in its order (its next Synchronize reports it);
//   - synchronizes answer CANCELLED;
//   - while it is the record in force, the event reports the error:
//     RecordError, and CompletionTime (so ElapsedMs) fails with CANCELLED
//     and aclnn status 107006 (it has no timestamp); Complete() is true
//     (nothing is pending any more);
//   - a later Wait on it fails its stream the same way, and a later
//     synchronize answers CANCELLED at once,
// until a new record or a reset replaces it.
#ifndef OPSERVER_RUNTIME_EVENT_H_
#define OPSERVER_RUNTIME_EVENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/event_flags.h"
#include "runtime/stream.h"

namespace opserver {

// ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID: an elapsed time asked of an event
// whose record has not completed (or that was never recorded).
inline constexpr int32_t kAclErrorRtEventTimestampInvalid = 107006;
// ACL_ERROR_RT_WAIT_TIMEOUT: a stream waited on an event past the
// operator wait time-out (Event::Wait).
inline constexpr int32_t kAclErrorRtWaitTimeout = 107019;

// What a session's events may have outstanding at once (records not yet
// reached, waits not yet released, resets and synchronizes pending): each
// is a callback or a gate the server holds for the client, and records
// and waits are not counted by a stream's --max_queued_per_stream. Shared
// by the events of one session. Thread-safe.
class EventBudget {
 public:
  // With `bytes` (the session's memory counter, up to `byte_limit`), each
  // operation also charges kEventOperationBytes there while outstanding.
  explicit EventBudget(uint64_t limit,
                       std::shared_ptr<std::atomic<uint64_t>> bytes = nullptr,
                       uint64_t byte_limit = UINT64_MAX)
      : limit_(limit), bytes_(std::move(bytes)), byte_limit_(byte_limit) {}
  // RESOURCE_EXHAUSTED when `limit` are outstanding, or the session's
  // memory has no room for one more.
  absl::Status Take();
  void Give();
  uint64_t held() const { return held_.load(); }

 private:
  const uint64_t limit_;
  const std::shared_ptr<std::atomic<uint64_t>> bytes_;
  const uint64_t byte_limit_;
  std::atomic<uint64_t> held_{0};
};

// The default EventBudget limit of a session.
inline constexpr uint64_t kMaxPendingEventOperations = 1 << 16;

// One event. Thread-safe. Streams keep only its shared state, so an event
// may be destroyed while records, waits and resets of it are queued: then
// its waiters and synchronizes are released at once, and the rest does
// nothing when reached.
class Event {
 public:
  using Clock = std::chrono::steady_clock;

  // `flags` must pass CheckEventFlags (the caller checks). `budget` may be
  // shared with the session's other events; null: a budget of its own.
  explicit Event(uint32_t flags, std::shared_ptr<EventBudget> budget = nullptr);
  // Destroy().
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  uint32_t flags() const { return flags_; }

  // aclrtRecordEvent: the event's most recent record is now this one,
  // which completes once `stream` has run everything queued on it before
  // this call. A stream that is cancelled before reaching it still
  // completes it (Stream keeps callbacks through Cancel), so its waiters
  // are never left waiting, but with CANCELLED (see the top of this file).
  // CANCELLED when the stream was cancelled already (nothing is recorded
  // then), RESOURCE_EXHAUSTED past the budget.
  absl::Status Record(Stream& stream);

  // aclrtStreamWaitEvent: work queued on `stream` after this call waits
  // until the most recent record issued before it has completed. A no-op
  // when the event is not recorded (never, or reset) or that record has
  // completed (but one completed with CANCELLED fails `stream` with it).
  // The wait is released by the record's completion (a cancelled record's
  // CANCELLED becomes `stream`'s deferred error, at the wait's place), by
  // Destroy, or by the stream's Cancel (stream destroyed, session closed).
  // With a `timeout` (the session's aclrtSetOpWaitTimeout; zero: none), a
  // wait not released within it of the stream reaching it lets the stream
  // go on and fails it there with DEADLINE_EXCEEDED, aclnn status 107019
  // (ACL_ERROR_RT_WAIT_TIMEOUT).
  absl::Status Wait(Stream& stream,
                    absl::Duration timeout = absl::ZeroDuration());

  // aclrtResetEvent: once `stream` reaches this call, the event is not
  // recorded any more, unless a record was issued after this call.
  absl::Status Reset(Stream& stream);

  // aclrtQueryEventStatus: false while the most recent record has not
  // completed; true otherwise, also when never recorded (as CANN answers
  // ACL_EVENT_RECORDED_STATUS_COMPLETE for an unrecorded event).
  bool Complete() const;
  // A record is in force (issued and not reset), complete or not.
  bool Recorded() const;
  // CANCELLED when the record in force completed because its stream was
  // cancelled before reaching it; OK otherwise.
  absl::Status RecordError() const;

  // The completion time of the most recent record. FAILED_PRECONDITION
  // carrying aclnn status 107006 when the event is not recorded or its
  // record has not completed; CANCELLED with 107006 when it was cancelled.
  absl::StatusOr<Clock::time_point> CompletionTime() const;

  // aclrtSynchronizeEvent without blocking: `done(OK)` once the most
  // recent record issued before this call has completed (at once when it
  // has, or none was issued), or `done(CANCELLED)` when the event is
  // destroyed first or the record was cancelled. Runs on the stream's
  // thread, the Destroy caller's or this caller's. RESOURCE_EXHAUSTED past
  // the budget (`done` not called).
  absl::Status WhenComplete(std::function<void(absl::Status)> done);
  // The same for a caller that may stop waiting (an RPC cancelled or past
  // its deadline): returns a ticket for Forget, or 0 when `done` was
  // called already.
  absl::StatusOr<uint64_t> WhenCompleteOrForgotten(
      std::function<void(absl::Status)> done);
  // Drops the synchronize `ticket` if it is still waiting: its `done` is
  // destroyed uncalled and its budget unit returned now, not when the
  // record completes. False when it is not waiting any more (`done` was
  // called, or is being called).
  bool Forget(uint64_t ticket);

  // aclrtEventElapsedTime: milliseconds from `start`'s completion to
  // `end`'s (negative when `end` completed first). FAILED_PRECONDITION
  // with 107006 unless both have completed a record (CANCELLED with 107006
  // when either record was cancelled).
  static absl::StatusOr<float> ElapsedMs(const Event& start, const Event& end);

  // aclrtDestroyEvent: releases every wait and synchronize at once;
  // records and resets still queued do nothing when reached. Idempotent.
  void Destroy();

 private:
  struct State;
  const uint32_t flags_;
  const std::shared_ptr<State> state_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_EVENT_H_
