// The aclnn two-phase call on a session, without the transport: planning an
// executor (GetWorkspaceSize) and queueing a launch (Execute). The unary
// handlers, ExecuteStream and the Pipeline channel all call these, so a
// command means the same whichever RPC carries it.
#ifndef OPSERVER_RUNTIME_LAUNCH_H_
#define OPSERVER_RUNTIME_LAUNCH_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "devices/device.h"
#include "proto/opserver.pb.h"
#include "runtime/session.h"

namespace opserver {

// Work small enough to run on the thread that received it (a Pipeline
// worker or an RPC thread) when its stream is idle, instead of being handed
// to the stream's thread: a hand-off (a wake-up, a context switch, a cache
// gone cold) costs more than the work. Device-neutral: counted in elements
// of the launch (every device's kernels scale with them), and in bytes for
// memsets, copies and writes (kInlineBytes, the bytes of
// kInlineLaunchElements fp32 elements).
//  - A launch of at most kInlineLaunchElements elements (microseconds of
//    work).
//  - A graph's replay (runtime/graph.h) when each of its tasks is that small
//    (bytes: at most kInlineBytes) and all of them together are at most
//    kInlineReplayElements when it arrives on a Pipeline worker: the work
//    one Pipeline slice (OperatorService's 512 commands) of such launches
//    may already run inline, so a replay holds the worker no longer than
//    the eager commands it stands for could. The unary ReplayGraph runs on
//    gRPC's callback thread, which every call needs: there a replay runs
//    inline only within kInlineLaunchElements, as a unary Execute does.
//    Larger replays (and any larger launch) go to the stream's thread, as
//    before.
inline constexpr int64_t kInlineLaunchElements = 16 * 1024;
inline constexpr uint64_t kInlineBytes = kInlineLaunchElements * 4;
inline constexpr int64_t kInlineReplayElements = 512 * kInlineLaunchElements;

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

#endif  // OPSERVER_RUNTIME_LAUNCH_H_
