#ifndef OPSERVER_SERVER_STREAM_H_
#define OPSERVER_SERVER_STREAM_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace opserver {

// A device stream: an in-order queue of work run by its own thread, so that
// work on one stream runs in issue order while different streams run
// concurrently (their kernels share the device's compute pool).
//
// Errors are sticky until reported: the first failing task's status is kept
// and handed to the next Synchronize, then cleared, so no failure is lost
// and none is reported twice. Later tasks still run.
//
// Callbacks given to Synchronize/WhenReached run on the stream's thread, or
// at once on the caller's when the stream is idle (nothing queued or
// running): a tiny launch or a synchronize of an idle stream then pays no
// thread hand-off. They must not block for long; gRPC reactors finish from
// there.
class Stream {
 public:
  using Task = std::function<absl::Status()>;

  Stream();
  // Runs the work already queued, then stops the thread.
  ~Stream();

  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Queues `task`; returns at once. With `inline_if_idle`, an idle stream
  // runs it on the calling thread instead (for tasks too small to be worth
  // a hand-off).
  void Enqueue(Task task, bool inline_if_idle = false);

  // Calls `done` once everything queued before this call has run, with the
  // first error since the previous Synchronize (OK if none).
  void Synchronize(std::function<void(absl::Status)> done);

  // Calls `reached` once everything queued before this call has run; does
  // not consume the sticky error. Used to order transfers after compute.
  void WhenReached(std::function<void()> reached);

  // Blocking form of Synchronize, for callers off the RPC threads.
  absl::Status SynchronizeAndWait();

 private:
  void Loop();
  // Claims the stream for the caller when idle; then the caller runs work
  // inline and calls Release().
  bool TryClaimIdle();
  void Release();
  void Record(absl::Status status);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // An item (queued or inline) is running; the thread waits for it.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // Touched only by whoever holds busy_.
  absl::Status first_error_;
  std::thread thread_;
};

}  // namespace opserver

#endif  // OPSERVER_SERVER_STREAM_H_
