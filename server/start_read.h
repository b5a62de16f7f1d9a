// What the streaming reactors (ExecuteStream's, the Pipeline channel's)
// share about starting a read.
#ifndef OPSERVER_SERVER_START_READ_H_
#define OPSERVER_SERVER_START_READ_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace opserver {

// Starts `reactor`'s next read outside `mu` (the reaction may run inline
// on this thread and take `mu`), counting it in `starting` meanwhile so the
// reactor does not Finish before StartRead has returned; the caller's
// finish check must treat `starting` > 0 as "not yet". Two can overlap: the
// reaction to this read may start the next one before this returns.
template <typename Reactor, typename Request>
void StartReadOutsideLock(Reactor& reactor, Request* request, absl::Mutex& mu,
                          int& starting) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  ++starting;
  mu.Unlock();
  reactor.StartRead(request);
  mu.Lock();
  --starting;
}

}  // namespace opserver

#endif  // OPSERVER_SERVER_START_READ_H_
