// Bytes charged to a session's memory budget (--session_memory_bytes)
// besides its buffers: the state the server keeps for the session's open
// calls and pending event operations. Reserved against the limit with a
// compare-and-swap, so concurrent charges cannot overshoot it together, and
// refunded when released, so a session's memory figure and its room for
// Malloc include what its calls hold.
#ifndef OPSERVER_RUNTIME_MEMORY_CHARGE_H_
#define OPSERVER_RUNTIME_MEMORY_CHARGE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace opserver {

// What one open call's state costs the server (an Attach call, a pending
// SynchronizeStream or SynchronizeEvent): the third review measured about
// 12 KiB per call.
inline constexpr uint64_t kCallStateBytes = 12 << 10;
// What one pending event operation (a record, wait, reset or synchronize
// an event holds) costs: about 30 MiB for the 65,536 a session may have.
inline constexpr uint64_t kEventOperationBytes = 512;

// Adds `bytes` to `held` unless that would pass `limit`: then
// RESOURCE_EXHAUSTED saying what `what` (e.g. "an Attach call's state")
// needed and what the session holds.
absl::Status ReserveSessionBytes(std::atomic<uint64_t>& held, uint64_t limit,
                                 uint64_t bytes, absl::string_view what);

// `bytes` of `held`, reserved with ReserveSessionBytes and given back on
// destruction. It shares only the counter, so a call that outlives its
// session keeps no session alive. Move-only.
class MemoryCharge {
 public:
  MemoryCharge() = default;
  MemoryCharge(std::shared_ptr<std::atomic<uint64_t>> held, uint64_t bytes)
      : held_(std::move(held)), bytes_(bytes) {}
  MemoryCharge(MemoryCharge&& other) noexcept
      : held_(std::move(other.held_)), bytes_(other.bytes_) {
    other.held_ = nullptr;
  }
  MemoryCharge& operator=(MemoryCharge&& other) noexcept {
    if (this != &other) {
      Release();
      held_ = std::move(other.held_);
      bytes_ = other.bytes_;
      other.held_ = nullptr;
    }
    return *this;
  }
  ~MemoryCharge() { Release(); }

 private:
  void Release() {
    if (held_ != nullptr) held_->fetch_sub(bytes_);
    held_ = nullptr;
  }
  std::shared_ptr<std::atomic<uint64_t>> held_;
  uint64_t bytes_ = 0;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_MEMORY_CHARGE_H_
