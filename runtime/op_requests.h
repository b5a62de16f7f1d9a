// The Operators service's requests without the transport: GetWorkspaceSize
// (tensor descriptors and parameters -> a checked kernels::OpCall that the
// session's device prepares)
// and Evaluate (literal values -> computed values). The gRPC handlers only
// find the session, resolve its buffers and admit the call.
#ifndef OPSERVER_RUNTIME_OP_REQUESTS_H_
#define OPSERVER_RUNTIME_OP_REQUESTS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/op_call.h"  // FindOperator, SetParams, BufferLookup
#include "devices/device.h"
#include "proto/opserver.pb.h"

namespace opserver {

// GetWorkspaceSize: the operator, its parameters and each tensor descriptor
// (dtype, shape, strides, offsets, storage shape, inside its buffer) turned
// into a kernels::OpCall, validated (kernels::Validate: the exact aclnn
// statuses, the same a client computes itself) and prepared by `device`
// (Device::Prepare). 161002 (RESOURCE_EXHAUSTED) when the launch would
// compute more than `max_launch_elements`.
absl::StatusOr<std::unique_ptr<DevicePlan>> PlanGetWorkspaceSize(
    const v1::GetWorkspaceSizeRequest& request, BufferLookup lookup,
    uint64_t max_launch_elements, const Device& device);

// UNIMPLEMENTED (aclnn 361001) naming the operator when `device` cannot
// run `op` (Device::SupportsOp), OK otherwise. Planning checks it first.
absl::Status CheckDeviceSupports(const Device& device, kernels::OpKind op);

// Evaluate: checks the literal tensors (each at most `max_values` values),
// copies them to scratch memory of `device`, runs the operator there and
// returns the output tensor.
absl::StatusOr<v1::ValueTensor> RunEvaluate(const v1::EvaluateRequest& request,
                                            Device* device,
                                            uint32_t max_values);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_OP_REQUESTS_H_
