// The aclnn two-phase call on a session, without the transport: planning an
// executor (GetWorkspaceSize) and queueing a launch (Execute). The unary
// handlers, ExecuteStream and the Pipeline channel all call these, so a
// command means the same whichever RPC carries it.
#ifndef OPSERVER_SERVER_LAUNCH_H_
#define OPSERVER_SERVER_LAUNCH_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "devices/device.h"
#include "proto/opserver.pb.h"
#include "server/session.h"

namespace opserver {

// Checks and plans `request` against `session`'s buffers; the executor
// holds every buffer its tensors name. 161001/161002 as aclnn reports them.
absl::StatusOr<std::shared_ptr<Executor>> PlanExecutor(
    const v1::GetWorkspaceSizeRequest& request, Session& session,
    uint64_t max_launch_elements);

// The workspace a launch of `executor` gives (`request`'s workspace
// fields), checked as Execute checks it: its buffer (null when the plan
// needs none) and the address the launch passes.
struct LaunchWorkspace {
  std::shared_ptr<Buffer> buffer;
  void* data = nullptr;
  uint64_t size = 0;
};
absl::StatusOr<LaunchWorkspace> CheckWorkspace(
    const v1::ExecuteRequest& request, const Executor& executor,
    Session& session);

// Execute's work on `session` (the request's session field is not read):
// checks the stream, executor and workspace, consumes a single-use executor
// and queues the launch on the stream, whose task runs it on the stream's
// DeviceStream. A refused launch leaves the executor as it was.
absl::Status LaunchExecutor(const v1::ExecuteRequest& request,
                            Session& session);

}  // namespace opserver

#endif  // OPSERVER_SERVER_LAUNCH_H_
