#include "client/op_catalog.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/op_call.h"
#include "common/status_macros.h"
#include "google/protobuf/message.h"
#include "kernels/validate.h"

namespace opserver::remote {
namespace {

using google::protobuf::FieldDescriptor;
using kernels::DType;

// Bounds on what one entry may hold; real operators are far below them.
constexpr size_t kMaxName = 64;
constexpr int kMaxArgs = 32;

bool IsIdentifier(absl::string_view name) {
  if (name.empty() || name.size() > kMaxName) return false;
  if (absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::vector<DType>> ToDTypes(
    const google::protobuf::RepeatedField<int>& wire, absl::string_view what) {
  std::vector<DType> out;
  if (wire.size() > kMaxArgs * 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " lists ", wire.size(), " dtypes"));
  }
  for (int d : wire) {
    if (!kernels::IsKnownDType(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has unknown dtype ", d));
    }
    out.push_back(static_cast<DType>(d));
  }
  return out;
}

// Whether `field` can carry a parameter of `type`.
bool FieldFits(const FieldDescriptor& field, absl::string_view type) {
  if (field.is_repeated()) return false;
  if (type == "float" || type == "double") {
    return field.cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE;
  }
  if (type == "bool") return field.cpp_type() == FieldDescriptor::CPPTYPE_BOOL;
  if (type == "scalar") {
    return field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE &&
           field.message_type() == v1::ScalarValue::descriptor();
  }
  return false;
}

absl::StatusOr<OpSignature> ParseOp(const v1::OperatorInfo& info,
                                    const std::set<std::string>& reserved) {
  auto bad = [](auto&&... why) {
    return absl::InvalidArgumentError(absl::StrCat(why...));
  };
  OpSignature op;
  if (!IsIdentifier(info.name())) return bad("name is not an identifier");
  op.name = info.name();
  op.aclnn_name = info.aclnn_name();
  if (!op.aclnn_name.empty() && !IsIdentifier(op.aclnn_name)) {
    return bad("aclnn_name is not an identifier");
  }
  if (info.tensors_size() > kMaxArgs || info.params_size() > kMaxArgs) {
    return bad("too many arguments");
  }
  // Every flag the operator gives opctl, to refuse collisions.
  std::set<std::string> flags = reserved;
  auto claim = [&](const std::string& flag) {
    return flags.insert(flag).second;
  };
  bool have_output = false;
  for (const v1::TensorArgInfo& t : info.tensors()) {
    if (!IsIdentifier(t.name())) {
      return bad("a tensor name is not an identifier");
    }
    const bool is_output = t.role() == "output";
    if (!is_output && t.role() != "input") {
      return bad("tensor ", t.name(), " has role '",
                 absl::CHexEscape(t.role().substr(0, kMaxName)),
                 "', not input or output");
    }
    ASSIGN_OR_RETURN(std::vector<DType> dtypes,
                     ToDTypes(t.dtypes(), absl::StrCat("tensor ", t.name())));
    if (dtypes.empty()) return bad("tensor ", t.name(), " lists no dtype");
    if (!claim(t.name()) || !claim(t.name() + "_dtype") ||
        (!is_output && !claim(t.name() + "_shape"))) {
      return bad("tensor ", t.name(), " collides with another flag");
    }
    TensorSignature sig{t.name(), std::move(dtypes)};
    if (is_output) {
      if (have_output) return bad("more than one output");
      have_output = true;
      op.output = std::move(sig);
    } else {
      op.inputs.push_back(std::move(sig));
    }
  }
  if (op.inputs.empty()) return bad("no input tensor");
  if (!have_output) return bad("no output tensor");
  for (const v1::ParamInfo& p : info.params()) {
    if (!IsIdentifier(p.aclnn_name())) {
      return bad("a parameter name is not an identifier");
    }
    ParamSignature sig;
    sig.name = p.aclnn_name();
    sig.type = p.type();
    sig.field = v1::OpParams::descriptor()->FindFieldByName(p.name());
    if (sig.field == nullptr || !FieldFits(*sig.field, sig.type)) {
      return bad("parameter ", sig.name, " (field '",
                 absl::CHexEscape(p.name().substr(0, kMaxName)), "', type '",
                 absl::CHexEscape(p.type().substr(0, kMaxName)),
                 "') is not a parameter this client can send");
    }
    if (p.has_default_value()) {
      const double v = p.default_value();
      if (!std::isfinite(v) || (sig.type == "bool" && v != 0 && v != 1)) {
        return bad("parameter ", sig.name, " has default ", v);
      }
      sig.default_value = v;
    }
    if (sig.type == "scalar") {
      ASSIGN_OR_RETURN(
          std::vector<DType> dtypes,
          ToDTypes(p.dtypes(), absl::StrCat("parameter ", sig.name)));
      // A server from before ParamInfo.dtypes: FLOAT, what aclnn's samples
      // pass; the server still checks it.
      sig.dtypes = dtypes.empty() ? std::vector<DType>{DType::kFloat}
                                  : std::move(dtypes);
    }
    if (!claim(sig.name) ||
        (sig.type == "scalar" && !claim(sig.name + "_dtype"))) {
      return bad("parameter ", sig.name, " collides with another flag");
    }
    op.params.push_back(std::move(sig));
  }
  return op;
}

}  // namespace

const OpSignature* OpCatalog::Find(absl::string_view name) const {
  for (const OpSignature& op : ops) {
    if (absl::EqualsIgnoreCase(op.name, name) ||
        (!op.aclnn_name.empty() &&
         absl::EqualsIgnoreCase(op.aclnn_name, name))) {
      return &op;
    }
  }
  return nullptr;
}

std::string OpCatalog::Names() const {
  if (ops.empty()) return "none";
  return absl::StrJoin(ops, ", ", [](std::string* out, const OpSignature& op) {
    out->append(op.name);
  });
}

OpCatalog ParseCatalog(const v1::ListOperatorsResponse& response,
                       const std::vector<std::string>& reserved_flags) {
  const std::set<std::string> reserved(reserved_flags.begin(),
                                       reserved_flags.end());
  OpCatalog catalog;
  std::set<std::string> seen;
  for (int i = 0; i < response.operators_size(); ++i) {
    const v1::OperatorInfo& info = response.operators(i);
    absl::StatusOr<OpSignature> op = ParseOp(info, reserved);
    if (op.ok() && !seen.insert(absl::AsciiStrToLower(op->name)).second) {
      op = absl::InvalidArgumentError("listed twice");
    }
    if (!op.ok()) {
      catalog.rejected.push_back(
          absl::StrCat("operator ", i, " ('",
                       absl::CHexEscape(info.name().substr(0, kMaxName)),
                       "'): ", op.status().message()));
      continue;
    }
    catalog.ops.push_back(*std::move(op));
  }
  return catalog;
}

void SetParam(const ParamSignature& param, double value, DType dtype,
              v1::OpParams* params) {
  SetOpParamField(*param.field, value, dtype, params);
}

absl::StatusOr<std::vector<int64_t>> OutputShape(
    const OpSignature& op, const v1::OpParams& params,
    const std::map<std::string, ArgShape>& inputs, DType out_dtype) {
  std::vector<std::vector<int64_t>> candidates;
  std::optional<std::vector<int64_t>> all = std::vector<int64_t>{};
  for (const TensorSignature& t : op.inputs) {
    auto it = inputs.find(t.name);
    if (it == inputs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op.name, " needs input ", t.name));
    }
    if (all.has_value()) {
      all = kernels::BroadcastShapes(*all, it->second.shape);
    }
  }
  if (all.has_value()) candidates.push_back(*all);
  for (const TensorSignature& t : op.inputs) {
    const std::vector<int64_t>& shape = inputs.at(t.name).shape;
    if (std::find(candidates.begin(), candidates.end(), shape) ==
        candidates.end()) {
      candidates.push_back(shape);
    }
  }
  if (kernels::FindOp(op.name) == nullptr) return candidates.front();

