#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// Tuning (measured on the 2-core Zen 5 machine, see BENCHMARKS.md):
// below kMinParallelElements a thread hand-off costs more than it saves;
// tasks are at least kMinTaskElements and a multiple of kTaskAlign elements
// (whole SIMD vectors and whole mask bytes); outputs of at least
// kStreamMinBytes bypass the caches with non-temporal stores.
constexpr int64_t kMinParallelElements = 64 * 1024;
constexpr int64_t kMinTaskElements = 32 * 1024;
constexpr int64_t kTaskAlign = 1024;
constexpr int64_t kTasksPerThread = 4;
constexpr int64_t kStreamMinBytes = 4 * 1024 * 1024;

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

// Byte strides of `t` broadcast to `shape` (stride 0 on stretched dims).
std::vector<int64_t> BroadcastByteStrides(const TensorView& t,
                                          const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 0);
  const std::vector<int64_t> eff = EffectiveStrides(t);
  const size_t lead = shape.size() - t.shape.size();
  const int64_t esize = DTypeSize(t.dtype);
  for (size_t k = 0; k < t.shape.size(); ++k) {
    if (t.shape[k] != 1) strides[lead + k] = eff[k] * esize;
  }
  return strides;
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
             {{"threshold", "float", {}}},
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
             {{"lambd", "float", {}}},
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
             {{"negativeSlope", "scalar", kSlopeDTypes},
              {"selfIsResult", "bool", {}}},
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
                     {{"scale", "double", {}}},
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

absl::StatusOr<Plan> PrepareOp(const OpCall& call) {
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
  Plan plan;
  if (absl::Status st = Entries()[op_index].check(info, call, &plan.out_shape_,
                                                  &plan.params_);
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
  const TensorView& g = *call.grad_output;
  const TensorView& s = *call.self;
  const TensorView& o = *call.out;
  const bool dropout = call.op == OpKind::kDropoutBackward;
  plan.kernel_ = FindKernel(call.op, g.dtype, s.dtype, o.dtype);
  if (plan.kernel_ == nullptr) {
    return AclnnError(
        kAclnnErrInner, absl::StatusCode::kInternal,
        absl::StrCat("no kernel for ", info.name, " with ", DTypeName(g.dtype),
                     ", ", DTypeName(s.dtype), ", ", DTypeName(o.dtype)));
  }
  plan.call_ = call;
  plan.numel_ = NumElements(plan.out_shape_);
  if (plan.numel_ == 0) return plan;

  // Iteration space: out's shape; inputs broadcast into it. The dropout
  // mask is addressed by linear element index, not by strides.
  const std::vector<int64_t>& shape = plan.out_shape_;
  const std::vector<int64_t> gs = BroadcastByteStrides(g, shape);
  const std::vector<int64_t> ss = dropout
                                      ? std::vector<int64_t>(shape.size(), 0)
                                      : BroadcastByteStrides(s, shape);
  const std::vector<int64_t> os = BroadcastByteStrides(o, shape);
  int nd = 0;
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1) continue;
    if (nd > 0) {
      // Merge into the previous dim when that is one step of this one in
      // every operand. Preserves the row-major element order (and so the
      // dropout bit index).
      const int j = nd - 1;
      if (plan.g_strides_[j] == gs[k] * shape[k] &&
          plan.s_strides_[j] == ss[k] * shape[k] &&
          plan.o_strides_[j] == os[k] * shape[k]) {
        plan.dims_[j] *= shape[k];
        plan.g_strides_[j] = gs[k];
        plan.s_strides_[j] = ss[k];
        plan.o_strides_[j] = os[k];
        continue;
      }
    }
    plan.dims_[nd] = shape[k];
    plan.g_strides_[nd] = gs[k];
    plan.s_strides_[nd] = ss[k];
    plan.o_strides_[nd] = os[k];
    ++nd;
  }
  const int64_t g_size = DTypeSize(g.dtype);
  const int64_t s_size = DTypeSize(s.dtype);
  const int64_t o_size = DTypeSize(o.dtype);
  if (nd == 0) {  // One element.
    plan.dims_[0] = 1;
    plan.g_strides_[0] = g_size;
    plan.s_strides_[0] = dropout ? 0 : s_size;
    plan.o_strides_[0] = o_size;
    nd = 1;
  }
  plan.ndim_ = nd;
  const int in = nd - 1;
  plan.unit_inner_ = plan.kernel_->contig != nullptr &&
                     plan.g_strides_[in] == g_size &&
                     plan.o_strides_[in] == o_size &&
                     (dropout || plan.s_strides_[in] == s_size);
  // numel * o_size cannot overflow: `out` does not overlap itself, so its
  // numel elements lie inside an extent CheckTensor found to fit int64.
  plan.stream_ = plan.unit_inner_ && plan.numel_ * o_size >= kStreamMinBytes;
  plan.g_base_ = static_cast<const char*>(g.data) + g.offset * g_size;
  plan.s_base_ = static_cast<const char*>(s.data) + s.offset * s_size;
  plan.o_base_ = static_cast<char*>(o.data) + o.offset * o_size;
  if (dropout && !IsContiguous(s)) {
    plan.gather_mask_ = true;
    plan.workspace_size_ = static_cast<uint64_t>(NumElements(s));
  }
  return plan;
}

