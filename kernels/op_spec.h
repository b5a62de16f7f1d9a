// The vocabulary an operator definition (kernels/ops/) is written in: its
// registry entry (OpInfo), the call its checks see (OpCall), the dtype
// combinations it runs, the shared argument checks with their exact aclnn
// statuses, and OpDefinition, the defaults an operator may replace.
// Device-neutral and SIMD-free: clients link it through validate.h.
#ifndef OPSERVER_KERNELS_OP_SPEC_H_
#define OPSERVER_KERNELS_OP_SPEC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/dtype.h"
#include "kernels/kernel_params.h"
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
  // The value a request that leaves the parameter out gets (the server
  // applies it, common/op_call.h; opctl run shows and uses it): PyTorch's
  // default where it has one. Bool: 0 or 1. Absent: the caller must give
  // one.
  std::optional<double> default_value;
};

struct OpInfo {
  OpKind kind;
  absl::string_view name;        // "ThresholdBackward"
  absl::string_view aclnn_name;  // "aclnnThresholdBackward"
  std::vector<TensorArgInfo> tensors;
  std::vector<ScalarArgInfo> scalars;
  absl::string_view description;  // One line of semantics.
  // The second input is a bit mask (bit i for output element i, LSB first),
  // addressed by element index rather than broadcast by strides
  // (DropoutBackward's mask).
  bool bit_mask_input = false;
};

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

// ---- dtype sets and combinations ----------------------------------------

inline constexpr DType kF = DType::kFloat;
inline constexpr DType kH = DType::kFloat16;
inline constexpr DType kB = DType::kBFloat16;
inline constexpr DType kD = DType::kDouble;
inline constexpr std::array<DType, 3> kHalfFloatSet = {kF, kH, kB};
inline constexpr std::array<DType, 4> kFloatSet = {kF, kH, kB, kD};

// A dtype combination an operator's kernels run: gradOutput, self (or the
// mask), out.
struct DTypes {
  DType g, s, o;
};

// Every (g, s, o) with all three the same dtype of `set`.
template <size_t N>
constexpr std::array<DTypes, N> SameDTypes(const std::array<DType, N>& set) {
  std::array<DTypes, N> r{};
  for (size_t i = 0; i < N; ++i) r[i] = {set[i], set[i], set[i]};
  return r;
}

// Every (g, s, PromoteDType(g, s)).
template <size_t A, size_t B>
constexpr std::array<DTypes, A * B> PromotedDTypes(
    const std::array<DType, A>& g, const std::array<DType, B>& s) {
  std::array<DTypes, A * B> r{};
  for (size_t i = 0; i < A; ++i) {
    for (size_t j = 0; j < B; ++j) {
      r[i * B + j] = {g[i], s[j], PromoteDType(g[i], s[j])};
    }
  }
  return r;
}

// Every (g, s, o) of the three sets.
template <size_t A, size_t B, size_t C>
constexpr std::array<DTypes, A * B * C> AllDTypes(
    const std::array<DType, A>& g, const std::array<DType, B>& s,
    const std::array<DType, C>& o) {
  std::array<DTypes, A * B * C> r{};
  for (size_t i = 0; i < A; ++i) {
    for (size_t j = 0; j < B; ++j) {
      for (size_t k = 0; k < C; ++k)
        r[(i * B + j) * C + k] = {g[i], s[j], o[k]};
    }
  }
  return r;
}

template <size_t N>
std::vector<DType> DTypeVector(const std::array<DType, N>& set) {
  return std::vector<DType>(set.begin(), set.end());
}

// ---- shared checks (exact aclnn statuses) --------------------------------

std::string ShapeStr(const std::vector<int64_t>& shape);
std::string DTypeList(const std::vector<DType>& dtypes);
bool Contains(const std::vector<DType>& v, DType d);

// 161002 unless `t` has one of `allowed`, naming the argument and the set.
absl::Status CheckDType(const OpInfo& info, const TensorView& t,
                        absl::string_view name,
                        const std::vector<DType>& allowed);
// 161002 unless `t` has `ref`'s dtype.
absl::Status CheckSameDType(const TensorView& t, absl::string_view name,
                            const TensorView& ref, absl::string_view ref_name);
// 161002 unless `out` has shape `expected` (described as `what`).
absl::Status CheckOutShape(const TensorView& out, absl::string_view out_name,
                           const std::vector<int64_t>& expected,
                           absl::string_view what);

// The broadcast shape of `a` and `b` (NumPy's rules: aligned right, a
// dimension of 1 stretches), or nullopt when they do not broadcast, with
// the first dimension (of the result's rank) that does not in `*mismatch`.
std::optional<std::vector<int64_t>> BroadcastShapes(
    const std::vector<int64_t>& a, const std::vector<int64_t>& b,
    size_t* mismatch = nullptr);

// The argument names of a binary operator, in the registry's order.
struct Names {
  explicit Names(const OpInfo& info)
      : g(info.tensors[0].name),
        s(info.tensors[1].name),
        o(info.tensors[2].name) {}
  absl::string_view g, s, o;
};

// gradOutput and self each in their registry dtypes (they may differ).
absl::Status CheckInputDTypes(const OpInfo& info, const OpCall& call);
// gradOutput in the operator's dtypes, self and out the same dtype.
absl::Status CheckOneDType(const OpInfo& info, const OpCall& call);
// out's shape is gradOutput's and self's broadcast shape, set in
// `out_shape`.
absl::Status CheckBroadcastOut(const OpInfo& info, const OpCall& call,
                               std::vector<int64_t>* out_shape);

// ---- an operator's definition --------------------------------------------

// The defaults of an operator definition. An operator `Op` in kernels/ops/
// derives from OpDefinition<Op> and provides
//
//   static OpInfo Info();       // its registry entry
//   // Its own checks, run after every tensor passed the generic ones (see
//   // Validate): dtype, shape and scalar rules in the order the exact
//   // aclnn status depends on; fills the output shape and the formulas'
//   // params.
//   static absl::Status Check(const OpInfo& info, const OpCall& call,
//                             std::vector<int64_t>* out_shape,
//                             KernelParams* params);
//   static constexpr std::array<DTypes, N> kKernels;  // what it runs
//   template <class CT> using Formula = ...;  // f(gradOutput, self) in CT
//
// and may replace what follows. How a device computes it lives in the
// device's folder (the CPU's strided loops: devices/cpu/op_loops.h; its
// vector forms: devices/cpu/simd/).
template <class Op>
struct OpDefinition {
  // Bytes of workspace a valid call needs.
  static uint64_t WorkspaceSize(const OpCall&,
                                const std::vector<int64_t>& /*out_shape*/) {
    return 0;
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OP_SPEC_H_
