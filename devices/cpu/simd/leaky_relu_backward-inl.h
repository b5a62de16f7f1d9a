// LeakyReluBackward's vector form (kernels/ops/leaky_relu_backward.h holds the
// rest of its definition and its scalar formula, which this computes
// lane-wise), once per SIMD target: elementwise_simd.cc includes it through
// all-inl.h as Highway compiles that file for each instruction set.

// Per-target include guard (Highway's -inl.h idiom).
#include "kernels/ops/leaky_relu_backward.h"
#if defined(OPSERVER_DEVICES_CPU_SIMD_LEAKY_RELU_BACKWARD_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_DEVICES_CPU_SIMD_LEAKY_RELU_BACKWARD_INL_H_
#undef OPSERVER_DEVICES_CPU_SIMD_LEAKY_RELU_BACKWARD_INL_H_
#else
#define OPSERVER_DEVICES_CPU_SIMD_LEAKY_RELU_BACKWARD_INL_H_
#endif
#include "devices/cpu/simd_loops-inl.h"
HWY_BEFORE_NAMESPACE();
namespace opserver::cpu::HWY_NAMESPACE {

template <class CT>
struct LeakyVec : kernels::LeakyFormula<CT> {
  using kernels::LeakyFormula<CT>::LeakyFormula;
  using kernels::LeakyFormula<CT>::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    return hn::IfThenElse(hn::Gt(x, hn::Zero(d)), g,
                          hn::Mul(g, hn::Set(d, this->slope)));
  }
};
struct LeakyReluBackwardSimd : BinarySimd<LeakyVec> {};

}  // namespace opserver::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // OPSERVER_DEVICES_CPU_SIMD_LEAKY_RELU_BACKWARD_INL_H_
