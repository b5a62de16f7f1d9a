#include "kernels/validate.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/ops/all.h"

namespace opserver::kernels {
namespace {

// Structure, storage extent and data pointer of one tensor argument.
absl::Status CheckTensor(const TensorView& t, absl::string_view name) {
  int64_t max_element = -1;
  RETURN_IF_ERROR(CheckTensorLayout(t, name, &max_element));
  if (max_element < 0) return absl::OkStatus();  // Empty: nothing to touch.
  if (!t.storage_shape.empty()) {
    if (t.storage_shape.size() > static_cast<size_t>(kMaxRank)) {
      return ParamInvalid(
          absl::StrCat(name, " storage shape has ", t.storage_shape.size(),
                       " dimensions; at most ", kMaxRank, " are supported"));
    }
    int64_t storage = 1;
    for (int64_t d : t.storage_shape) {
      if (d < 0 || __builtin_mul_overflow(storage, d, &storage)) {
        return ParamInvalid(absl::StrCat(
            name, " storage shape ", ShapeStr(t.storage_shape), " is invalid"));
      }
    }
    if (max_element >= storage) {
      return ParamInvalid(absl::StrCat(
          name, " view (shape ", ShapeStr(t.shape), ", offset ", t.offset,
          ") reaches element ", max_element, " outside its storage shape ",
          ShapeStr(t.storage_shape)));
    }
  }
  if (t.data == nullptr) {
    return ParamNullptr(absl::StrCat(name, " has no data (null address)"));
  }
  return absl::OkStatus();
}

// ---- The registry: one entry per operator, in OpKind order --------------

using CheckFn = absl::Status (*)(const OpInfo& info, const OpCall& call,
                                 std::vector<int64_t>* out_shape,
                                 KernelParams* kp);
using WorkspaceFn = uint64_t (*)(const OpCall& call,
                                 const std::vector<int64_t>& out_shape);

struct OpEntry {
  OpInfo info;
  CheckFn check;
  WorkspaceFn workspace_size;
};

std::vector<OpEntry> BuildEntries() {
  std::vector<OpEntry> ops;
  // An entry naming another operator's kind is a programming error, caught
  // by every test at the first lookup.
#define OPSERVER_ENTRY(Name)                                                \
  ops.push_back(OpEntry{Name::Info(), &Name::Check, &Name::WorkspaceSize}); \
  if (ops.back().info.kind != OpKind::k##Name) std::abort();
  OPSERVER_OPS(OPSERVER_ENTRY)
#undef OPSERVER_ENTRY
  return ops;
}

const std::vector<OpEntry>& Entries() {
  static const std::vector<OpEntry>* const entries =
      new std::vector<OpEntry>(BuildEntries());
  return *entries;
}

}  // namespace

const std::vector<OpInfo>& OpRegistry() {
  static const std::vector<OpInfo>* const registry = [] {
    auto* infos = new std::vector<OpInfo>;
    for (const OpEntry& entry : Entries()) infos->push_back(entry.info);
    return infos;
  }();
  return *registry;
}

const OpInfo* FindOp(absl::string_view name) {
  for (const OpInfo& info : OpRegistry()) {
    if (info.name == name || info.aclnn_name == name) return &info;
  }
  return nullptr;
}

const OpInfo& GetOpInfo(OpKind kind) {
  return OpRegistry()[static_cast<size_t>(kind)];
}


absl::StatusOr<ValidCall> Validate(const OpCall& call) {
  const size_t op_index = static_cast<size_t>(call.op);
  if (op_index >= OpRegistry().size()) {
    return ParamInvalid(absl::StrCat("unknown operator kind ", op_index));
  }
  const OpInfo& info = OpRegistry()[op_index];
  const std::optional<TensorView>* args[3] = {&call.grad_output, &call.self,
                                              &call.out};
  for (int i = 0; i < 3; ++i) {
    if (!args[i]->has_value()) {
      return ParamNullptr(absl::StrCat(info.tensors[i].name, " is null; ",
                                       info.name, " requires it"));
    }
  }
  for (int i = 0; i < 3; ++i) {
    absl::Status st = CheckTensor(**args[i], info.tensors[i].name);
    if (!st.ok()) return st;
  }
  ValidCall valid;
  RETURN_IF_ERROR(
      Entries()[op_index].check(info, call, &valid.out_shape, &valid.params));
  // Every output element gets its own address. Besides ruling out racing
  // writes, this bounds the work of a launch by the bytes behind `out`
  // (inputs may still broadcast with stride 0).
  RETURN_IF_ERROR(CheckNoInternalOverlap(*call.out, info.tensors[2].name));
  valid.call = call;
  valid.workspace_size =
      Entries()[op_index].workspace_size(call, valid.out_shape);
  return valid;
}

}  // namespace opserver::kernels
