// HardswishBackward: out = gradOutput * hardswish'(self). Its registry
// entry, checks, element formula and kernels (see kernels/op_spec.h). The
// shape of a parameterless operator: copy this file to add one.
#ifndef OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_H_

#include "absl/strings/str_cat.h"
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
    return CheckOutShape(*call.out, n.o, *out_shape,
                         absl::StrCat(n.g, " shape"));
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_H_

// ---- vector form, once per SIMD target (see elementwise_simd.cc) ----------
#if defined(OPSERVER_SIMD_PASS) &&                            \
    defined(OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_SIMD_) == \
        defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_SIMD_
#undef OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_SIMD_
#else
#define OPSERVER_KERNELS_OPS_HARDSWISH_BACKWARD_SIMD_
#endif
#include "kernels/simd_loops-inl.h"
HWY_BEFORE_NAMESPACE();
namespace opserver::kernels::HWY_NAMESPACE {

// The vector form beside the scalar one (used for head and tail elements).
template <class CT>
struct HardswishVec : HardswishFormula<CT> {
  using HardswishFormula<CT>::HardswishFormula;
  using HardswishFormula<CT>::operator();
  // The result is always g * deriv (see ArithmeticNaNs).
  static constexpr bool kArithmeticNaNs = true;
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    const V three = hn::Set(d, 3.0f);
    // A subnormal x makes the divide take a microcode assist (~100 cycles
    // on x86), which made bf16 (where random bits are often subnormal)
    // compute-bound at a fifth of memory speed. Below 2^-60, x/3 + 0.5 is
    // exactly 0.5 (|x/3| < 2^-61 is under half an ulp of 0.5), which is also
    // 0/3 + 0.5: zeroing such x first changes no result bit.
    x = hn::IfThenZeroElse(hn::Lt(hn::Abs(x), hn::Set(d, 0x1p-60f)), x);
#if HWY_NATIVE_FMA
    // x / 3 without the divide, which bounds this kernel below memory speed
    // on some CPUs: q = x * (1/3) is corrected by one fused step with its
    // residual x - 3q. For every float with |x| <= 3 (the only ones whose
    // quotient is used; checked exhaustively, all 2,155,872,258 of them) the
    // result is bit for bit the correctly rounded x / 3. Needs a real FMA:
    // two roundings would break it, so targets without one divide.
    const V third = hn::Set(d, 1.0f / 3.0f);
    const V q = hn::Mul(x, third);
    const V quotient = hn::MulAdd(hn::NegMulAdd(q, three, x), third, q);
#else
    const V quotient = hn::Div(x, three);
#endif
    const V mid = hn::Add(quotient, hn::Set(d, 0.5f));
    V deriv = hn::IfThenElse(hn::Le(x, three), mid, hn::Set(d, 1.0f));
    deriv = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -3.0f)), deriv);
    return hn::Mul(g, deriv);
  }
};
struct HardswishBackwardSimd : BinarySimd<HardswishVec> {};

}  // namespace opserver::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // OPSERVER_SIMD_PASS
