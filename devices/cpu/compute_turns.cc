#include "devices/cpu/compute_turns.h"

#include <algorithm>

namespace opserver::cpu {

ComputeTurns::ComputeTurns(int slots) : free_(std::max(1, slots)) {}

void ComputeTurns::Acquire(int party) {
  absl::MutexLock lock(&mu_);
  ++taken_;
  if (free_ > 0 && waiting_ == 0) {
    --free_;
    last_party_ = party;
    return;
  }
  Waiter waiter;
  waiters_[party].push_back(&waiter);
  ++waiting_;
  mu_.Await(absl::Condition(&waiter.granted));
}

void ComputeTurns::Release() {
  absl::MutexLock lock(&mu_);
  if (waiting_ == 0) {
    ++free_;
    return;
  }
  // The next party after the one served last, wrapping around.
  auto next = waiters_.upper_bound(last_party_);
  if (next == waiters_.end()) next = waiters_.begin();
  Waiter* waiter = next->second.front();
  next->second.pop_front();
  last_party_ = next->first;
  if (next->second.empty()) waiters_.erase(next);
  --waiting_;
  // The slot passes to the waiter without ever being free, so a slice that
  // arrives now cannot take it first.
  waiter->granted = true;
}

uint64_t ComputeTurns::taken() const {
  absl::MutexLock lock(&mu_);
  return taken_;
}

int ComputeTurns::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

}  // namespace opserver::cpu