  // Validate needs buffers; these stand-ins are big enough for any view and
  // never dereferenced.
  v1::GetWorkspaceSizeRequest request;
  request.set_op(op.name);
  *request.mutable_params() = params;
  uint64_t handle = 0;
  for (const TensorSignature& t : op.inputs) {
    v1::TensorDesc& desc = (*request.mutable_tensors())[t.name];
    desc.set_buffer(++handle);
    desc.set_dtype(static_cast<v1::DataType>(inputs.at(t.name).dtype));
    for (int64_t d : inputs.at(t.name).shape) desc.add_shape(d);
  }
  v1::TensorDesc& out = (*request.mutable_tensors())[op.output.name];
  out.set_buffer(++handle);
  out.set_dtype(static_cast<v1::DataType>(out_dtype));
  auto lookup = [](uint64_t) -> absl::StatusOr<DeviceBytes> {
    return DeviceBytes{reinterpret_cast<void*>(uintptr_t{1} << 44),
                       UINT64_MAX / 2};
  };
  absl::Status first;
  for (const std::vector<int64_t>& shape : candidates) {
    out.clear_shape();
    for (int64_t d : shape) out.add_shape(d);
    absl::StatusOr<kernels::OpCall> call = ToOpCall(request, lookup);
    absl::Status status = call.status();
    if (status.ok()) status = kernels::Validate(*call).status();
    if (status.ok()) return shape;
    if (first.ok()) first = status;
  }
  return first;
}

}  // namespace opserver::remote
