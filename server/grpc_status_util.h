#ifndef OPSERVER_SERVER_GRPC_STATUS_UTIL_H_
#define OPSERVER_SERVER_GRPC_STATUS_UTIL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "common/trailers.h"
#include "grpcpp/grpcpp.h"

namespace opserver {

// Error messages sent to clients are cut to this many bytes.
inline constexpr size_t kMaxErrorMessageBytes = 4096;

// The one place where absl::Status becomes grpc::Status. Every RPC handler
// finishes through this, so codes and messages are converted identically
// everywhere (the canonical codes have the same numbering in both
// libraries). For a non-OK status it also adds the aclnn status to
// `context`'s trailing metadata under kAclnnStatusTrailerKey (the kernels'
// code when the status carries one, else derived from the canonical code),
// so clients return the exact aclnn code, and the failing task's position
// under kTaskPositionTrailerKey when the status carries one, and logs one
// line for it.
// The line names the call's method, tenant and session and is rate-limited
// (CallLog). kQuiet: no line, for a call that ended the way its client
// asked (its session was closed under it).
enum class FailureLog { kLog, kQuiet };
grpc::Status ToGrpcStatus(const absl::Status& status,
                          grpc::ServerContextBase* context,
                          FailureLog log = FailureLog::kLog);

// Finishes a unary call with `status` (through ToGrpcStatus) and returns
// its reactor: `return Reply(context, status);` from a callback handler.
grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context,
                                const absl::Status& status);

// The error form of Reply for the status macros (common/status_macros.h):
//   ASSIGN_OR_RETURN(auto session, SessionOf(...), ReplyTo(context));
// finishes the call with the failed status and returns its reactor.
inline auto ReplyTo(grpc::CallbackServerContext* context) {
  return [context](const absl::Status& status) {
    return Reply(context, status);
  };
}

}  // namespace opserver

#endif  // OPSERVER_SERVER_GRPC_STATUS_UTIL_H_
