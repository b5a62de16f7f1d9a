// HardswishBackward's vector form (kernels/ops/hardswish_backward.h holds the
// rest of its definition and its scalar formula, which this computes
// lane-wise), once per SIMD target: elementwise_simd.cc includes it through
// all-inl.h as Highway compiles that file for each instruction set.

// Per-target include guard (Highway's -inl.h idiom).
#include "kernels/ops/hardswish_backward.h"
#if defined(OPSERVER_DEVICES_CPU_SIMD_HARDSWISH_BACKWARD_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_DEVICES_CPU_SIMD_HARDSWISH_BACKWARD_INL_H_
#undef OPSERVER_DEVICES_CPU_SIMD_HARDSWISH_BACKWARD_INL_H_
#else
#define OPSERVER_DEVICES_CPU_SIMD_HARDSWISH_BACKWARD_INL_H_
#endif
#include "devices/cpu/simd_loops-inl.h"
HWY_BEFORE_NAMESPACE();
namespace opserver::cpu::HWY_NAMESPACE {

// The vector form beside the scalar one (used for head and tail elements).
template <class CT>
struct HardswishVec : kernels::HardswishFormula<CT> {
  using kernels::HardswishFormula<CT>::HardswishFormula;
  using kernels::HardswishFormula<CT>::operator();
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

}  // namespace opserver::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // OPSERVER_DEVICES_CPU_SIMD_HARDSWISH_BACKWARD_INL_H_
