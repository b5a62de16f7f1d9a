#include "runtime/work_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/thread_start.h"

namespace opserver {

WorkPool::WorkPool(const Options& options) : options_(options) {
  const int threads = std::max(1, options.threads);
  threads_.reserve(static_cast<size_t>(threads));
  try {
    for (int i = 0; i < threads; ++i) {
      threads_.push_back(NewThread([this] {
        if (options_.nice > 0) {
          // Best effort: a thread left at the process's priority still
          // runs its turns.
          (void)setpriority(PRIO_PROCESS,
                            static_cast<id_t>(syscall(SYS_gettid)),
                            options_.nice);
        }
        Loop();
      }));
    }
  } catch (...) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& thread : threads_) thread.join();
    throw;
  }
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

absl::Status WorkPool::Submit(absl::string_view owner,
                              std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  Owner& entry = owners_[owner];
  if (entry.tasks.size() >= options_.max_queued_per_owner) {
    if (entry.tasks.empty() && !entry.running) owners_.erase(owner);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client already has ", options_.max_queued_per_owner,
        " requests waiting for the server's workers; retry later"));
  }
  entry.tasks.push_back(std::move(task));
  ++queued_;
  if (entry.tasks.size() == 1 && !entry.running) {
    turns_.emplace_back(owner);
  }
  return absl::OkStatus();
}

size_t WorkPool::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

void WorkPool::Loop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Stops once nothing is queued or running: a running task may still
    // submit the next slice of its work, which runs before the pool goes.
    mu_.Await(absl::Condition(
        +[](WorkPool* pool) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !pool->turns_.empty() ||
                 (pool->stopping_ && pool->running_ == 0);
        },
        this));
    if (turns_.empty()) return;
    std::string owner = std::move(turns_.front());
    turns_.pop_front();
    Owner& entry = owners_[owner];
    std::function<void()> task = std::move(entry.tasks.front());
    entry.tasks.pop_front();
    entry.running = true;
    --queued_;
    ++running_;
    mu_.Unlock();
    task();
    task = nullptr;  // Its captures go before the next turn is taken.
    mu_.Lock();
    --running_;
    Owner& after = owners_[owner];
    after.running = false;
    if (after.tasks.empty()) {
      owners_.erase(owner);
    } else {
      turns_.push_back(std::move(owner));  // Behind everyone waiting.
    }
  }
}

}  // namespace opserver
