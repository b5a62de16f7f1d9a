// HardswishBackward: out = gradOutput * hardswish'(self). Its registry
// entry, checks, element formula and dtype combinations (see
// kernels/op_spec.h). The shape of a parameterless operator: copy this file
// to add one.
#ifndef OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_H_

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// g * (0 below -3, x/3 + 1/2 up to 3, 1 above; NaN x fails both
// comparisons and keeps the derivative 1).
template <class CT>
struct HardswishFormula {
  explicit HardswishFormula(const KernelParams&) {}
  float operator()(float g, float x) const {
    const float deriv = x < -3.0f ? 0.0f : (x <= 3.0f ? x / 3.0f + 0.5f : 1.0f);
    return g * deriv;
  }
};

struct HardswishBackward : OpDefinition<HardswishBackward> {
  static constexpr auto kKernels = SameDTypes(kHalfFloatSet);
  template <class CT>
  using Formula = HardswishFormula<CT>;

  static OpInfo Info() {
    return {
        OpKind::kHardswishBackward,
        "HardswishBackward",
        "aclnnHardswishBackward",
        {{"gradOutput", false, DTypeVector(kHalfFloatSet)},
         {"self", false, DTypeVector(kHalfFloatSet)},
         {"out", true, DTypeVector(kHalfFloatSet)}},
        {},
        "out = gradOutput * (self < -3 ? 0 : self <= 3 ? self/3 + 0.5 : 1); "
        "same dtype and shape, no broadcast"};
  }

  static absl::Status Check(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams*) {
    RETURN_IF_ERROR(CheckOneDType(info, call));
    const Names n(info);
    const TensorView& g = *call.grad_output;
    const TensorView& s = *call.self;
    if (s.shape != g.shape) {
      return ParamInvalid(absl::StrCat(
          n.s, " shape ", ShapeStr(s.shape), " must equal ", n.g, " shape ",
          ShapeStr(g.shape), "; ", info.name, " does not broadcast"));
    }
    *out_shape = g.shape;
    return CheckOutShape(*call.out, n.o, *out_shape,
                         absl::StrCat(n.g, " shape"));
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_H_
