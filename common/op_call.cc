#include "common/op_call.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace opserver {
namespace {

using kernels::DType;
using kernels::OpInfo;

}  // namespace

absl::Status PlaceTensor(const OpInfo& op, const std::string& name,
                         kernels::TensorView view, kernels::OpCall* call) {
  for (size_t i = 0; i < op.tensors.size(); ++i) {
    if (op.tensors[i].name != name) continue;
    std::optional<kernels::TensorView>* slots[] = {&call->grad_output,
                                                   &call->self, &call->out};
    *slots[i] = std::move(view);
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const auto& arg : op.tensors) names.emplace_back(arg.name);
  return kernels::ParamInvalid(
      absl::StrCat(op.name, " has no tensor argument '", name,
                   "'; its arguments are ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<kernels::DType> ToDType(int32_t value, absl::string_view what) {
  if (!kernels::IsKnownDType(value)) {
    return kernels::ParamInvalid(
        absl::StrCat(what, " has dtype ", value, ", not an aclDataType"));
  }
  return static_cast<DType>(value);
}

absl::StatusOr<const OpInfo*> FindOperator(const std::string& name) {
  const OpInfo* info = kernels::FindOp(name);
  if (info != nullptr) return info;
  std::vector<std::string> names;
  for (const OpInfo& op : kernels::OpRegistry()) {
    names.emplace_back(op.name);
  }
  return kernels::ParamInvalid(absl::StrCat(
      "unknown operator '", name, "'; known: ", absl::StrJoin(names, ", ")));
}

absl::Status SetParams(const OpInfo& op, const v1::OpParams& in,
                       kernels::OpParams* out) {
  out->threshold = in.threshold();
  out->lambd = in.lambd();
  out->self_is_result = in.self_is_result();
  out->scale = in.scale();
  // A parameter left out takes the default ListOperators advertises
  // (threshold and selfIsResult advertise proto3's own zero, so only the
  // fields with presence need it).
  v1::ScalarValue slope = in.negative_slope();
  bool has_slope = in.has_negative_slope();
  for (const kernels::ScalarArgInfo& arg : op.scalars) {
    if (!arg.default_value.has_value()) continue;
    const double value = *arg.default_value;
    if (arg.name == "lambd" && !in.has_lambd()) out->lambd = value;
    if (arg.name == "scale" && !in.has_scale()) out->scale = value;
    if (arg.name == "negativeSlope" && !has_slope && !arg.dtypes.empty()) {
      slope.set_dtype(static_cast<v1::DataType>(arg.dtypes.front()));
      slope.set_value(value);
      has_slope = true;
    }
  }
  if (op.kind == kernels::OpKind::kLeakyReluBackward) {
    if (!has_slope) {
      return kernels::ParamNullptr(
          "negativeSlope is missing (params.negative_slope)");
    }
    ASSIGN_OR_RETURN(DType dtype, ToDType(slope.dtype(), "negativeSlope"));
    const double v = slope.value();
    if (kernels::IsFloating(dtype)) {
      out->negative_slope = kernels::Scalar::Float(v, dtype);
    } else if (dtype == DType::kBool) {
      out->negative_slope = kernels::Scalar::Bool(v != 0);
    } else {
      // Range first: casting NaN or 1e300 to int64 is undefined.
      if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0) ||
          v != std::trunc(v)) {
        return kernels::ParamInvalid(absl::StrCat(
            "negativeSlope has integer dtype ", kernels::DTypeName(dtype),
            " but value ", v, " is not an integer"));
      }
      out->negative_slope =
          kernels::Scalar::Int(static_cast<int64_t>(v), dtype);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const OpInfo*> BeginOpCall(const std::string& name,
                                          const v1::OpParams& params,
                                          kernels::OpCall* call) {
  ASSIGN_OR_RETURN(const OpInfo* op, FindOperator(name));
  call->op = op->kind;
  RETURN_IF_ERROR(SetParams(*op, params, &call->params));
  return op;
}

absl::StatusOr<kernels::OpCall> ToOpCall(
    const v1::GetWorkspaceSizeRequest& request, BufferLookup lookup) {
  kernels::OpCall call;
  ASSIGN_OR_RETURN(const OpInfo* op,
                   BeginOpCall(request.op(), request.params(), &call));
  // Names the operator does not have are refused first, the
  // alphabetically first one named; the tensors are then checked in
  // argument order. Never in the map's order, which differs between a
  // message built and the same message parsed, so the client and the
  // server would report different arguments for the same call.
  std::vector<std::string> unknown;
  for (const auto& [name, desc] : request.tensors()) {
    bool known = false;
    for (const auto& arg : op->tensors) known |= arg.name == name;
    if (!known) unknown.push_back(name);
  }
  if (!unknown.empty()) {
    std::sort(unknown.begin(), unknown.end());
    // Refuses it, naming the operator's arguments.
    return PlaceTensor(*op, unknown.front(), kernels::TensorView(), &call);
  }
  for (const auto& arg : op->tensors) {
    const std::string name(arg.name);
    auto found = request.tensors().find(name);
    if (found == request.tensors().end()) continue;  // Validate: 161001.
    const v1::TensorDesc& desc = found->second;
    absl::StatusOr<DeviceBytes> buffer = lookup(desc.buffer());
    if (!buffer.ok()) {
      return kernels::AclnnError(
          kernels::kAclnnErrParamInvalid, absl::StatusCode::kNotFound,
          absl::StrCat(name, ": ", buffer.status().message()));
    }
    ASSIGN_OR_RETURN(DType dtype, ToDType(desc.dtype(), name));
    if (desc.buffer_offset() > buffer->size) {
      return kernels::ParamInvalid(
          absl::StrCat(name, " starts at byte ", desc.buffer_offset(),
                       " of a buffer of ", buffer->size, " bytes"));
    }
    kernels::TensorView view;
    view.dtype = dtype;
    view.shape.assign(desc.shape().begin(), desc.shape().end());
    view.strides.assign(desc.strides().begin(), desc.strides().end());
    view.offset = desc.offset();
    view.storage_shape.assign(desc.storage_shape().begin(),
                              desc.storage_shape().end());
    view.data = static_cast<char*>(buffer->data) + desc.buffer_offset();
    const uint64_t available = buffer->size - desc.buffer_offset();
    RETURN_IF_ERROR(kernels::CheckTensorBounds(
        view, static_cast<int64_t>(std::min<uint64_t>(available, INT64_MAX)),
        name));
    RETURN_IF_ERROR(PlaceTensor(*op, name, std::move(view), &call));
  }
  return call;
}

void SetOpParamField(const google::protobuf::FieldDescriptor& field,
                     double value, kernels::DType dtype,
                     v1::OpParams* params) {
  const google::protobuf::Reflection& r = *params->GetReflection();
  switch (field.cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
      r.SetBool(params, &field, value != 0);
      return;
    case google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE: {
      auto* scalar =
          static_cast<v1::ScalarValue*>(r.MutableMessage(params, &field));
      scalar->set_dtype(static_cast<v1::DataType>(dtype));
      scalar->set_value(value);
      return;
    }
    default:
      r.SetDouble(params, &field, value);
  }
}

}  // namespace opserver
