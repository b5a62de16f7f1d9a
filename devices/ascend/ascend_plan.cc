// AscendPlan: an operator's call as CANN objects, planned by its
// aclnnXxxGetWorkspaceSize (ascend_device.h).
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "common/values.h"
#include "devices/ascend/ascend_device.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_signatures.h"
#include "kernels/tensor.h"
#include "kernels/validate.h"

namespace opserver::ascend {
namespace {

using kernels::OpKind;

// aclCreateTensor's storage shape for `view`: the one the caller gave, or
// the smallest 1-D storage that holds every element (from view.data).
std::vector<int64_t> StorageDims(const kernels::TensorView& view) {
  if (!view.storage_shape.empty()) return view.storage_shape;
  int64_t max_element = -1;
  // The view was validated when it was planned; a failure here cannot
  // happen, and would leave the empty storage below for CANN to refuse.
  if (!kernels::CheckTensorLayout(view, "tensor", &max_element).ok()) {
    return {0};
  }
  return {max_element + 1};
}

// One element of the scalar's own dtype, as aclCreateScalar reads it.
absl::StatusOr<std::string> ScalarBytes(const kernels::Scalar& scalar) {
  const double value = kernels::IsFloating(scalar.dtype)
                           ? scalar.f
                           : static_cast<double>(scalar.i);
  return EncodeValues(scalar.dtype, absl::MakeConstSpan(&value, 1));
}

// An operator's parameters as its aclnn function takes them, by the kinds
// of the signature table (kernels/op_signatures.h): FLOAT and SCALAR as
// aclScalar objects made by `make` (the plan's, destroyed with it), DOUBLE
// and BOOL as they are.
struct ScalarArgs {
  std::function<absl::Status(void*, aclDataType, aclScalar**)> make;

  absl::StatusOr<aclScalar*> FLOAT(double value) const {
    float f = static_cast<float>(value);
    aclScalar* out = nullptr;
    RETURN_IF_ERROR(make(&f, ACL_FLOAT, &out));
    return out;
  }
  absl::StatusOr<aclScalar*> SCALAR(const kernels::Scalar& value) const {
    ASSIGN_OR_RETURN(std::string bytes, ScalarBytes(value));
    aclScalar* out = nullptr;
    RETURN_IF_ERROR(
        make(bytes.data(), static_cast<aclDataType>(value.dtype), &out));
    return out;
  }
  absl::StatusOr<double> DOUBLE(double value) const { return value; }
  absl::StatusOr<bool> BOOL(bool value) const { return value; }
};

// aclCreateTensor for `view`, kept in `made` (the plan's objects,
// destroyed with it).
absl::StatusOr<aclTensor*> MakeTensor(const CannLibrary& cann,
                                      const kernels::TensorView& view,
                                      std::vector<aclTensor*>& made) {
  const std::vector<int64_t> strides = kernels::EffectiveStrides(view);
  const std::vector<int64_t> storage = StorageDims(view);
  aclTensor* t = cann.api().aclCreateTensor(
      view.shape.data(), view.shape.size(),
      static_cast<aclDataType>(view.dtype), strides.data(), view.offset,
      ACL_FORMAT_ND, storage.data(), storage.size(), view.data);
  if (t == nullptr) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kInternal,
        absl::StrCat("aclCreateTensor returned NULL", WithRecentError(cann)));
  }
  made.push_back(t);
  return t;
}

// aclCreateScalar of `value` (one element of `dtype`), kept in `made`.
absl::Status MakeScalar(const CannLibrary& cann, void* value, aclDataType dtype,
                        aclScalar** out, std::vector<aclScalar*>& made) {
  aclScalar* s = cann.api().aclCreateScalar(value, dtype);
  if (s == nullptr) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kInternal,
        absl::StrCat("aclCreateScalar returned NULL", WithRecentError(cann)));
  }
  made.push_back(s);
  *out = s;
  return absl::OkStatus();
}

// The three tensors of a call as aclTensors.
struct CallTensors {
  aclTensor* grad = nullptr;
  aclTensor* self = nullptr;
  aclTensor* out = nullptr;
};

// aclnnXxxGetWorkspaceSize of `call.op` with its parameters made by `args`:
// the aclnn status it returned (a parameter CANN would not take as an
// aclScalar is the error). One case per operator, generated from the
// signature table: the two inputs, the parameters as aclnn takes them, the
// output. A signature that differs from its aclnnop/ header does not
// compile.
absl::StatusOr<aclnnStatus> GetWorkspaceSize(
    const CannApi::OpFunctions& functions, const kernels::OpCall& call,
    const ScalarArgs& args, const CallTensors& t, uint64_t* needed,
    aclOpExecutor** executor) {
  aclnnStatus status = ACLNN_SUCCESS;
  switch (call.op) {
#define OPSERVER_ASCEND_MAKE(KIND, name, field)    \
  const auto field = args.KIND(call.params.field); \
  if (!field.ok()) return field.status();
#define OPSERVER_ASCEND_PASS(KIND, name, field) , *field
#define OPSERVER_ASCEND_CASE(Name, in0, in1, out_name, PARAMS)                 \
  case OpKind::k##Name: {                                                      \
    PARAMS(OPSERVER_ASCEND_MAKE)                                               \
    status = reinterpret_cast<decltype(&::aclnn##Name##GetWorkspaceSize)>(     \
        functions.get_workspace_size)(                                         \
        t.grad, t.self PARAMS(OPSERVER_ASCEND_PASS), t.out, needed, executor); \
    break;                                                                     \
  }
    OPSERVER_OPERATORS(OPSERVER_ASCEND_CASE)
#undef OPSERVER_ASCEND_CASE
#undef OPSERVER_ASCEND_PASS
#undef OPSERVER_ASCEND_MAKE
  }
  return status;
}

}  // namespace

