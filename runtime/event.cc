#include "runtime/event.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "runtime/deadline_timer.h"
#include "runtime/memory_charge.h"

namespace opserver {

absl::Status EventBudget::Take() {
  uint64_t held = held_.load();
  do {
    if (held >= limit_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the session's events have ", held,
          " records, waits, resets and synchronizes outstanding, the limit; "
          "synchronize before issuing more"));
    }
  } while (!held_.compare_exchange_weak(held, held + 1));
  if (bytes_ == nullptr) return absl::OkStatus();
  absl::Status room = ReserveSessionBytes(
      *bytes_, byte_limit_, kEventOperationBytes, "an event operation");
  if (!room.ok()) held_.fetch_sub(1);
  return room;
}

void EventBudget::Give() {
  held_.fetch_sub(1);
  if (bytes_ != nullptr) bytes_->fetch_sub(kEventOperationBytes);
}

struct Event::State {
  explicit State(std::shared_ptr<EventBudget> b) : budget(std::move(b)) {}

  // How a record completed: OK, or CANCELLED when its stream was cancelled
  // before reaching it. Guarded by `mu`; shared with the waits on it,
  // which read it once their stream reaches them.
  struct Outcome {
    absl::Status status;
  };
  // What a record not yet completed releases when it completes.
  struct Pending {
    std::shared_ptr<Outcome> outcome = std::make_shared<Outcome>();
    std::vector<std::shared_ptr<Stream::Gate>> gates;
    // Synchronizes waiting on it (keys of `synchronizes`).
    absl::flat_hash_set<uint64_t> tickets;
  };
  // What Release runs outside the lock.
  struct Released {
    std::vector<std::shared_ptr<Stream::Gate>> gates;
    std::vector<std::function<void(absl::Status)>> done;
  };
  struct Synchronize {
    uint64_t record;
    std::function<void(absl::Status)> done;
  };

  // Moves what waits on `pending` into `released`.
  void TakeWaitersLocked(Pending& pending, Released& released)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto& gate : pending.gates) released.gates.push_back(std::move(gate));
    pending.gates.clear();
    for (uint64_t ticket : pending.tickets) {
      auto it = synchronizes.find(ticket);
      released.done.push_back(std::move(it->second.done));
      synchronizes.erase(it);
    }
    pending.tickets.clear();
  }

  // Record `gen` reached its stream (`status` OK), or its stream was
  // cancelled before (CANCELLED).
  void Complete(uint64_t gen, absl::Status status) {
    const Clock::time_point now = Clock::now();
    Released released;
    {
      absl::MutexLock lock(&mu);
      auto it = pending.find(gen);
      if (it != pending.end()) {
        it->second.outcome->status = status;
        TakeWaitersLocked(it->second, released);
        pending.erase(it);
      }
      if (!destroyed && gen == latest) {
        if (status.ok()) {
          latest_time = now;
        } else {
          latest_error = status;
        }
      }
    }
    budget->Give();  // The record's.
    Release(std::move(released), status);
  }

  // A wait past its time-out: `gate` is dropped from the record it waits
  // for, if that has not completed (then `timed_out` is set before the
  // gate goes, so its stream sees it), and goes with the last reference,
  // outside mu. True when it was dropped.
  bool DropWait(const std::weak_ptr<Stream::Gate>& weak,
                std::atomic<bool>& timed_out) {
    std::shared_ptr<Stream::Gate> gate = weak.lock();
    if (gate == nullptr) return false;
    bool dropped = false;
    {
      absl::MutexLock lock(&mu);
      for (auto& [gen, waiting] : pending) {
        auto it = std::find(waiting.gates.begin(), waiting.gates.end(), gate);
        if (it == waiting.gates.end()) continue;
        waiting.gates.erase(it);
        timed_out.store(true);
        dropped = true;
        break;
      }
    }
    if (dropped) budget->Give();  // The wait's.
    return dropped;
  }

  // Outside mu: a gate's destruction takes its stream's lock, and `done`
  // may finish an RPC.
  void Release(Released released, const absl::Status& status) {
    for (size_t i = 0; i < released.gates.size() + released.done.size(); ++i) {
      budget->Give();
    }
    released.gates.clear();
    for (std::function<void(absl::Status)>& done : released.done) {
      done(status);
    }
  }

  // The record in force has not completed.
  bool IncompleteLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return latest != 0 && pending.count(latest) != 0;
  }

  // A new record is in force (gen != 0), or none (reset).
  void ReplaceLatestLocked(uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    latest = gen;
    latest_time.reset();
    latest_error = absl::OkStatus();
  }

  const std::shared_ptr<EventBudget> budget;
  mutable absl::Mutex mu;
  // Records issued so far; each is numbered by the count after it.
  uint64_t issued ABSL_GUARDED_BY(mu) = 0;
  // The record in force: 0 when never recorded or reset.
  uint64_t latest ABSL_GUARDED_BY(mu) = 0;
  // When `latest` completed (unset while it has not, or if cancelled).
  std::optional<Clock::time_point> latest_time ABSL_GUARDED_BY(mu);
  // CANCELLED when `latest` was cancelled before its stream reached it.
  absl::Status latest_error ABSL_GUARDED_BY(mu);
  // Records issued and not completed, by number.
  std::map<uint64_t, Pending> pending ABSL_GUARDED_BY(mu);
  // Synchronizes waiting, by ticket.
  absl::flat_hash_map<uint64_t, Synchronize> synchronizes ABSL_GUARDED_BY(mu);
  uint64_t tickets ABSL_GUARDED_BY(mu) = 0;
  bool destroyed ABSL_GUARDED_BY(mu) = false;
};

