// Runs functions at a time, on one thread shared by whoever needs a
// time-out that nothing else wakes up for (a blocking host callback whose
// client never releases it). Thread-safe.
#ifndef OPSERVER_RUNTIME_DEADLINE_TIMER_H_
#define OPSERVER_RUNTIME_DEADLINE_TIMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace opserver {

class DeadlineTimer {
 public:
  // Starts the thread; throws std::system_error when it cannot.
  DeadlineTimer();
  // Drops what has not run and joins the thread (waiting for a function
  // that runs now).
  ~DeadlineTimer();
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // Calls `fn` on the timer's thread once `when` has passed (at once when
  // it has already); returns a key for Cancel. `fn` must be short: every
  // later deadline waits for it.
  uint64_t At(absl::Time when, std::function<void()> fn);
  // Drops `key`'s function if it has not started; true if it was dropped.
  bool Cancel(uint64_t key);
  // Functions waiting for their time.
  size_t pending() const;

  // One for the whole process, started on first use and never destroyed.
  static DeadlineTimer& Shared();

 private:
  void Loop();

  mutable absl::Mutex mu_;
  // By (deadline, key): keys count up, so equal deadlines run in order.
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> due_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_DEADLINE_TIMER_H_