AscendPlan::AscendPlan(const AscendDevice* device, kernels::ValidCall valid)
    : DevicePlan(device, std::move(valid)), device_(device) {}

AscendPlan::~AscendPlan() {
  absl::MutexLock lock(&mu_);
  if (tensors_.empty() && scalars_.empty() && executor_ == nullptr) return;
  // Destroyed where the last owner lets go (a stream or RPC thread): bound
  // first, as every CANN call is. A failed bind has no one to report to.
  (void)device_->Bind();
  DestroyLocked();
}

aclnnStatus AscendPlan::Launch(void* workspace, uint64_t workspace_size,
                               aclrtStream stream) const {
  const CannApi::OpFunctions& functions =
      device_->cann().api().ops[static_cast<int>(call().op)];
  absl::MutexLock lock(&mu_);
  return reinterpret_cast<decltype(&::aclnnThresholdBackward)>(
      functions.launch)(workspace, workspace_size, executor_, stream);
}

absl::StatusOr<uint64_t> AscendPlan::Planned() const {
  absl::MutexLock lock(&mu_);
  if (executor_ != nullptr) return aclnn_workspace_size_;
  if (absl::Status s = PlanLocked(); !s.ok()) {
    // Nothing half-made stays: the next launch plans again.
    DestroyLocked();
    return s;
  }
  return aclnn_workspace_size_;
}

void AscendPlan::DestroyLocked() const {
  const CannApi& api = device_->cann().api();
  for (aclTensor* tensor : tensors_) api.aclDestroyTensor(tensor);
  for (aclScalar* scalar : scalars_) api.aclDestroyScalar(scalar);
  if (executor_ != nullptr) api.aclDestroyAclOpExecutor(executor_);
  tensors_.clear();
  scalars_.clear();
  executor_ = nullptr;
}

absl::Status AscendPlan::PlanLocked() const {
  const kernels::OpCall& call = this->call();
  const CannLibrary& cann = device_->cann();
  const CannApi& api = cann.api();
  const absl::string_view name = AclnnName(call.op);
  if (!api.has_op(call.op)) {
    return kernels::AclnnError(
        kernels::kAclnnErrRuntimeError, absl::StatusCode::kUnimplemented,
        absl::StrCat(name, " is not in the loaded CANN libraries"));
  }
  // Every object made here is the plan's, destroyed with it. A validated
  // call has all three tensors (for DropoutBackward, `self` is the mask;
  // for SoftshrinkBackward, `out` is gradInput).
  CallTensors tensors;
  ASSIGN_OR_RETURN(tensors.grad, MakeTensor(cann, *call.grad_output, tensors_));
  ASSIGN_OR_RETURN(tensors.self, MakeTensor(cann, *call.self, tensors_));
  ASSIGN_OR_RETURN(tensors.out, MakeTensor(cann, *call.out, tensors_));
  const ScalarArgs args{[&](void* value, aclDataType dtype, aclScalar** out) {
    return MakeScalar(cann, value, dtype, out, scalars_);
  }};
  uint64_t needed = 0;
  aclOpExecutor* executor = nullptr;
  ASSIGN_OR_RETURN(const aclnnStatus status,
                   GetWorkspaceSize(api.ops[static_cast<int>(call.op)], call,
                                    args, tensors, &needed, &executor));
  const std::string plan_call = absl::StrCat(name, "GetWorkspaceSize");
  if (status != ACLNN_SUCCESS) return AclnnFailure(cann, plan_call, status);
  if (executor == nullptr) {
    return kernels::AclnnError(
        kernels::kAclnnErrInnerNullptr, absl::StatusCode::kInternal,
        absl::StrCat(plan_call, " returned no executor"));
  }
  // Repeatable, so that it is ours to destroy whether it is launched once,
  // many times or never (a single-use executor is released by CANN only
  // when it runs), and so that every launch of a repeatable opserver
  // executor reuses it.
  if (aclnnStatus s = api.aclSetAclOpExecutorRepeatable(executor);
      s != ACLNN_SUCCESS) {
    return AclnnFailure(cann, "aclSetAclOpExecutorRepeatable", s);
  }
  executor_ = executor;
  aclnn_workspace_size_ = needed;
  return absl::OkStatus();
}

}  // namespace opserver::ascend
