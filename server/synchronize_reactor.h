// The reactor of a unary call that waits for something the client chose
// (SynchronizeStream, SynchronizeEvent) and may abandon: its call state
// (about 12 KiB) must not stay behind for as long as the wait lasts.
#ifndef OPSERVER_SERVER_SYNCHRONIZE_REACTOR_H_
#define OPSERVER_SERVER_SYNCHRONIZE_REACTOR_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "runtime/session.h"

namespace opserver {

// What a wait hands the call: the function that answers it (callable from
// any thread, at most once).
using SynchronizeAnswer = std::function<void(absl::Status)>;
// Registers `answer` with what the call waits for and returns the function
// that drops it again (null when `answer` was called already), or the error
// that refused the wait (the call is answered with it).
using SynchronizeWait = std::function<absl::StatusOr<std::function<void()>>(
    SynchronizeAnswer answer)>;

// Starts `wait` for the call of `context` and returns its reactor. The
// call is answered once: by the wait's answer, or by its cancellation
// (deadline passed, client gone), which drops the wait at once, so an
// abandoned call holds nothing until what it waited for happens. `slot`
// (Session::TakeSynchronizeSlot) is held until the call is done.
grpc::ServerUnaryReactor* StartSynchronize(grpc::CallbackServerContext* context,
                                           SessionSlot slot,
                                           const SynchronizeWait& wait);

}  // namespace opserver

#endif  // OPSERVER_SERVER_SYNCHRONIZE_REACTOR_H_
