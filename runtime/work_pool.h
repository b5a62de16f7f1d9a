#ifndef OPSERVER_RUNTIME_WORK_POOL_H_
#define OPSERVER_RUNTIME_WORK_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace opserver {

// Runs the work a client's request causes that is too large for gRPC's
// callback threads (applying a Pipeline batch, clearing a new buffer, an
// Evaluate), on threads of its own and fairly between owners: each owner's
// tasks run one at a time in the order submitted, and owners with work take
// turns, one task each. So a client's heavy requests cost that client's
// turns, never another's, and gRPC's threads (which every call needs) stay
// free.
//
//   WorkPool pool({.threads = 2});
//   absl::Status queued = pool.Submit("session:abc", [] { ... });
//
// Tasks should be short: long work is cut into slices, each of which
// submits the next, so that other owners get their turns in between.
// Thread-safe.
class WorkPool {
 public:
  struct Options {
    int threads = 2;
    // Tasks one owner may have waiting; more are RESOURCE_EXHAUSTED.
    size_t max_queued_per_owner = 1024;
    // Added to the threads' nice value (Linux: per thread; raising it needs
    // no privilege). Above 0, the small calls gRPC's threads answer go
    // before the heavy work here whenever both want the CPU, and the heavy
    // work still has every cycle nobody else wants.
    int nice = 0;
  };

  // Throws std::system_error when its threads cannot be started (at server
  // start, before anything else is served).
  explicit WorkPool(const Options& options);
  // Runs every task still queued (and those they submit), then joins.
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // Queues `task` behind `owner`'s earlier ones. RESOURCE_EXHAUSTED (and
  // `task` is dropped unrun) when the owner already has
  // max_queued_per_owner waiting.
  absl::Status Submit(absl::string_view owner, std::function<void()> task);

  // Tasks waiting, all owners together (for tests and stats).
  size_t queued() const;

 private:
  struct Owner {
    std::deque<std::function<void()>> tasks;
    bool running = false;  // One of its tasks runs now.
  };
  void Loop();

  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Owner> owners_ ABSL_GUARDED_BY(mu_);
  // Owners with a task waiting and none running, in turn order.
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_WORK_POOL_H_
