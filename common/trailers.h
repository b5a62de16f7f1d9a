#ifndef OPSERVER_COMMON_TRAILERS_H_
#define OPSERVER_COMMON_TRAILERS_H_

namespace opserver {

// Trailing-metadata key holding the aclnn status (decimal) of a failed
// call. The server writes it (server/grpc_status_util) and every client
// reads it, so a client returns the kernels' exact code and not one
// derived from the gRPC code.
inline constexpr char kAclnnStatusTrailerKey[] = "opserver-aclnn-status";

// Trailing-metadata key holding, for a stream's deferred error, the failing
// task's position on the stream (decimal; common/task_position.h), as
// FenceResult.task carries it on the Pipeline.
inline constexpr char kTaskPositionTrailerKey[] = "opserver-task-position";

}  // namespace opserver

#endif  // OPSERVER_COMMON_TRAILERS_H_
