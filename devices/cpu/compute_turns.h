// Turns at the CPU's cores between the logical devices one host is split
// into (--devices), so that one device's tenants cannot crowd out
// another's.
#ifndef OPSERVER_DEVICES_CPU_COMPUTE_TURNS_H_
#define OPSERVER_DEVICES_CPU_COMPUTE_TURNS_H_

#include <cstdint>
#include <deque>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace opserver::cpu {

// At most `slots` slices of compute (a piece of a launch, a slice of a
// memset or copy: about a millisecond or less each) run at once, whichever
// streams they come from. While slices wait, a freed slot goes to the next
// party (logical device) after the one served last, in order of party
// number, and within one party to its longest waiter. So a device whose 16
// streams each queue memsets gets one turn in N when N devices want the
// cores, however many slices it has waiting, and a device that wants one
// turn waits for at most one slice per busy slot.
//
//   ComputeTurns turns(pool.num_threads());
//   {
//     ComputeTurns::Turn turn(&turns, device_index);
//     ... one slice ...
//   }
//
// Thread-safe. A thread must not wait for a turn while holding one.
class ComputeTurns {
 public:
  // Work this small (a launch of at most kSmallElements elements, a
  // memset or on-device copy of at most kSmallBytes) takes no turn and runs
  // at once: it is done in about the time a turn takes to pass on, and a
  // tenant's small step must not queue behind other tenants' slices (a
  // waiting slice holds its place whatever its thread's priority, so the
  // OS could no longer put a tenant's small call ahead of bulk work, and
  // a slice preempted by other threads keeps its slot meanwhile). What one
  // call can take this way is bounded by its size.
  static constexpr int64_t kSmallElements = 16 * 1024;
  static constexpr uint64_t kSmallBytes = 64 * 1024;

  explicit ComputeTurns(int slots);
  ComputeTurns(const ComputeTurns&) = delete;
  ComputeTurns& operator=(const ComputeTurns&) = delete;

  // Holds a slot from construction (waiting for one) to destruction.
  class Turn {
   public:
    Turn(ComputeTurns* turns, int party) : turns_(turns) {
      if (turns_ != nullptr) turns_->Acquire(party);
    }
    ~Turn() {
      if (turns_ != nullptr) turns_->Release();
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    ComputeTurns* const turns_;
  };

  // Turns taken so far (each slice takes one); for tests and stats.
  uint64_t taken() const;
  // Slices waiting for a turn now; for tests.
  int waiting() const;

 private:
  struct Waiter {
    bool granted = false;
  };
  void Acquire(int party);
  void Release();

  mutable absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  // Parties with waiters (none empty), each's waiters oldest first.
  std::map<int, std::deque<Waiter*>> waiters_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int last_party_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_COMPUTE_TURNS_H_
