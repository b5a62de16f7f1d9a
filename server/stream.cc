#include "server/stream.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace opserver {

Stream::Stream() : thread_([this] { Loop(); }) {}

Stream::~Stream() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void Stream::Loop() {
  for (;;) {
    std::function<void()> item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Stream* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !s->busy_ && (s->stopping_ || !s->queue_.empty());
          },
          this));
      if (queue_.empty()) return;  // Stopping and drained.
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    item();
    Release();
  }
}

bool Stream::TryClaimIdle() {
  absl::MutexLock lock(&mu_);
  if (busy_ || !queue_.empty()) return false;
  busy_ = true;
  return true;
}

void Stream::Release() {
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

void Stream::Record(absl::Status status) {
  if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
}

void Stream::Enqueue(Task task, bool inline_if_idle) {
  if (inline_if_idle && TryClaimIdle()) {
    Record(task());
    Release();
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back([this, task = std::move(task)] { Record(task()); });
}

void Stream::Synchronize(std::function<void(absl::Status)> done) {
  if (TryClaimIdle()) {
    absl::Status status = std::exchange(first_error_, absl::OkStatus());
    Release();
    done(std::move(status));
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back([this, done = std::move(done)] {
    absl::Status status = std::exchange(first_error_, absl::OkStatus());
    done(std::move(status));
  });
}

void Stream::WhenReached(std::function<void()> reached) {
  if (TryClaimIdle()) {
    reached();
    Release();
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(reached));
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

}  // namespace opserver
