#include "kernels/validate.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/aclnn_status.h"

namespace opserver::kernels {
namespace {

constexpr DType kF = DType::kFloat;
constexpr DType kH = DType::kFloat16;
constexpr DType kB = DType::kBFloat16;
constexpr DType kD = DType::kDouble;

const std::vector<DType> kThresholdDTypes = {
    kF, kH, kB, DType::kInt32, DType::kInt8, DType::kUint8};
const std::vector<DType> kHalfFloatDTypes = {kF, kH, kB};
const std::vector<DType> kFloatDTypes = {kF, kH, kB, kD};
const std::vector<DType> kSlopeDTypes = {kF,
                                         kH,
                                         kB,
                                         kD,
                                         DType::kInt32,
                                         DType::kInt64,
                                         DType::kInt16,
                                         DType::kInt8,
                                         DType::kUint8,
                                         DType::kBool};

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string DTypeList(const std::vector<DType>& dtypes) {
  return absl::StrJoin(dtypes, ", ", [](std::string* out, DType d) {
    absl::StrAppend(out, DTypeName(d));
  });
}

bool Contains(const std::vector<DType>& v, DType d) {
  return std::find(v.begin(), v.end(), d) != v.end();
}

DType Promote(DType a, DType b) {
  if (a == b) return a;
  if (a == kD || b == kD) return kD;
  return kF;
}

absl::Status CheckDType(const OpInfo& info, const TensorView& t,
                        absl::string_view name,
                        const std::vector<DType>& allowed) {
  if (Contains(allowed, t.dtype)) return absl::OkStatus();
  return ParamInvalid(absl::StrCat(name, " has dtype ", DTypeName(t.dtype),
                                   "; ", info.name, " supports ",
                                   DTypeList(allowed)));
}

absl::Status CheckSameDType(const TensorView& t, absl::string_view name,
                            const TensorView& ref, absl::string_view ref_name) {
  if (t.dtype == ref.dtype) return absl::OkStatus();
  return ParamInvalid(absl::StrCat(name, " has dtype ", DTypeName(t.dtype),
                                   " but ", ref_name, " has ",
                                   DTypeName(ref.dtype), "; they must match"));
}

// Structure, storage extent and data pointer of one tensor argument.
absl::Status CheckTensor(const TensorView& t, absl::string_view name) {
  int64_t max_element = -1;
  if (absl::Status s = CheckTensorLayout(t, name, &max_element); !s.ok()) {
    return s;
  }
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

absl::Status Broadcast(const TensorView& a, absl::string_view a_name,
                       const TensorView& b, absl::string_view b_name,
                       std::vector<int64_t>* out) {
  const size_t rank = std::max(a.shape.size(), b.shape.size());
  out->assign(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t da =
        k < rank - a.shape.size() ? 1 : a.shape[k - (rank - a.shape.size())];
    const int64_t db =
        k < rank - b.shape.size() ? 1 : b.shape[k - (rank - b.shape.size())];
    if (da != db && da != 1 && db != 1) {
      return ParamInvalid(absl::StrCat(
          a_name, " shape ", ShapeStr(a.shape), " and ", b_name, " shape ",
          ShapeStr(b.shape), " cannot be broadcast (dimension ", k, ": ", da,
          " vs ", db, ")"));
    }
    (*out)[k] = da == 1 ? db : da;
  }
  return absl::OkStatus();
}

absl::Status CheckOutShape(const TensorView& out, absl::string_view out_name,
                           const std::vector<int64_t>& expected,
                           absl::string_view what) {
  if (out.shape == expected) return absl::OkStatus();
  return ParamInvalid(absl::StrCat(out_name, " shape ", ShapeStr(out.shape),
                                   " must equal ", what, " ",
                                   ShapeStr(expected)));
}

// ---- Each operator's own checks ----------------------------------------
// Run after every tensor passed CheckTensor: the op-specific dtype, shape
// and scalar rules, in the order the exact aclnn status depends on. Each
// fills the output shape and the kernel's params. Reached through the
// operator's registry entry (kEntries), never a switch.

using CheckFn = absl::Status (*)(const OpInfo& info, const OpCall& call,
                                 std::vector<int64_t>* out_shape,
                                 KernelParams* kp);

// The argument names, in the registry's order.
struct Names {
  explicit Names(const OpInfo& info)
      : g(info.tensors[0].name),
        s(info.tensors[1].name),
        o(info.tensors[2].name) {}
  absl::string_view g, s, o;
};

// gradOutput in the operator's dtypes, self and out the same dtype.
absl::Status CheckOneDType(const OpInfo& info, const OpCall& call) {
  const Names n(info);
  const TensorView& g = *call.grad_output;
  absl::Status st = CheckDType(info, g, n.g, info.tensors[0].dtypes);
  if (st.ok()) st = CheckSameDType(*call.self, n.s, g, n.g);
  if (st.ok()) st = CheckSameDType(*call.out, n.o, g, n.g);
  return st;
}

// out's shape is gradOutput's and self's broadcast shape.
absl::Status CheckBroadcastOut(const OpInfo& info, const OpCall& call,
                               std::vector<int64_t>* out_shape) {
  const Names n(info);
  absl::Status st =
      Broadcast(*call.grad_output, n.g, *call.self, n.s, out_shape);
  if (!st.ok()) return st;
  return CheckOutShape(
      *call.out, n.o, *out_shape,
      absl::StrCat("the broadcast shape of ", n.g, " and ", n.s));
}

absl::Status CheckThreshold(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
  if (absl::Status st = CheckOneDType(info, call); !st.ok()) return st;
  kp->threshold = static_cast<float>(call.params.threshold);
  kp->threshold_d = kp->threshold;
  return CheckBroadcastOut(info, call, out_shape);
}

absl::Status CheckHardswish(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams*) {
  if (absl::Status st = CheckOneDType(info, call); !st.ok()) return st;
  const Names n(info);
  const TensorView& g = *call.grad_output;
  const TensorView& s = *call.self;
  if (s.shape != g.shape) {
    return ParamInvalid(absl::StrCat(
        n.s, " shape ", ShapeStr(s.shape), " must equal ", n.g, " shape ",
        ShapeStr(g.shape), "; ", info.name, " does not broadcast"));
  }
  *out_shape = g.shape;
  return CheckOutShape(*call.out, n.o, *out_shape, absl::StrCat(n.g, " shape"));
}

absl::Status CheckSoftshrink(const OpInfo& info, const OpCall& call,
                             std::vector<int64_t>* out_shape,
                             KernelParams* kp) {
  const Names n(info);
  const TensorView& g = *call.grad_output;
  const TensorView& s = *call.self;
  const TensorView& o = *call.out;
  absl::Status st = CheckDType(info, g, n.g, kHalfFloatDTypes);
  if (st.ok()) st = CheckDType(info, s, n.s, kHalfFloatDTypes);
  if (!st.ok()) return st;
  const DType promoted = Promote(g.dtype, s.dtype);
  if (o.dtype != promoted) {
    return ParamInvalid(absl::StrCat(
        n.o, " has dtype ", DTypeName(o.dtype), " but the promoted dtype of ",
        n.g, " (", DTypeName(g.dtype), ") and ", n.s, " (", DTypeName(s.dtype),
        ") is ", DTypeName(promoted), "; they must match"));
  }
  const double lambd = call.params.lambd;
  if (std::isnan(lambd) || lambd < 0) {
    return ParamInvalid(absl::StrCat("lambd must be >= 0, got ", lambd));
  }
  kp->lambd = static_cast<float>(lambd);
  return CheckBroadcastOut(info, call, out_shape);
}

absl::Status CheckLeakyRelu(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
  const Names n(info);
  const TensorView& g = *call.grad_output;
  const TensorView& s = *call.self;
  const TensorView& o = *call.out;
  absl::Status st = CheckDType(info, g, n.g, kFloatDTypes);
  if (st.ok()) st = CheckDType(info, s, n.s, kFloatDTypes);
  if (!st.ok()) return st;
  if (!IsFloating(o.dtype)) {
    return ParamInvalid(absl::StrCat(
        n.o, " has dtype ", DTypeName(o.dtype), "; the promoted result (",
        DTypeName(Promote(g.dtype, s.dtype)), ") can only be cast to ",
        DTypeList(kFloatDTypes)));
  }
  const Scalar& slope = call.params.negative_slope;
  if (!Contains(kSlopeDTypes, slope.dtype)) {
    return ParamInvalid(absl::StrCat("negativeSlope has dtype ",
                                     DTypeName(slope.dtype), "; ", info.name,
                                     " supports ", DTypeList(kSlopeDTypes)));
  }
  const double v = slope.AsDouble();
  if (call.params.self_is_result && v < 0) {
    return ParamInvalid(absl::StrCat(
        "negativeSlope must be >= 0 when selfIsResult is true, got ", v));
  }
  kp->slope_d = v;
  kp->slope_f = static_cast<float>(v);
  return CheckBroadcastOut(info, call, out_shape);
}

absl::Status CheckDropout(const OpInfo& info, const OpCall& call,
                          std::vector<int64_t>* out_shape, KernelParams* kp) {
  const Names n(info);
  const TensorView& g = *call.grad_output;
  const TensorView& s = *call.self;
  const TensorView& o = *call.out;
  const double scale = call.params.scale;
  if (absl::Status st = CheckDType(info, g, n.g, kHalfFloatDTypes); !st.ok()) {
    return st;
  }
  if (s.dtype != DType::kUint8) {
    return ParamInvalid(absl::StrCat(n.s, " has dtype ", DTypeName(s.dtype),
                                     "; it must be UINT8"));
  }
  if (!IsFloating(o.dtype)) {
    return ParamInvalid(absl::StrCat(
        n.o, " has dtype ", DTypeName(o.dtype), "; ", n.g, " (",
        DTypeName(g.dtype), ") can only be cast to ", DTypeList(kFloatDTypes)));
  }
  if (std::isnan(scale) || (scale != 0 && scale < 1)) {
    return ParamInvalid(
        absl::StrCat("scale must be 0 or >= 1 (it is 1/(1-p)), got ", scale));
  }
  const int64_t numel = NumElements(g);
  // align(numel, 128) / 8 without overflowing for numel near 2^63.
  const int64_t need = numel / 128 * 16 + (numel % 128 != 0 ? 16 : 0);
  const int64_t have = NumElements(s);
  if (have != need) {
    return ParamInvalid(absl::StrCat(n.s, " has ", have, " elements; a ", n.g,
                                     " of ", numel, " elements needs align(",
                                     numel, ", 128) / 8 = ", need));
  }
  if (scale == 0) {
    kp->dropout_mode = DropoutMode::kZero;
  } else if (scale == 1) {
    kp->dropout_mode = DropoutMode::kCopy;
  } else {
    kp->dropout_mode = DropoutMode::kScale;
    kp->scale = static_cast<float>(scale);
  }
  *out_shape = g.shape;
  return CheckOutShape(o, n.o, *out_shape, absl::StrCat(n.g, " shape"));
}

// ---- The registry: one entry per operator, in OpKind order --------------

struct OpEntry {
  OpInfo info;
  CheckFn check;
};

std::vector<OpEntry> BuildEntries() {
  std::vector<OpEntry> ops;
  ops.push_back(OpEntry{
      OpInfo{OpKind::kThresholdBackward,
             "ThresholdBackward",
             "aclnnThresholdBackward",
             {{"gradOutput", false, kThresholdDTypes},
              {"self", false, kThresholdDTypes},
              {"out", true, kThresholdDTypes}},
             {{"threshold", "float", {}, 0.0}},  // 0: ReLU (PyTorch has none).
             "out = self > threshold ? gradOutput : 0 (NaN self passes); "
             "gradOutput, self, out same dtype; gradOutput/self broadcast"},
      &CheckThreshold});
  ops.push_back(OpEntry{
      OpInfo{OpKind::kSoftshrinkBackward,
             "SoftshrinkBackward",
             "aclnnSoftshrinkBackward",
             {{"gradOutput", false, kHalfFloatDTypes},
              {"self", false, kHalfFloatDTypes},
              {"gradInput", true, kHalfFloatDTypes}},
             {{"lambd", "float", {}, 0.5}},
             "gradInput = |self| > lambd ? gradOutput : 0 (NaN self passes); "
             "lambd >= 0; gradInput has the promoted dtype; broadcast"},
      &CheckSoftshrink});
  ops.push_back(OpEntry{
      OpInfo{
          OpKind::kHardswishBackward,
          "HardswishBackward",
          "aclnnHardswishBackward",
          {{"gradOutput", false, kHalfFloatDTypes},
           {"self", false, kHalfFloatDTypes},
           {"out", true, kHalfFloatDTypes}},
          {},
          "out = gradOutput * (self < -3 ? 0 : self <= 3 ? self/3 + 0.5 : 1); "
          "same dtype and shape, no broadcast"},
      &CheckHardswish});
  ops.push_back(OpEntry{
      OpInfo{OpKind::kLeakyReluBackward,
             "LeakyReluBackward",
             "aclnnLeakyReluBackward",
             {{"gradOutput", false, kFloatDTypes},
              {"self", false, kFloatDTypes},
              {"out", true, kFloatDTypes}},
             {{"negativeSlope", "scalar", kSlopeDTypes, 0.01},
              {"selfIsResult", "bool", {}, 0.0}},
             "out = self > 0 ? gradOutput : gradOutput * negativeSlope; dtypes "
             "promoted, cast to out; negativeSlope >= 0 if selfIsResult; "
             "broadcast"},
      &CheckLeakyRelu});
  ops.push_back(
      OpEntry{OpInfo{OpKind::kDropoutBackward,
                     "DropoutBackward",
                     "aclnnDropoutBackward",
                     {{"gradOutput", false, kHalfFloatDTypes},
                      {"mask", false, {DType::kUint8}},
                      {"out", true, kFloatDTypes}},
                     {{"scale", "double", {}, 2.0}},  // nn.Dropout: p = 0.5.
                     "out = bit i of mask (LSB first) ? gradOutput * scale : "
                     "0; mask holds "
                     "align(numel,128)/8 bytes; scale 0 or >= 1 (1 copies)"},
              &CheckDropout});
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
  if (absl::Status st = Entries()[op_index].check(info, call, &valid.out_shape,
                                                  &valid.params);
      !st.ok()) {
    return st;
  }
  // Every output element gets its own address. Besides ruling out racing
  // writes, this bounds the work of a launch by the bytes behind `out`
  // (inputs may still broadcast with stride 0).
  if (absl::Status st =
          CheckNoInternalOverlap(*call.out, info.tensors[2].name);
      !st.ok()) {
    return st;
  }
  valid.call = call;
  if (call.op == OpKind::kDropoutBackward && NumElements(valid.out_shape) > 0 &&
      !IsContiguous(*call.self)) {
    valid.workspace_size = static_cast<uint64_t>(NumElements(*call.self));
  }
  return valid;
}

}  // namespace opserver::kernels
