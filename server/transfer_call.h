// What Upload, Download and OpenDataTransfer share (internal to the
// runtime_service library): the link the watchdog and the stream reach a
// call through, and the Transfer base class.
#ifndef OPSERVER_SERVER_TRANSFER_CALL_H_
#define OPSERVER_SERVER_TRANSFER_CALL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/stream.h"
#include "server/runtime_service.h"

namespace opserver {

// What a transfer call shares with those that may end it early: its
// stream's gate callbacks and the idle watchdog, which may run after the
// call is gone. They reach the call only through `call`, under `mu`, which
// is also the call's own lock.
struct RuntimeService::TransferLink {
  absl::Mutex mu;
  Transfer* call ABSL_GUARDED_BY(mu) = nullptr;
  // When a data-path mover last moved bytes (absl::GetCurrentTimeNanos):
  // set after every socket call, so without taking `mu`.
  std::atomic<int64_t> moved_ns{0};
};

// Common to Upload and Download: the hold on the stream (a transfer
// occupies its stream from start to end, so later work on that stream
// waits for it), the idle clock, and being ended early by CloseSession,
// DestroyStream, the idle timeout or cancellation (a stalled transfer must
// not pin a closed session). Members are
// guarded by link_->mu; a session reference is never dropped under it (a
// session's teardown cancels its streams, which takes that lock).
class RuntimeService::Transfer {
 public:
  virtual ~Transfer() = default;

  // The work queued before the transfer has run: move data.
  virtual void GateReachedLocked() = 0;
  // Ends the call with `why`, now or when the operation in flight returns.
  virtual void AbortLocked(const absl::Status& why) = 0;
  // True when the call has waited on its client (not on its stream) for
  // longer than `timeout`.
  bool IdleLocked(absl::Time now, absl::Duration timeout) const {
    const absl::Time moved =
        absl::FromUnixNanos(link_->moved_ns.load(std::memory_order_relaxed));
    return !finished_ && abort_.ok() && !waiting_ &&
           now - std::max(last_progress_, moved) > timeout;
  }
  // The watchdog's second duty: cancels a call whose abort has waited
  // longer than kStuckWriteGrace for a write in flight (see
  // CancelLaterLocked).
  void CancelIfStuckLocked(absl::Time now) {
    if (finished_ || now < cancel_at_) return;
    cancel_at_ = absl::InfiniteFuture();
    context_base_->TryCancel();
  }

 protected:
  Transfer(RuntimeService* service, grpc::ServerContextBase* context)
      : service_(service),
        context_base_(context),
        link_(std::make_shared<TransferLink>()),
        binding_(service->authenticator_, context) {}

  // How long an abort waits for the write in flight before cancelling the
  // call. The call is ended by the reaction to that write, with the abort's
  // reason: cancelling at once raced the write's completion, and a client
  // that had already received the message got gRPC's "Cancelled on the
  // server side" instead of the reason. Only a write the client does not
  // read (its flow-control window full) never completes: that call is
  // cancelled once this grace has passed.
  static constexpr absl::Duration kStuckWriteGrace = absl::Seconds(3);
  // For an abort that must wait on a write in flight: the watchdog cancels
  // the call if it is still there after kStuckWriteGrace.
  void CancelLaterLocked() {
    cancel_at_ = std::min(cancel_at_, absl::Now() + kStuckWriteGrace);
  }

  // The OnWriteDone of a call that writes (Download, OpenDataTransfer):
  // after the test hook, under the call's lock, the write is no longer in
  // flight, so there is nothing to cancel the call for; unless the call
  // has finished, WriteDoneLocked goes on.
  void EndWrite(bool ok) {
    if (service_->limits_.before_write_done) {
      service_->limits_.before_write_done();
    }
    absl::MutexLock lock(&link_->mu);
    writing_ = false;
    cancel_at_ = absl::InfiniteFuture();
    if (!finished_) WriteDoneLocked(ok);
  }
  // What follows a write (`ok` as gRPC reports it) in a call not finished.
  // Upload writes nothing.
  virtual void WriteDoneLocked(bool /*ok*/) {}

  // Makes the call reachable by the watchdog and the stream callbacks.
  // From the derived constructor's body: only then is the object whole.
  void Link() {
    {
      absl::MutexLock lock(&link_->mu);
      link_->call = this;
    }
    service_->AddTransfer(link_);
  }

  // From the body of a constructor that takes its request whole (Download,
  // OpenDataTransfer): links the call, resolves what it touches with
  // `start`, under the call's lock, and queues its gate on the stream
  // `start` returns. A refusal ends the call through AbortLocked.
  void Begin(
      const std::function<absl::StatusOr<std::shared_ptr<Stream>>()>& start) {
    Link();
    std::shared_ptr<Stream> stream;
    std::shared_ptr<Stream::Gate> gate;
    {
      absl::MutexLock lock(&link_->mu);
      absl::StatusOr<std::shared_ptr<Stream>> target = start();
      if (!target.ok()) {
        AbortLocked(target.status());
        return;
      }
      stream = *std::move(target);
      gate = gate_ = std::make_shared<Stream::Gate>();
      waiting_ = true;
    }
    // Nothing gRPC does for the call reaches the reactor before its
    // constructor has returned it, so the call stays valid.
    absl::Status held = HoldStream(*stream, gate);
    if (!held.ok()) {
      absl::MutexLock lock(&link_->mu);
      AbortLocked(held);
    }
  }

  // From OnDone: no callback reaches the call after this.
  void Unlink() {
    {
      absl::MutexLock lock(&link_->mu);
      link_->call = nullptr;
    }
    service_->RemoveTransfer(link_);
  }

  // Queues the gate that orders the transfer on `stream` and holds it until
  // `gate` is gone. Called without link_->mu (the gate may be reached at
  // once, on this thread).
  absl::Status HoldStream(Stream& stream,
                          const std::shared_ptr<Stream::Gate>& gate) {
    std::shared_ptr<TransferLink> link = link_;
    return stream.Hold(
        gate,
        [link] {
          absl::MutexLock lock(&link->mu);
          if (link->call != nullptr) link->call->GateReachedLocked();
        },
        [link] {
          absl::MutexLock lock(&link->mu);
          if (link->call != nullptr) {
            link->call->AbortLocked(absl::CancelledError(
                "transfer ended: its stream was destroyed or its session "
                "closed"));
          }
        });
  }

  RuntimeService* const service_;
  grpc::ServerContextBase* const context_base_;
  const std::shared_ptr<TransferLink> link_;
  // Whose sessions the transfer may name; revoking the token ends the call
  // (and forgets a data-path ticket with it).
  const TokenBoundCall binding_;
  bool finished_ = false;
  // A write in flight (the calls that write): an abort waits for it.
  bool writing_ = false;
  // Waiting for the work queued before it: not idle.
  bool waiting_ = false;
  absl::Time last_progress_ = absl::Now();
  // When the watchdog cancels an aborted call still waiting on its write.
  absl::Time cancel_at_ = absl::InfiniteFuture();
  // Why the call is being ended, once an abort waits for an operation.
  absl::Status abort_;
  std::shared_ptr<Stream::Gate> gate_;
  std::shared_ptr<Session> session_;
  std::shared_ptr<Buffer> buffer_;

  // Called as the call finishes: it lets go of its stream, session and
  // buffer then, not when gRPC deletes it (OnDone), which may come after
  // the server and its devices are gone; a device stream outliving its
  // device would be torn down on freed memory.
  void ReleaseHoldsLocked() {
    gate_.reset();
    session_.reset();
    buffer_.reset();
  }
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_TRANSFER_CALL_H_