void Plan::RunRange(const char* s_base, int64_t begin, int64_t end,
                    bool stream) const {
  const int nd = ndim_;
  const int in = nd - 1;
  const int64_t inner = dims_[in];
  int64_t idx[kMaxRank];
  int64_t j = begin % inner;
  int64_t rest = begin / inner;
  const char* g = g_base_ + j * g_strides_[in];
  const char* s = s_base + j * s_strides_[in];
  char* o = o_base_ + j * o_strides_[in];
  for (int k = in - 1; k >= 0; --k) {
    idx[k] = rest % dims_[k];
    rest /= dims_[k];
    g += idx[k] * g_strides_[k];
    s += idx[k] * s_strides_[k];
    o += idx[k] * o_strides_[k];
  }
  const Kernel& kernel = *kernel_;
  int64_t pos = begin;
  while (pos < end) {
    const int64_t n = std::min(inner - j, end - pos);
    if (unit_inner_) {
      kernel.contig(params_, g, s, o, n, pos, stream);
    } else {
      kernel.strided(params_, g, g_strides_[in], s, s_strides_[in], o,
                     o_strides_[in], n, pos);
    }
    pos += n;
    if (pos >= end) break;
    // Back to the row start, then one step of the outer odometer.
    g -= j * g_strides_[in];
    s -= j * s_strides_[in];
    o -= j * o_strides_[in];
    j = 0;
    for (int k = in - 1; k >= 0; --k) {
      g += g_strides_[k];
      s += s_strides_[k];
      o += o_strides_[k];
      if (++idx[k] < dims_[k]) break;
      g -= g_strides_[k] * dims_[k];
      s -= s_strides_[k] * dims_[k];
      o -= o_strides_[k] * dims_[k];
      idx[k] = 0;
    }
  }
}

namespace {

// Copies the bytes of a strided UINT8 view into `dst` in row-major order.
void GatherBytes(const TensorView& t, uint8_t* dst) {
  const std::vector<int64_t> strides = EffectiveStrides(t);
  const uint8_t* base = static_cast<const uint8_t*>(t.data) + t.offset;
  const int rank = static_cast<int>(t.shape.size());
  if (rank == 0) {
    dst[0] = base[0];
    return;
  }
  int64_t idx[kMaxRank] = {0};
  const int64_t inner = t.shape[rank - 1];
  const int64_t inner_stride = strides[rank - 1];
  const int64_t rows = NumElements(t) / inner;
  const uint8_t* row = base;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < inner; ++j) *dst++ = row[j * inner_stride];
    for (int k = rank - 2; k >= 0; --k) {
      row += strides[k];
      if (++idx[k] < t.shape[k]) break;
      row -= strides[k] * t.shape[k];
      idx[k] = 0;
    }
  }
}

}  // namespace

absl::Status RunPlan(const Plan& plan, void* workspace, uint64_t workspace_size,
                     ThreadPool* pool) {
  if (workspace_size < plan.workspace_size_) {
    return ParamInvalid(
        absl::StrCat("workspaceSize ", workspace_size, " is smaller than the ",
                     plan.workspace_size_, " bytes the plan needs"));
  }
  if (plan.workspace_size_ > 0 && workspace == nullptr) {
    return ParamNullptr(absl::StrCat("workspace is null but the plan needs ",
                                     plan.workspace_size_, " bytes"));
  }
  if (plan.numel_ == 0) return absl::OkStatus();
  const char* s_base = plan.s_base_;
  if (plan.gather_mask_) {
    GatherBytes(*plan.call_.self, static_cast<uint8_t*>(workspace));
    s_base = static_cast<const char*>(workspace);
  }
  const int64_t numel = plan.numel_;
  const int threads = pool == nullptr ? 1 : pool->num_threads();
  if (threads <= 1 || numel < kMinParallelElements) {
    plan.RunRange(s_base, 0, numel, plan.stream_);
    return absl::OkStatus();
  }
  int64_t tasks =
      std::min<int64_t>(threads * kTasksPerThread, numel / kMinTaskElements);
  tasks = std::max<int64_t>(tasks, 1);
  int64_t chunk = (numel + tasks - 1) / tasks;
  chunk = (chunk + kTaskAlign - 1) / kTaskAlign * kTaskAlign;
  tasks = (numel + chunk - 1) / chunk;
  pool->ParallelFor(tasks, [&](int64_t t) {
    const int64_t begin = t * chunk;
    plan.RunRange(s_base, begin, std::min(numel, begin + chunk), plan.stream_);
  });
  return absl::OkStatus();
}

}  // namespace opserver::kernels
