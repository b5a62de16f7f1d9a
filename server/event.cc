#include "server/event.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"

namespace opserver {

absl::Status CheckEventFlags(uint32_t flags) {
  if ((flags & ~kKnownEventFlags) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "event flags 0x", absl::Hex(flags), " have unknown bits 0x",
      absl::Hex(flags & ~kKnownEventFlags),
      " (known: ACL_EVENT_SYNC 0x1, ACL_EVENT_CAPTURE_STREAM_PROGRESS 0x2, "
      "ACL_EVENT_TIME_LINE 0x8, ACL_EVENT_EXTERNAL 0x20, ACL_EVENT_IPC "
      "0x40)"));
}

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
  return absl::OkStatus();
}

void EventBudget::Give() { held_.fetch_sub(1); }

struct Event::State {
  explicit State(std::shared_ptr<EventBudget> b) : budget(std::move(b)) {}

  // What a record not yet completed releases when it completes.
  struct Pending {
    std::vector<std::shared_ptr<Stream::Gate>> gates;
    std::vector<std::function<void(absl::Status)>> done;
  };

  // Record `gen` reached its stream.
  void Complete(uint64_t gen) {
    const Clock::time_point now = Clock::now();
    Pending released;
    {
      absl::MutexLock lock(&mu);
      auto it = pending.find(gen);
      if (it != pending.end()) {
        released = std::move(it->second);
        pending.erase(it);
      }
      if (!destroyed && gen == latest) latest_time = now;
    }
    budget->Give();  // The record's.
    Release(std::move(released), absl::OkStatus());
  }

  // Outside mu: a gate's destruction takes its stream's lock, and `done`
  // may finish an RPC.
  void Release(Pending released, const absl::Status& status) {
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

  const std::shared_ptr<EventBudget> budget;
  mutable absl::Mutex mu;
  // Records issued so far; each is numbered by the count after it.
  uint64_t issued ABSL_GUARDED_BY(mu) = 0;
  // The record in force: 0 when never recorded or reset.
  uint64_t latest ABSL_GUARDED_BY(mu) = 0;
  // When `latest` completed (unset while it has not).
  std::optional<Clock::time_point> latest_time ABSL_GUARDED_BY(mu);
  // Records issued and not completed, by number.
  std::map<uint64_t, Pending> pending ABSL_GUARDED_BY(mu);
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
  if (absl::Status s = state_->budget->Take(); !s.ok()) return s;
  uint64_t gen;
  {
    absl::MutexLock lock(&state_->mu);
    gen = ++state_->issued;
    state_->latest = gen;
    state_->latest_time.reset();
    state_->pending[gen];
  }
  // A callback, not a task: Cancel keeps it, so the record completes (and
  // releases its waiters) even on a stream destroyed before reaching it.
  stream.WhenReached([state = state_, gen] { state->Complete(gen); });
  return absl::OkStatus();
}

absl::Status Event::Wait(Stream& stream) {
  auto gate = std::make_shared<Stream::Gate>();
  {
    absl::MutexLock lock(&state_->mu);
    if (!state_->IncompleteLocked() || state_->destroyed) {
      return absl::OkStatus();
    }
    if (absl::Status s = state_->budget->Take(); !s.ok()) return s;
    state_->pending[state_->latest].gates.push_back(gate);
  }
  // The record may complete before Hold: the gate is then destroyed when
  // `gate` goes below, and the stream skips it. A cancelled stream opens
  // it by itself, so it needs no callback.
  return stream.Hold(
      gate, [] {}, nullptr);
}

absl::Status Event::Reset(Stream& stream) {
  if (absl::Status s = state_->budget->Take(); !s.ok()) return s;
  uint64_t latest;
  {
    absl::MutexLock lock(&state_->mu);
    latest = state_->latest;
  }
  stream.WhenReached([state = state_, latest] {
    {
      absl::MutexLock lock(&state->mu);
      // A record issued after the reset stays in force.
      if (state->latest == latest) {
        state->latest = 0;
        state->latest_time.reset();
      }
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

absl::StatusOr<Event::Clock::time_point> Event::CompletionTime() const {
  absl::MutexLock lock(&state_->mu);
  if (state_->latest == 0) {
    return kernels::AclnnError(
        kAclErrorRtEventTimestampInvalid, absl::StatusCode::kFailedPrecondition,
        "the event was never recorded (or was reset): it has no timestamp");
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
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->IncompleteLocked() && !state_->destroyed) {
      if (absl::Status s = state_->budget->Take(); !s.ok()) return s;
      state_->pending[state_->latest].done.push_back(std::move(done));
      return absl::OkStatus();
    }
  }
  done(absl::OkStatus());
  return absl::OkStatus();
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
  State::Pending released;
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->destroyed) return;
    state_->destroyed = true;
    // The records stay pending (their callbacks return the budget); what
    // waits on them goes now.
    for (auto& [gen, pending] : state_->pending) {
      for (auto& gate : pending.gates)
        released.gates.push_back(std::move(gate));
      for (auto& done : pending.done) released.done.push_back(std::move(done));
      pending = State::Pending();
    }
  }
  state_->Release(std::move(released),
                  absl::CancelledError("the event was destroyed"));
}

}  // namespace opserver
