// GetWorkspaceSize's request as the operators see it: the operator, its
// parameters and each tensor descriptor (dtype, shape, strides, offsets,
// storage shape, inside its buffer) turned into a kernels::OpCall, with the
// bounds of every view checked against its buffer. The server plans the
// call from it; the client runs kernels::Validate on it to answer
// aclnnXxxGetWorkspaceSize without a round trip. One implementation, so the
// two sides report the same status for the same arguments.
#ifndef OPSERVER_COMMON_OP_CALL_H_
#define OPSERVER_COMMON_OP_CALL_H_

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/validate.h"
#include "proto/opserver.pb.h"

namespace opserver {

// The operator named `name` (or its aclnn name); 161002 listing the known
// ones otherwise.
absl::StatusOr<const kernels::OpInfo*> FindOperator(const std::string& name);

// A wire dtype as a kernels::DType; 161002 naming `what` when it is not an
// aclDataType.
absl::StatusOr<kernels::DType> ToDType(int32_t value, absl::string_view what);

// The operator parameters of a request, checked as far as they can be
// without the tensors (the rest is kernels::Validate's). A parameter the
// request leaves out takes its advertised default (ScalarArgInfo::
// default_value, ListOperators' default_value).
absl::Status SetParams(const kernels::OpInfo& op, const v1::OpParams& in,
                       kernels::OpParams* out);

// Sets the v1::OpParams `field` to `value`: a bool field to value != 0, a
// ScalarValue field to {dtype, value}, a double field to value. The one
// way a caller that holds a parameter as a number fills a request (opctl
// from its flags, the server's --preflight from the defaults).
void SetOpParamField(const google::protobuf::FieldDescriptor& field,
                     double value, kernels::DType dtype,
                     v1::OpParams* params);

// The operator `name` with its parameters set in `call` (the tensors are
// the caller's): FindOperator + SetParams.
absl::StatusOr<const kernels::OpInfo*> BeginOpCall(const std::string& name,
                                                   const v1::OpParams& params,
                                                   kernels::OpCall* call);

// Puts `view` into the slot of `op`'s tensor argument `name` in `call`;
// 161002 naming the arguments when `op` has none of that name.
absl::Status PlaceTensor(const kernels::OpInfo& op, const std::string& name,
                         kernels::TensorView view, kernels::OpCall* call);

// Device memory a request names by handle: `size` bytes at `data` (on a
// client, a stand-in address that is never dereferenced).
struct DeviceBytes {
  void* data = nullptr;
  uint64_t size = 0;
};
// Resolves a buffer handle of the caller's session (NOT_FOUND if unknown).
using BufferLookup =
    absl::FunctionRef<absl::StatusOr<DeviceBytes>(uint64_t handle)>;

// The call `request` describes, every view inside its buffer; 161001/161002
// otherwise. The operator's own checks are kernels::Validate's.
absl::StatusOr<kernels::OpCall> ToOpCall(
    const v1::GetWorkspaceSizeRequest& request, BufferLookup lookup);

}  // namespace opserver

#endif  // OPSERVER_COMMON_OP_CALL_H_
