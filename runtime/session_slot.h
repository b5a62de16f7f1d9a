#ifndef OPSERVER_RUNTIME_SESSION_SLOT_H_
#define OPSERVER_RUNTIME_SESSION_SLOT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "runtime/memory_charge.h"

namespace opserver {

// One unit of a count a session bounds (its open Attach calls, its
// pending synchronizes), held by the call that took it and given back when
// destroyed, with the call's state charged to the session's memory
// (kCallStateBytes) meanwhile. It shares only the counters, not the
// session, so a call that outlives its session keeps no session memory
// alive. Move-only.
class SessionSlot {
 public:
  SessionSlot() = default;
  SessionSlot(std::shared_ptr<std::atomic<uint64_t>> count, MemoryCharge charge)
      : count_(std::move(count)), charge_(std::move(charge)) {}
  SessionSlot(SessionSlot&& other) = default;
  SessionSlot& operator=(SessionSlot&& other) {
    Give();
    count_ = std::move(other.count_);
    charge_ = std::move(other.charge_);
    return *this;
  }
  ~SessionSlot() { Give(); }

 private:
  void Give() {
    if (count_ != nullptr) count_->fetch_sub(1);
    count_ = nullptr;
    charge_ = MemoryCharge();
  }
  std::shared_ptr<std::atomic<uint64_t>> count_;
  MemoryCharge charge_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_SESSION_SLOT_H_