Event::Event(uint32_t flags, std::shared_ptr<EventBudget> budget)
    : flags_(flags),
      state_(std::make_shared<State>(
          budget != nullptr
              ? std::move(budget)
              : std::make_shared<EventBudget>(kMaxPendingEventOperations))) {}

Event::~Event() { Destroy(); }

absl::Status Event::Record(Stream& stream) {
  if (stream.CheckRoom().code() == absl::StatusCode::kCancelled) {
    return absl::CancelledError(
        "cannot record on a stream that was destroyed or whose session "
        "closed");
  }
  RETURN_IF_ERROR(state_->budget->Take());
  uint64_t gen;
  {
    absl::MutexLock lock(&state_->mu);
    gen = ++state_->issued;
    state_->ReplaceLatestLocked(gen);
    state_->pending[gen];
  }
  // A callback, not a task: Cancel keeps it, so the record completes (and
  // releases its waiters) even on a stream destroyed before reaching it,
  // then with the cancellation.
  stream.WhenReachedOrCancelled([state = state_, gen](absl::Status reached) {
    if (!reached.ok()) {
      reached = absl::CancelledError(absl::StrCat(
          "the event's record was cancelled before its stream reached it (",
          reached.message(), "): the work before it may not have run"));
    }
    state->Complete(gen, std::move(reached));
  });
  return absl::OkStatus();
}

absl::Status Event::Wait(Stream& stream, absl::Duration timeout) {
  auto gate = std::make_shared<Stream::Gate>();
  std::shared_ptr<State::Outcome> outcome;
  absl::Status cancelled;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->destroyed) return absl::OkStatus();
    if (state_->IncompleteLocked()) {
      RETURN_IF_ERROR(state_->budget->Take());
      State::Pending& pending = state_->pending[state_->latest];
      pending.gates.push_back(gate);
      outcome = pending.outcome;
    } else {
      cancelled = state_->latest_error;
    }
  }
  if (outcome == nullptr) {
    // Waiting on a cancelled record fails the stream as when it waited
    // before the record was cancelled.
    if (!cancelled.ok()) stream.Fail(std::move(cancelled));
    return absl::OkStatus();
  }
  // The record may complete before Hold: the gate is then destroyed when
  // `gate` goes below, and the stream skips it. A cancelled stream opens
  // it by itself, so it needs no callback.
  // The time-out counts from when the stream reaches the wait. `key` is
  // set there and read behind the gate, both by whoever holds the stream.
  struct Timer {
    std::atomic<bool> timed_out{false};
    uint64_t key = 0;
  };
  auto timer = std::make_shared<Timer>();
  std::function<void()> reached = [] {};
  if (timeout > absl::ZeroDuration()) {
    reached = [state = state_, weak = std::weak_ptr<Stream::Gate>(gate), timer,
               timeout] {
      timer->key = DeadlineTimer::Shared().At(
          absl::Now() + timeout,
          [state, weak, timer] { state->DropWait(weak, timer->timed_out); });
    };
  }
  RETURN_IF_ERROR(stream.Hold(gate, std::move(reached), nullptr));
  // Right behind the gate: a record that completed with CANCELLED, or a
  // wait past its time-out, becomes the stream's deferred error at the
  // wait's place.
  stream.FailWith([state = state_, outcome, timer, timeout]() -> absl::Status {
    if (timer->key != 0) DeadlineTimer::Shared().Cancel(timer->key);
    if (timer->timed_out.load()) {
      return kernels::AclnnError(
          kAclErrorRtWaitTimeout, absl::StatusCode::kDeadlineExceeded,
          absl::StrCat("the stream waited on an event longer than the "
                       "operator wait time-out of ",
                       absl::FormatDuration(timeout),
                       " (aclrtSetOpWaitTimeout) and went on without it"));
    }
    absl::MutexLock lock(&state->mu);
    return outcome->status;
  });
  return absl::OkStatus();
}

