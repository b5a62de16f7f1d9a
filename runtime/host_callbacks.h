// Host callbacks as stream commands (aclrtLaunchCallback,
// aclrtLaunchHostFunc; CallbackCommand in proto/opserver.proto), without
// the transport: a callback reaches its stream after the work queued
// before it, whoever queued it is told so (`notify`), and a blocking one
// holds the stream (Stream::Hold) until its client releases it, the block
// time-out passes, or the stream is cancelled. The time-out keeps a client
// that never runs its callbacks from holding the stream, and what waits on
// it, for ever: the stream goes on and its next synchronize reports the
// time-out (DEADLINE_EXCEEDED, aclnn 507012).
#ifndef OPSERVER_RUNTIME_HOST_CALLBACKS_H_
#define OPSERVER_RUNTIME_HOST_CALLBACKS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/stream.h"

namespace opserver {

// What one blocking callback's state costs, charged to its session's
// memory while it is pending.
inline constexpr uint64_t kBlockedCallbackBytes = 512;

// One session's callbacks. Thread-safe.
class HostCallbacks {
 public:
  // Called once per callback: OK when its stream reached it, CANCELLED
  // when the stream was cancelled first. From any thread, possibly inside
  // Queue (an idle stream reaches it at once); it must not block.
  using Notify = std::function<void(absl::Status)>;

  // `block_timeout`: how long a blocking callback may hold its stream
  // after its notice. `held_bytes` and `memory_limit`: the session's
  // memory figure and limit, charged kBlockedCallbackBytes per pending
  // blocking callback.
  HostCallbacks(absl::Duration block_timeout,
                std::shared_ptr<std::atomic<uint64_t>> held_bytes,
                uint64_t memory_limit);
  ~HostCallbacks();
  HostCallbacks(const HostCallbacks&) = delete;
  HostCallbacks& operator=(const HostCallbacks&) = delete;

  // Queues callback `id` on `stream`. A blocking one must have an id no
  // other pending blocking callback has (ALREADY_EXISTS), and room in the
  // session's memory (RESOURCE_EXHAUSTED); CANCELLED for a cancelled
  // stream. On error nothing is queued and `notify` is not called.
  absl::Status Queue(Stream& stream, uint64_t id, bool block, Notify notify);
  // Lets blocking callback `id` go on (or, not reached yet, be skipped).
  // False when no pending blocking callback has that id.
  bool Release(uint64_t id);
  // Blocking callbacks pending (queued or holding their stream).
  size_t blocked() const;

 private:
  struct Table;
  struct Pending;
  // The gate's callbacks and the time-out, which hold the table and the
  // callback weakly: whichever comes after the other ended does nothing.
  static void Reached(const std::weak_ptr<Table>& table,
                      const std::weak_ptr<Pending>& weak, uint64_t id,
                      absl::Duration timeout,
                      const std::shared_ptr<std::atomic<bool>>& timed_out);
  static void Expired(const std::weak_ptr<Table>& table,
                      const std::weak_ptr<Pending>& weak, uint64_t id,
                      const std::shared_ptr<std::atomic<bool>>& timed_out);
  static void Cancelled(const std::weak_ptr<Table>& table,
                        const std::weak_ptr<Pending>& weak, uint64_t id);

  const absl::Duration block_timeout_;
  const std::shared_ptr<std::atomic<uint64_t>> held_bytes_;
  const uint64_t memory_limit_;
  // Shared with the stream's callbacks and the timer, which may outlive
  // this object.
  const std::shared_ptr<Table> table_;
};

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_HOST_CALLBACKS_H_
