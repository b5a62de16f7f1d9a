// How the CPU runs each operator definition (kernels/ops/): which of its
// dtype combinations (kKernels) get a SIMD kernel for unit strides (its
// vector form, simd/), and the strided loop of each, computed with its
// scalar formula. OpLoops<Op> holds the defaults; an operator whose loop
// differs specializes it here. Internal to //devices/cpu: kernel_table.cc
// and elementwise_simd.cc build their tables from it.
#ifndef OPSERVER_DEVICES_CPU_OP_LOOPS_H_
#define OPSERVER_DEVICES_CPU_OP_LOOPS_H_

#include <cstdint>

#include "devices/cpu/element_io.h"
#include "devices/cpu/kernel_types.h"
#include "kernels/dtype.h"
#include "kernels/kernel_params.h"
#include "kernels/op_spec.h"
#include "kernels/ops/all.h"

namespace opserver::cpu {

// The strided loop of every binary operator whose formula F (the scalar
// form, called as f(gradOutput, self) in CT) is all it needs: out =
// F(gradOutput, self) rounded to the compute dtype PromoteDType(G, S) and
// stored as O. The SIMD kernels use the same F for their head and tail
// elements, so both paths give bit-identical results.
template <class F, class CT, kernels::DType G, kernels::DType S,
          kernels::DType O>
void BinaryStrided(const kernels::KernelParams& p, const char* g, int64_t gs,
                   const char* s, int64_t ss, char* o, int64_t os, int64_t n,
                   int64_t) {
  const F f(p);
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    StoreVia<kernels::PromoteDType(G, S), O>(
        o, f(Load<CT, G>(g), Load<CT, S>(s)));
  }
}

// Whether every operand of a dtype combination has the same dtype.
constexpr bool AllSame(kernels::DTypes d) { return d.g == d.s && d.s == d.o; }

// BinaryStrided over Op's scalar formula, computed in the combination's
// compute type.
template <class Op, kernels::DType G, kernels::DType S, kernels::DType O>
constexpr StridedFn FormulaStrided() {
  using CT = ComputeType<G, S>;
  return &BinaryStrided<typename Op::template Formula<CT>, CT, G, S, O>;
}

// The defaults for an operator Op.
template <class Op>
struct OpLoops {
  // Whether a combination of Op::kKernels has a SIMD kernel for unit
  // strides (Op##Simd::Contig<T>, T out's type).
  static constexpr bool Simd(kernels::DTypes d) { return AllSame(d); }
  // The strided kernel of a combination of Op::kKernels.
  template <kernels::DType G, kernels::DType S, kernels::DType O>
  static constexpr StridedFn Strided() {
    return FormulaStrided<Op, G, S, O>();
  }
};

// ---- DropoutBackward: a bit mask, not a second tensor --------------------

template <kernels::DType G, kernels::DType O>
void DropoutStrided(const kernels::KernelParams& p, const char* g, int64_t gs,
                    const char* s, int64_t, char* o, int64_t os, int64_t n,
                    int64_t bit0) {
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(s);
  const kernels::DropoutFormula f(p);
  for (int64_t i = 0; i < n; ++i, g += gs, o += os) {
    float r;
    switch (p.dropout_mode) {
      case kernels::DropoutMode::kZero:
        r = 0.0f;
        break;
      case kernels::DropoutMode::kCopy:
        r = Load<float, G>(g);
        break;
      default:
        r = f(Load<float, G>(g),
              MaskBit(bits, static_cast<uint64_t>(bit0 + i)));
    }
    StoreVia<G, O>(o, r);
  }
}

template <>
struct OpLoops<kernels::DropoutBackward> {
  // The mask is not a vector of out's type: SIMD wherever gradOutput and
  // out agree.
  static constexpr bool Simd(kernels::DTypes d) { return d.g == d.o; }
  template <kernels::DType G, kernels::DType S, kernels::DType O>
  static constexpr StridedFn Strided() {
    return &DropoutStrided<G, O>;
  }
};

// ---- ThresholdBackward: integer self compares in its own type ------------

template <kernels::DType DT>
void ThresholdIntStrided(const kernels::KernelParams& p, const char* g,
                         int64_t gs, const char* s, int64_t ss, char* o,
                         int64_t os, int64_t n, int64_t) {
  using T = typename St<DT>::Raw;
  const kernels::IntThresholdFormula<T> f(p);
  using Whole = typename kernels::IntThresholdFormula<T>::Whole;
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    T r = 0;
    if (f.whole == Whole::kAllPass) {
      r = Raw<DT>(g);
    } else if (f.whole == Whole::kNone) {
      r = f(Raw<DT>(g), Raw<DT>(s));
    }
    PutRaw<DT>(o, r);
  }
}

template <>
struct OpLoops<kernels::ThresholdBackward> {
  static constexpr bool Simd(kernels::DTypes d) { return AllSame(d); }
  // Float-like dtypes as any binary operator.
  template <kernels::DType G, kernels::DType S, kernels::DType O>
  static constexpr StridedFn Strided() {
    if constexpr (G == kernels::kF || G == kernels::kH || G == kernels::kB) {
      return FormulaStrided<kernels::ThresholdBackward, G, S, O>();
    } else {
      return &ThresholdIntStrided<G>;
    }
  }
};

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_OP_LOOPS_H_