absl::Status Event::Reset(Stream& stream) {
  RETURN_IF_ERROR(state_->budget->Take());
  uint64_t latest;
  {
    absl::MutexLock lock(&state_->mu);
    latest = state_->latest;
  }
  stream.WhenReached([state = state_, latest] {
    {
      absl::MutexLock lock(&state->mu);
      // A record issued after the reset stays in force.
      if (state->latest == latest) state->ReplaceLatestLocked(0);
    }
    state->budget->Give();
  });
  return absl::OkStatus();
}

bool Event::Complete() const {
  absl::MutexLock lock(&state_->mu);
  return !state_->IncompleteLocked();
}

bool Event::Recorded() const {
  absl::MutexLock lock(&state_->mu);
  return state_->latest != 0;
}

absl::Status Event::RecordError() const {
  absl::MutexLock lock(&state_->mu);
  return state_->latest_error;
}

absl::StatusOr<Event::Clock::time_point> Event::CompletionTime() const {
  absl::MutexLock lock(&state_->mu);
  if (state_->latest == 0) {
    return kernels::AclnnError(
        kAclErrorRtEventTimestampInvalid, absl::StatusCode::kFailedPrecondition,
        "the event was never recorded (or was reset): it has no timestamp");
  }
  if (!state_->latest_error.ok()) {
    return kernels::AclnnError(
        kAclErrorRtEventTimestampInvalid, absl::StatusCode::kCancelled,
        absl::StrCat(state_->latest_error.message(), "; it has no timestamp"));
  }
  if (!state_->latest_time.has_value()) {
    return kernels::AclnnError(
        kAclErrorRtEventTimestampInvalid, absl::StatusCode::kFailedPrecondition,
        "the event's record has not completed yet: synchronize the event "
        "first");
  }
  return *state_->latest_time;
}

absl::Status Event::WhenComplete(std::function<void(absl::Status)> done) {
  return WhenCompleteOrForgotten(std::move(done)).status();
}

absl::StatusOr<uint64_t> Event::WhenCompleteOrForgotten(
    std::function<void(absl::Status)> done) {
  absl::Status now;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->IncompleteLocked() && !state_->destroyed) {
      RETURN_IF_ERROR(state_->budget->Take());
      const uint64_t ticket = ++state_->tickets;
      state_->pending[state_->latest].tickets.insert(ticket);
      state_->synchronizes.emplace(
          ticket, State::Synchronize{state_->latest, std::move(done)});
      return ticket;
    }
    now = state_->latest_error;
  }
  done(std::move(now));
  return 0;
}

bool Event::Forget(uint64_t ticket) {
  std::function<void(absl::Status)> dropped;  // Destroyed outside the lock.
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->synchronizes.find(ticket);
    if (it == state_->synchronizes.end()) return false;
    auto pending = state_->pending.find(it->second.record);
    if (pending != state_->pending.end()) pending->second.tickets.erase(ticket);
    dropped = std::move(it->second.done);
    state_->synchronizes.erase(it);
  }
  state_->budget->Give();
  return true;
}

absl::StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  absl::StatusOr<Clock::time_point> from = start.CompletionTime();
  if (!from.ok()) {
    return kernels::AclnnError(
        kernels::GetAclnnStatus(from.status()), from.status().code(),
        absl::StrCat("start event: ", from.status().message()));
  }
  absl::StatusOr<Clock::time_point> to = end.CompletionTime();
  if (!to.ok()) {
    return kernels::AclnnError(
        kernels::GetAclnnStatus(to.status()), to.status().code(),
        absl::StrCat("end event: ", to.status().message()));
  }
  return std::chrono::duration<float, std::milli>(*to - *from).count();
}

void Event::Destroy() {
  State::Released released;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->destroyed) return;
    state_->destroyed = true;
    // The records stay pending (their callbacks return the budget); what
    // waits on them goes now.
    for (auto& [gen, pending] : state_->pending) {
      state_->TakeWaitersLocked(pending, released);
    }
  }
  state_->Release(std::move(released),
                  absl::CancelledError("the event was destroyed"));
}

}  // namespace opserver
