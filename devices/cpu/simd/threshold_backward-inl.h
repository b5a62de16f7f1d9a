// ThresholdBackward's vector form (kernels/ops/threshold_backward.h holds the
// rest of its definition and its scalar formula, which this computes
// lane-wise), once per SIMD target: elementwise_simd.cc includes it through
// all-inl.h as Highway compiles that file for each instruction set.

// Per-target include guard (Highway's -inl.h idiom).
#include "kernels/ops/threshold_backward.h"
#if defined(OPSERVER_DEVICES_CPU_SIMD_THRESHOLD_BACKWARD_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_DEVICES_CPU_SIMD_THRESHOLD_BACKWARD_INL_H_
#undef OPSERVER_DEVICES_CPU_SIMD_THRESHOLD_BACKWARD_INL_H_
#else
#define OPSERVER_DEVICES_CPU_SIMD_THRESHOLD_BACKWARD_INL_H_
#endif
#include "devices/cpu/simd_loops-inl.h"
HWY_BEFORE_NAMESPACE();
namespace opserver::cpu::HWY_NAMESPACE {

template <class CT>
struct ThresholdVec : kernels::ThresholdFormula<CT> {
  using kernels::ThresholdFormula<CT>::ThresholdFormula;
  using kernels::ThresholdFormula<CT>::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    return hn::IfThenZeroElse(hn::Le(x, hn::Set(d, this->t)), g);
  }
};

// Float-like dtypes as any binary operator; integer ones compare in their
// own type, or fill/copy when the threshold is out of their range.
struct ThresholdBackwardSimd {
  template <class TI>
  struct IntVec : kernels::IntThresholdFormula<TI> {
    using kernels::IntThresholdFormula<TI>::IntThresholdFormula;
    using kernels::IntThresholdFormula<TI>::operator();
    template <class D, class V>
    HWY_INLINE V operator()(D d, V g, V x) const {
      return hn::IfThenElseZero(hn::Gt(x, hn::Set(d, this->bound)), g);
    }
  };

  template <class T>
  static void Contig(const kernels::KernelParams& p, const void* g,
                     const void* s, void* o, int64_t n, int64_t, bool stream) {
    if constexpr (std::is_integral_v<T>) {
      const IntVec<T> op(p);
      const size_t bytes = static_cast<size_t>(n) * sizeof(T);
      using Whole = typename IntVec<T>::Whole;
      if (op.whole == Whole::kAllZero) {
        std::memset(o, 0, bytes);
        return;
      }
      if (op.whole == Whole::kAllPass) {
        if (o != g) std::memmove(o, g, bytes);
        return;
      }
      BinaryContig<IntVec<T>, T, T>(p, g, s, o, n, stream);
    } else {
      BinarySimd<ThresholdVec>::Contig<T>(p, g, s, o, n, 0, stream);
    }
  }
};

}  // namespace opserver::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // OPSERVER_DEVICES_CPU_SIMD_THRESHOLD_BACKWARD_INL_H_
