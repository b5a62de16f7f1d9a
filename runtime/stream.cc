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
#include "runtime/stream_state.h"

namespace opserver {
namespace {

// The nice value of stream threads (see Stream::Loop).
constexpr int kStreamThreadNice = 10;

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
    // Declared in the loop: what an item captured is released outside the
    // state's lock, each time round.
    State::Item item;
    const State::Next next = state->TakeNext(item);
    if (next == State::Next::kStop) break;
    if (next == State::Next::kComplete) {
      state->Complete();
      state->Release();
    } else if (next == State::Next::kGate) {
      state->RunGate(*item.gate);
    } else if (next == State::Next::kRun) {
      state->RunItem(std::move(item));
    }
  }
  State::Finish(std::move(state));
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

void Stream::Gate::Fail(absl::Status error) {
  if (stream_ == nullptr || error.ok()) return;
  // Under the lock, so Cancel cannot open the gate (and let another
  // holder touch the error) meanwhile.
  absl::MutexLock lock(&stream_->mu);
  if (!state_->holding || state_->forced) return;
  stream_->Record(std::move(error), 0);
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
