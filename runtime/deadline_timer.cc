#include "runtime/deadline_timer.h"

#include "common/thread_start.h"

namespace opserver {

DeadlineTimer::DeadlineTimer() : thread_(NewThread([this] { Loop(); })) {}

DeadlineTimer::~DeadlineTimer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t DeadlineTimer::At(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  const uint64_t key = ++next_key_;
  due_.emplace(std::make_pair(when, key), std::move(fn));
  when_.emplace(key, when);
  return key;
}

bool DeadlineTimer::Cancel(uint64_t key) {
  std::function<void()> dropped;  // Destroyed outside the lock.
  absl::MutexLock lock(&mu_);
  auto it = when_.find(key);
  if (it == when_.end()) return false;
  auto entry = due_.find(std::make_pair(it->second, key));
  dropped = std::move(entry->second);
  due_.erase(entry);
  when_.erase(it);
  return true;
}

size_t DeadlineTimer::pending() const {
  absl::MutexLock lock(&mu_);
  return due_.size();
}

DeadlineTimer& DeadlineTimer::Shared() {
  static DeadlineTimer* const timer = new DeadlineTimer();
  return *timer;
}

void DeadlineTimer::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (stopping_) return;
    if (due_.empty()) {
      mu_.Await(absl::Condition(
          +[](DeadlineTimer* t) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return t->stopping_ || !t->due_.empty();
          },
          this));
      continue;
    }
    const absl::Time first = due_.begin()->first.first;
    if (absl::Now() < first) {
      // Woken early by a new earlier deadline or by stopping.
      struct Args {
        DeadlineTimer* timer;
        absl::Time first;
      } args{this, first};
      mu_.AwaitWithDeadline(
          absl::Condition(
              +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                return a->timer->stopping_ || a->timer->due_.empty() ||
                       a->timer->due_.begin()->first.first < a->first;
              },
              &args),
          first);
      continue;
    }
    auto it = due_.begin();
    std::function<void()> fn = std::move(it->second);
    when_.erase(it->first.second);
    due_.erase(it);
    mu_.Unlock();
    fn();
    fn = nullptr;
    mu_.Lock();
  }
}

}  // namespace opserver
