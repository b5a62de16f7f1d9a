#include "devices/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <system_error>

#include "common/thread_start.h"

namespace opserver::cpu {

struct ThreadPool::Job {
  Job(int64_t n, absl::FunctionRef<void(int64_t)> f) : n_tasks(n), fn(f) {}

  const int64_t n_tasks;
  absl::FunctionRef<void(int64_t)> fn;
  std::atomic<int64_t> next{0};
  // Guarded by the pool's mutex: tasks finished and workers still holding a
  // pointer to this job. The caller's stack frame owns the job, so it may
  // only return once both say nobody else will touch it.
  int64_t done = 0;
  int active_workers = 0;
  std::condition_variable done_cv;
};

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) {
    try {
      workers_.push_back(NewThread([this] { WorkerLoop(); }));
    } catch (const std::system_error&) {
      // Fewer workers than asked: a ParallelFor still completes, since its
      // caller always takes part (num_threads() says how many there are).
      break;
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int64_t ThreadPool::RunTasks(Job* job) {
  int64_t ran = 0;
  for (;;) {
    const int64_t i = job->next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job->n_tasks) break;
    job->fn(i);
    ++ran;
  }
  return ran;
}

void ThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Job* job = queue_.front();
    ++job->active_workers;
    lock.unlock();
    const int64_t ran = RunTasks(job);
    lock.lock();
    // Every task is claimed now: nobody else should pick this job up.
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) queue_.erase(it);
    job->done += ran;
    --job->active_workers;
    if (job->done == job->n_tasks && job->active_workers == 0) {
      job->done_cv.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n_tasks,
                             absl::FunctionRef<void(int64_t)> fn) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || workers_.empty()) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  Job job(n_tasks, fn);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(&job);
  }
  // Wake only as many workers as can get a task besides the caller.
  const int64_t helpers =
      std::min<int64_t>(n_tasks - 1, static_cast<int64_t>(workers_.size()));
  if (helpers >= static_cast<int64_t>(workers_.size())) {
    work_cv_.notify_all();
  } else {
    for (int64_t i = 0; i < helpers; ++i) work_cv_.notify_one();
  }
  const int64_t ran = RunTasks(&job);
  std::unique_lock<std::mutex> lock(mu_);
  auto it = std::find(queue_.begin(), queue_.end(), &job);
  if (it != queue_.end()) queue_.erase(it);
  job.done += ran;
  job.done_cv.wait(lock, [&job] {
    return job.done == job.n_tasks && job.active_workers == 0;
  });
}

}  // namespace opserver::cpu
