// Device-neutral validation of the operators: their registry (names,
// arguments, dtypes; each operator's entry and checks are its definition in
// kernels/ops/, listed in op_kind.h), every argument check with its exact aclnn
// status, the output shape and the workspace size, which is everything
// aclnnXxxGetWorkspaceSize promises before any device plans the launch.
// No kernels and no SIMD: clients link this to answer GetWorkspaceSize
// themselves, and each device's planner starts from its result.
//
//   absl::StatusOr<ValidCall> v = Validate(call);
//   if (!v.ok()) return GetAclnnStatus(v.status());   // 161001 / 161002
//   ... v->workspace_size, v->out_shape ...
#ifndef OPSERVER_KERNELS_VALIDATE_H_
#define OPSERVER_KERNELS_VALIDATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/kernel_params.h"
#include "kernels/op_kind.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// All operators, in OpKind order.
const std::vector<OpInfo>& OpRegistry();
// By name ("ThresholdBackward") or aclnn name ("aclnnThresholdBackward");
// nullptr when unknown.
const OpInfo* FindOp(absl::string_view name);
const OpInfo& GetOpInfo(OpKind kind);

// A call that passed every check.
struct ValidCall {
  OpCall call;
  // Shape of the output (the broadcast shape of the inputs).
  std::vector<int64_t> out_shape;
  // Bytes of workspace the launch needs: 0 unless the dropout mask is not
  // contiguous (it is then gathered into the workspace) and not empty.
  uint64_t workspace_size = 0;
  // The operator's scalars in the types its formulas compute in.
  KernelParams params;
};

// aclnnXxxGetWorkspaceSize's checks: 161001 for a missing tensor or data
// pointer, 161002 for any other violation, with a message naming the
// argument and the rule, in the order aclnn reports them.
absl::StatusOr<ValidCall> Validate(const OpCall& call);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_VALIDATE_H_
