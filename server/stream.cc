#include "server/stream.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace opserver {
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
  static auto* const threads = new std::shared_ptr<StreamThreads>(
      std::make_shared<StreamThreads>());
  return *threads;
}

struct Stream::State {
  State(size_t max, std::shared_ptr<StreamThreads> group)
      : max_queued(max), threads(std::move(group)) {}

  // One queue entry: a task (work, droppable) or a callback (always runs).
  struct Item {
    Task task;
    std::function<void()> callback;
  };

  // Claims the stream for the caller when idle; then the caller runs work
  // inline and calls Release().
  bool TryClaimIdle() {
    absl::MutexLock lock(&mu);
    if (busy || !queue.empty()) return false;
    busy = true;
    return true;
  }
  void Release() {
    absl::MutexLock lock(&mu);
    busy = false;
  }
  absl::Status RoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (cancelled) return absl::CancelledError("the stream was destroyed");
    if (max_queued != 0 && queued_tasks >= max_queued) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the stream already has ", queued_tasks,
          " launches queued, the limit (--max_queued_per_stream); synchronize "
          "it before queueing more"));
    }
    return absl::OkStatus();
  }
  // Only whoever holds `busy` touches first_error.
  void Record(absl::Status status) {
    if (!status.ok() && first_error.ok()) first_error = std::move(status);
  }

  const size_t max_queued;
  const std::shared_ptr<StreamThreads> threads;
  mutable absl::Mutex mu;
  std::deque<Item> queue ABSL_GUARDED_BY(mu);
  size_t queued_tasks ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  // Tasks dropped by Cancel that no Synchronize has reported yet.
  bool dropped ABSL_GUARDED_BY(mu) = false;
  // An item (queued or inline) is running; the thread waits for it.
  bool busy ABSL_GUARDED_BY(mu) = false;
  absl::Status first_error;
};

Stream::Stream(size_t max_queued, std::shared_ptr<StreamThreads> threads)
    : state_(std::make_shared<State>(
          max_queued, threads != nullptr ? std::move(threads)
                                         : StreamThreads::Default())) {
  state_->threads->Add();
  // std::thread may throw (no more threads): the caller sees the exception
  // and the count is given back.
  try {
    std::thread(&Stream::Loop, state_).detach();
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
  for (;;) {
    State::Item item;
    {
      absl::MutexLock lock(&state->mu);
      state->mu.Await(absl::Condition(
          +[](State* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !s->busy && (s->stopping || !s->queue.empty());
          },
          state.get()));
      if (state->queue.empty()) break;  // Stopping and drained.
      item = std::move(state->queue.front());
      state->queue.pop_front();
      if (item.task) --state->queued_tasks;
      state->busy = true;
    }
    if (item.task) {
      state->Record(item.task());
    } else {
      item.callback();
    }
    item = State::Item();  // Release captures before reporting idle.
    state->Release();
  }
  std::shared_ptr<StreamThreads> threads = state->threads;
  state.reset();
  threads->Done();
}

absl::Status Stream::Enqueue(Task task, bool inline_if_idle) {
  State& s = *state_;
  if (inline_if_idle && s.TryClaimIdle()) {
    bool cancelled;
    {
      absl::MutexLock lock(&s.mu);
      cancelled = s.cancelled;
    }
    if (!cancelled) s.Record(task());
    s.Release();
    if (cancelled) return absl::CancelledError("the stream was destroyed");
    return absl::OkStatus();
  }
  absl::MutexLock lock(&s.mu);
  if (absl::Status room = s.RoomLocked(); !room.ok()) return room;
  s.queue.push_back(State::Item{std::move(task), nullptr});
  ++s.queued_tasks;
  return absl::OkStatus();
}

void Stream::Synchronize(std::function<void(absl::Status)> done) {
  State* s = state_.get();
  auto report = [s, done = std::move(done)] {
    absl::Status status = std::exchange(s->first_error, absl::OkStatus());
    {
      absl::MutexLock lock(&s->mu);
      if (std::exchange(s->dropped, false) && status.ok()) {
        status = absl::CancelledError(
            "queued work was cancelled: the stream or its session was closed");
      }
    }
    done(std::move(status));
  };
  if (s->TryClaimIdle()) {
    report();
    s->Release();
    return;
  }
  absl::MutexLock lock(&s->mu);
  s->queue.push_back(State::Item{nullptr, std::move(report)});
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

void Stream::Cancel() {
  std::deque<State::Item> dropped;  // Destroyed outside the lock.
  {
    absl::MutexLock lock(&state_->mu);
    State& s = *state_;
    s.cancelled = true;
    std::deque<State::Item> kept;
    for (State::Item& item : s.queue) {
      (item.task ? dropped : kept).push_back(std::move(item));
    }
    s.queue = std::move(kept);
    s.queued_tasks = 0;
    if (!dropped.empty()) s.dropped = true;
  }
}

absl::Status Stream::CheckRoom() const {
  absl::MutexLock lock(&state_->mu);
  return state_->RoomLocked();
}

size_t Stream::queued() const {
  absl::MutexLock lock(&state_->mu);
  return state_->queued_tasks;
}

bool Stream::busy() const {
  absl::MutexLock lock(&state_->mu);
  return state_->busy || !state_->queue.empty();
}

}  // namespace opserver
