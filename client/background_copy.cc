#include "client/background_copy.h"

#include <utility>

#include "common/thread_start.h"

namespace opserver {
namespace remote {

absl::StatusOr<std::unique_ptr<BackgroundCopy>> BackgroundCopy::Start(
    std::function<absl::Status()> run, std::function<void()> cancel) {
  std::unique_ptr<BackgroundCopy> copy(
      new BackgroundCopy(std::move(run), std::move(cancel)));
  BackgroundCopy* self = copy.get();
  absl::StatusOr<std::thread> thread =
      StartThread("a background copy's thread", [self] {
        absl::Status status = self->run_();
        // What `run` holds goes with it, before anyone may see it done.
        self->run_ = nullptr;
        absl::MutexLock lock(&self->mu_);
        self->status_ = std::move(status);
        self->done_ = true;
      });
  if (!thread.ok()) {
    // Never ran: nothing to cancel when it goes (the caller may run the
    // copy itself).
    absl::MutexLock lock(&copy->mu_);
    copy->done_ = true;
    return thread.status();
  }
  copy->thread_ = *std::move(thread);
  return copy;
}

BackgroundCopy::~BackgroundCopy() {
  Cancel();
  if (thread_.joinable()) thread_.join();
}

absl::Status BackgroundCopy::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

void BackgroundCopy::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    if (done_) return;
  }
  // Outside the lock: `cancel` may wait for what `run` holds.
  cancel_();
}

}  // namespace remote
}  // namespace opserver
