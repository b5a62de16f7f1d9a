// Device-neutral validation of the five backward operators: their registry
// (names, arguments, dtypes), every argument check with its exact aclnn
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
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/formulas.h"
#include "kernels/op_kind.h"
#include "kernels/scalar.h"
#include "kernels/tensor.h"

namespace opserver::kernels {

// One tensor argument of an operator, in call order.
struct TensorArgInfo {
  absl::string_view name;  // "gradOutput", "self", "mask", "out", ...
  bool is_output = false;
  std::vector<DType> dtypes;  // Every dtype the argument may have.
};

// One non-tensor argument, in call order.
struct ScalarArgInfo {
  absl::string_view name;  // "threshold", "negativeSlope", "scale", ...
  // "float" (an aclScalar of dtype FLOAT), "scalar" (an aclScalar of any
  // dtype in `dtypes`), "bool" or "double" (plain host values).
  absl::string_view type;
  // Only for type "scalar"; the first is the dtype of `default_value`.
  std::vector<DType> dtypes;
  // What a caller that has no value of its own passes (opctl run when the
  // flag is absent): PyTorch's default where it has one. Bool: 0 or 1.
  // Absent: the caller must give one.
  std::optional<double> default_value;
};

struct OpInfo {
  OpKind kind;
  absl::string_view name;        // "ThresholdBackward"
  absl::string_view aclnn_name;  // "aclnnThresholdBackward"
  std::vector<TensorArgInfo> tensors;
  std::vector<ScalarArgInfo> scalars;
  absl::string_view description;  // One line of semantics.
};

// All operators, in OpKind order.
const std::vector<OpInfo>& OpRegistry();
// By name ("ThresholdBackward") or aclnn name ("aclnnThresholdBackward");
// nullptr when unknown.
const OpInfo* FindOp(absl::string_view name);
const OpInfo& GetOpInfo(OpKind kind);

struct OpParams {
  double threshold = 0;         // ThresholdBackward (used as FLOAT).
  double lambd = 0.5;           // SoftshrinkBackward (used as FLOAT).
  Scalar negative_slope;        // LeakyReluBackward.
  bool self_is_result = false;  // LeakyReluBackward.
  double scale = 1;             // DropoutBackward.
};

// One operator call. `self` holds the mask for DropoutBackward and `out`
// is gradInput for SoftshrinkBackward. A missing tensor is 161001.
struct OpCall {
  OpKind op = OpKind::kThresholdBackward;
  std::optional<TensorView> grad_output;
  std::optional<TensorView> self;
  std::optional<TensorView> out;
  OpParams params;
};

// A call that passed every check.
struct ValidCall {
  OpCall call;
  // Shape of the output (the broadcast shape of the inputs).
  std::vector<int64_t> out_shape;
  // Bytes of workspace the launch needs: 0 unless the dropout mask is not
  // contiguous (it is then gathered into the workspace) and not empty.
  uint64_t workspace_size = 0;
  // The operator's scalars in the types the kernels compute in.
  KernelParams params;
};

// aclnnXxxGetWorkspaceSize's checks: 161001 for a missing tensor or data
// pointer, 161002 for any other violation, with a message naming the
// argument and the rule, in the order aclnn reports them.
absl::StatusOr<ValidCall> Validate(const OpCall& call);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_VALIDATE_H_
