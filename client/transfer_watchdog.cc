#include "client/transfer_watchdog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"

namespace opserver {
namespace remote {

TransferWatchdog::TransferWatchdog(absl::Duration idle, Clock clock,
                                   bool run_thread)
    : idle_(idle), clock_(std::move(clock)), run_thread_(run_thread) {}

TransferWatchdog::~TransferWatchdog() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

TransferWatchdog::Watch::Watch(TransferWatchdog* watchdog,
                               grpc::ClientContext* context)
    : watchdog_(watchdog),
      context_(context),
      last_ns_(absl::ToUnixNanos(watchdog->clock_())) {
  watchdog_->Add(this);
}

TransferWatchdog::Watch::~Watch() { watchdog_->Remove(this); }

void TransferWatchdog::Watch::Progress() {
  last_ns_.store(absl::ToUnixNanos(watchdog_->clock_()),
                 std::memory_order_relaxed);
}

void TransferWatchdog::Add(Watch* watch) {
  if (idle_ == absl::InfiniteDuration()) return;
  absl::MutexLock lock(&mu_);
  watches_.insert(watch);
  if (run_thread_ && !thread_.joinable()) {
    thread_ = std::thread([this] { Loop(); });
  }
}

void TransferWatchdog::Remove(Watch* watch) {
  if (idle_ == absl::InfiniteDuration()) return;
  absl::MutexLock lock(&mu_);
  watches_.erase(watch);
}

void TransferWatchdog::Check() {
  const int64_t now = absl::ToUnixNanos(clock_());
  absl::MutexLock lock(&mu_);
  for (Watch* watch : watches_) {
    if (watch->expired()) continue;
    const int64_t last = watch->last_ns_.load(std::memory_order_relaxed);
    if (absl::Nanoseconds(now - last) <= idle_) continue;
    watch->expired_.store(true, std::memory_order_release);
    // Thread-safe, and wakes the caller blocked in Write or Read; the
    // context lives while its Watch is in the set.
    watch->context_->TryCancel();
  }
}

absl::Status TransferWatchdog::IdleError(absl::string_view what) const {
  return kernels::AclnnError(
      kernels::kAclnnErrRuntimeError, absl::StatusCode::kDeadlineExceeded,
      absl::StrCat(what, ": no data moved for ", absl::FormatDuration(idle_),
                   " (ConnectOptions::transfer_idle_timeout), so the call "
                   "was cancelled: the server, or a proxy between, stopped "
                   "forwarding it"));
}

void TransferWatchdog::Loop() {
  const absl::Duration tick =
      std::clamp(idle_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick);
      if (stopping_) return;
    }
    Check();
  }
}

}  // namespace remote
}  // namespace opserver
