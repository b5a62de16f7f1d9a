// A fixed set of worker threads for data-parallel kernel launches.
#ifndef OPSERVER_DEVICES_CPU_THREAD_POOL_H_
#define OPSERVER_DEVICES_CPU_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace opserver::cpu {

// `num_threads` is the total parallelism of a ParallelFor, counting the
// calling thread: the pool starts num_threads - 1 workers, so ThreadPool(1)
// (or 0) starts none and runs everything on the caller. When the process
// can start no more threads it keeps the workers it has (num_threads()
// says how many) rather than throwing.
//
// ParallelFor may be called from several threads at once (one per stream);
// each call's tasks are shared between its caller and whichever workers are
// free, and the caller always takes part, so a call makes progress even when
// every worker is busy with another call.
class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Total parallelism including the caller (>= 1).
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(0) ... fn(n_tasks - 1), each exactly once, and returns when all
  // have finished. With n_tasks <= 1 or no workers everything runs inline on
  // the caller without touching a lock.
  void ParallelFor(int64_t n_tasks, absl::FunctionRef<void(int64_t)> fn);

 private:
  struct Job;

  void WorkerLoop();
  // Claims and runs tasks of `job` until none are left; returns how many ran.
  static int64_t RunTasks(Job* job);

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<Job*> queue_;  // Jobs that still have unclaimed tasks.
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_THREAD_POOL_H_
