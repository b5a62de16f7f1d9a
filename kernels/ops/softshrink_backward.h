// SoftshrinkBackward: gradInput = |self| > lambd ? gradOutput : 0. Its
// registry entry, checks, element formula and dtype combinations (see
// kernels/op_spec.h).
#ifndef OPSERVER_KERNELS_OPS_SOFTSHRINK_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_SOFTSHRINK_BACKWARD_H_

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// The gradient passes where |self| > lambd (NaN self passes).
template <class CT>
struct SoftshrinkFormula {
  explicit SoftshrinkFormula(const KernelParams& p) : l(p.lambd) {}
  float operator()(float g, float x) const {
    return std::fabs(x) <= l ? 0.0f : g;
  }
  float l;
};

struct SoftshrinkBackward : OpDefinition<SoftshrinkBackward> {
  static constexpr auto kKernels = PromotedDTypes(kHalfFloatSet, kHalfFloatSet);
  template <class CT>
  using Formula = SoftshrinkFormula<CT>;

  static OpInfo Info() {
    return {OpKind::kSoftshrinkBackward,
            "SoftshrinkBackward",
            "aclnnSoftshrinkBackward",
            {{"gradOutput", false, DTypeVector(kHalfFloatSet)},
             {"self", false, DTypeVector(kHalfFloatSet)},
             {"gradInput", true, DTypeVector(kHalfFloatSet)}},
            {{"lambd", "float", {}, 0.5}},
            "gradInput = |self| > lambd ? gradOutput : 0 (NaN self passes); "
            "lambd >= 0; gradInput has the promoted dtype; broadcast"};
  }

  static absl::Status Check(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
    const Names n(info);
    const TensorView& g = *call.grad_output;
    const TensorView& s = *call.self;
    const TensorView& o = *call.out;
    RETURN_IF_ERROR(CheckInputDTypes(info, call));
    const DType promoted = PromoteDType(g.dtype, s.dtype);
    if (o.dtype != promoted) {
      return ParamInvalid(absl::StrCat(
          n.o, " has dtype ", DTypeName(o.dtype), " but the promoted dtype of ",
          n.g, " (", DTypeName(g.dtype), ") and ", n.s, " (",
          DTypeName(s.dtype), ") is ", DTypeName(promoted),
          "; they must match"));
    }
    const double lambd = call.params.lambd;
    if (std::isnan(lambd) || lambd < 0) {
      return ParamInvalid(absl::StrCat("lambd must be >= 0, got ", lambd));
    }
    kp->lambd = static_cast<float>(lambd);
    return CheckBroadcastOut(info, call, out_shape);
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_SOFTSHRINK_BACKWARD_H_
