// The aclnn two-phase call without the transport, in one place: planning an
// executor (GetWorkspaceSize: a request's tensor descriptors and parameters
// become a checked kernels::OpCall that the device prepares), launching it
// (Execute: queued on a session's stream) and Evaluate (both at once, on
// literal values in scratch memory). The unary handlers, ExecuteStream and
// the Pipeline channel all call these, so a command means the same
// whichever RPC carries it. PlanGetWorkspaceSize, CheckDeviceSupports and
// RunEvaluate need no session: preflight and the fuzzers call them alone.
#ifndef OPSERVER_RUNTIME_EXECUTOR_H_
#define OPSERVER_RUNTIME_EXECUTOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/op_call.h"  // FindOperator, SetParams, BufferLookup
#include "devices/device.h"
#include "proto/opserver.pb.h"
#include "runtime/session.h"

namespace opserver {

// ---- Running on the receiving thread -------------------------------------

// Work small enough runs on the thread that received it (a Pipeline worker
// or an RPC thread) when its stream is idle, instead of being handed to the
// stream's thread. How small is the answer of the session's device
// (Device::inline_launch_elements; 0: nothing):
//  - a launch of at most that many elements;
//  - a graph's replay (runtime/graph.h) whose tasks are each that small (a
//    memset, copy or write counting its bytes / 4) and all together within
//    the replay's budget, in launches of that size: kWorkerReplayLaunches
//    when it arrives on a Pipeline worker, the launches one Pipeline slice
//    (the command channel reactor's 512 commands) may already run there,
//    so a replay holds the worker no longer than the eager commands it
//    stands for could (also when the server's only session has a small
//    batch applied on the callback thread that read it: no other tenant
//    waits for that thread, and another one stays free; see the command
//    channel reactor); kUnaryReplayLaunches on gRPC's callback thread (the
//    unary ReplayGraph), which every call needs: one unary Execute's worth.
// Larger launches and replays go to the stream's thread.
inline constexpr int64_t kWorkerReplayLaunches = 512;
inline constexpr int64_t kUnaryReplayLaunches = 1;

// ---- GetWorkspaceSize ---------------------------------------------------

// The operator, its parameters and each tensor descriptor (dtype, shape,
// strides, offsets, storage shape, inside its buffer) turned into a
// kernels::OpCall, validated (kernels::Validate: the exact aclnn statuses,
// the same a client computes itself) and prepared by `device`
// (Device::Prepare). 161002 (RESOURCE_EXHAUSTED) when the launch would
// compute more than `max_launch_elements`.
absl::StatusOr<std::unique_ptr<DevicePlan>> PlanGetWorkspaceSize(
    const v1::GetWorkspaceSizeRequest& request, BufferLookup lookup,
    uint64_t max_launch_elements, const Device& device);

// UNIMPLEMENTED (aclnn 361001) naming the operator when `device` cannot
// run `op` (Device::SupportsOp), OK otherwise. Planning checks it first.
absl::Status CheckDeviceSupports(const Device& device, kernels::OpKind op);

// PlanGetWorkspaceSize against `session`'s buffers and device; the
// executor holds every buffer its tensors name. 161001/161002 as aclnn
// reports them.
absl::StatusOr<std::shared_ptr<Executor>> PlanExecutor(
    const v1::GetWorkspaceSizeRequest& request, Session& session,
    uint64_t max_launch_elements);

// ---- Execute ------------------------------------------------------------

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

// ---- Evaluate -----------------------------------------------------------

// Checks the literal tensors (each at most `max_values` values), copies
// them to scratch memory of `device`, runs the operator there and returns
// the output tensor.
absl::StatusOr<v1::ValueTensor> RunEvaluate(const v1::EvaluateRequest& request,
                                            Device* device,
                                            uint32_t max_values);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_EXECUTOR_H_
