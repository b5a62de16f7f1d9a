// TransferWatchdog: ends the client's transfer calls (Upload, Download and
// the parts of a split one) that stop moving data. Such a call would
// otherwise wait for its whole deadline (ConnectOptions::wait_timeout, ten
// minutes by default) when what stands between it and the server stops
// forwarding: an HTTP/2 proxy whose connection is stalled, a server that
// stopped reading or sending. The server's own idle watchdog
// (--transfer_idle_timeout_s) cannot help then: its verdict travels the
// same stalled path. Part of the client library.
#ifndef OPSERVER_CLIENT_TRANSFER_WATCHDOG_H_
#define OPSERVER_CLIENT_TRANSFER_WATCHDOG_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"

namespace opserver {
namespace remote {

// Thread-safe. Its thread starts with the first Watch and ticks every
// quarter of `idle` (10 ms to 1 s).
class TransferWatchdog {
 public:
  using Clock = std::function<absl::Time()>;

  // A call that moves nothing for longer than `idle` is cancelled;
  // absl::InfiniteDuration(): never. `clock` is for tests, which call
  // Check themselves with `run_thread` false.
  explicit TransferWatchdog(absl::Duration idle, Clock clock = &absl::Now,
                            bool run_thread = true);
  // Stops the thread; every Watch must be gone.
  ~TransferWatchdog();
  TransferWatchdog(const TransferWatchdog&) = delete;
  TransferWatchdog& operator=(const TransferWatchdog&) = delete;

  // One call, watched from construction to destruction (which must come
  // before `context` goes).
  class Watch {
   public:
    Watch(TransferWatchdog* watchdog, grpc::ClientContext* context);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    // A message was handed to gRPC, or one arrived.
    void Progress();
    // The watchdog cancelled the call: its status is gRPC's CANCELLED, and
    // the caller reports IdleError instead.
    bool expired() const { return expired_.load(std::memory_order_acquire); }

   private:
    friend class TransferWatchdog;
    TransferWatchdog* const watchdog_;
    grpc::ClientContext* const context_;
    std::atomic<int64_t> last_ns_;
    std::atomic<bool> expired_{false};
  };

  // Cancels every watched call that has moved nothing for longer than the
  // idle time, now (by the clock). The thread calls it on each tick.
  void Check();

  // DEADLINE_EXCEEDED (aclnn runtime error) for the call `what` that the
  // watchdog ended, naming the idle time and the option that sets it.
  absl::Status IdleError(absl::string_view what) const;

 private:
  void Add(Watch* watch);
  void Remove(Watch* watch);
  void Loop();

  const absl::Duration idle_;
  const Clock clock_;
  const bool run_thread_;
  absl::Mutex mu_;
  // Held under mu_ while the watchdog may cancel them: a Watch leaves the
  // set before its context can go.
  absl::flat_hash_set<Watch*> watches_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace remote
}  // namespace opserver

#endif  // OPSERVER_CLIENT_TRANSFER_WATCHDOG_H_
