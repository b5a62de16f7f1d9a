#include "server/grpc_status_util.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/task_position.h"
#include "kernels/aclnn_status.h"
#include "runtime/log.h"
#include "server/call_log.h"

namespace opserver {

grpc::Status ToGrpcStatus(const absl::Status& status,
                          grpc::ServerContextBase* context, FailureLog log) {
  if (status.ok()) return grpc::Status::OK;
  const int32_t aclnn = kernels::GetAclnnStatus(status);
  if (context != nullptr) {
    context->AddTrailingMetadata(kAclnnStatusTrailerKey,
                                 std::to_string(aclnn));
    // A stream's deferred error names its task (SynchronizeStream).
    if (const uint64_t task = TaskPositionOf(status); task != 0) {
      context->AddTrailingMetadata(kTaskPositionTrailerKey,
                                   std::to_string(task));
    }
  }
  // Messages may quote what the client sent (names, tokens): bounded here,
  // in the one place every error leaves through, so no reply or log line
  // echoes megabytes back.
  std::string message = Truncated(status.message(), kMaxErrorMessageBytes);
  // The server's one log line per failed call (rate-limited).
  if (log == FailureLog::kLog) {
    CallLog::LogFailure(context, status, aclnn, message);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::move(message));
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context,
                                const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status, context));
  return reactor;
}

}  // namespace opserver
