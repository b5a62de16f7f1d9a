// LeakyReluBackward: out = self > 0 ? gradOutput : gradOutput *
// negativeSlope. Its registry entry, checks, element formula and dtype
// combinations (see kernels/op_spec.h).
#ifndef OPSERVER_KERNELS_OPS_LEAKY_RELU_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_LEAKY_RELU_BACKWARD_H_

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// Computed in CT (float, or double when an operand is DOUBLE).
template <class CT>
struct LeakyFormula {
  explicit LeakyFormula(const KernelParams& p)
      : slope(static_cast<CT>(std::is_same_v<CT, double> ? p.slope_d
                                                         : p.slope_f)) {}
  CT operator()(CT g, CT x) const { return x > 0 ? g : g * slope; }
  CT slope;
};

struct LeakyReluBackward : OpDefinition<LeakyReluBackward> {
  // Every gradOutput/self pair, the result cast to any floating out.
  static constexpr auto kKernels = AllDTypes(kFloatSet, kFloatSet, kFloatSet);
  static constexpr std::array<DType, 10> kSlopeDTypes = {kF,
                                                         kH,
                                                         kB,
                                                         kD,
                                                         DType::kInt32,
                                                         DType::kInt64,
                                                         DType::kInt16,
                                                         DType::kInt8,
                                                         DType::kUint8,
                                                         DType::kBool};
  template <class CT>
  using Formula = LeakyFormula<CT>;

  static OpInfo Info() {
    return {OpKind::kLeakyReluBackward,
            "LeakyReluBackward",
            "aclnnLeakyReluBackward",
            {{"gradOutput", false, DTypeVector(kFloatSet)},
             {"self", false, DTypeVector(kFloatSet)},
             {"out", true, DTypeVector(kFloatSet)}},
            {{"negativeSlope", "scalar", DTypeVector(kSlopeDTypes), 0.01},
             {"selfIsResult", "bool", {}, 0.0}},
            "out = self > 0 ? gradOutput : gradOutput * negativeSlope; dtypes "
            "promoted, cast to out; negativeSlope >= 0 if selfIsResult; "
            "broadcast"};
  }

  static absl::Status Check(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
    const Names n(info);
    const TensorView& g = *call.grad_output;
    const TensorView& s = *call.self;
    const TensorView& o = *call.out;
    RETURN_IF_ERROR(CheckInputDTypes(info, call));
    if (!IsFloating(o.dtype)) {
      return ParamInvalid(absl::StrCat(
          n.o, " has dtype ", DTypeName(o.dtype), "; the promoted result (",
          DTypeName(PromoteDType(g.dtype, s.dtype)), ") can only be cast to ",
          DTypeList(info.tensors[2].dtypes)));
    }
    const Scalar& slope = call.params.negative_slope;
    if (!Contains(info.scalars[0].dtypes, slope.dtype)) {
      return ParamInvalid(absl::StrCat(
          "negativeSlope has dtype ", DTypeName(slope.dtype), "; ", info.name,
          " supports ", DTypeList(info.scalars[0].dtypes)));
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
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_LEAKY_RELU_BACKWARD_H_
