// Highway re-includes this file once per target instruction set.
#include "kernels/elementwise_simd.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/elementwise_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h must come first.
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/formulas.h"
#include "kernels/half.h"

HWY_BEFORE_NAMESPACE();
namespace opserver {
namespace kernels {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using F16 = hwy::float16_t;
using BF16 = hwy::bfloat16_t;

// F16C (AVX2 and up) converts binary16 in hardware with round-to-nearest-
// even; on older targets Highway emulates the demotion without that
// guarantee, so those targets convert lane by lane.
// (Highway compiles this file once per target: the macros are redefined.)
#undef OPSERVER_HW_F16
#undef OPSERVER_STREAM
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define OPSERVER_HW_F16 1
#else
#define OPSERVER_HW_F16 0
#endif

// Non-temporal stores need a full native vector; only the x86 targets with
// 256/512-bit vectors are worth it (and the only ones run here).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define OPSERVER_STREAM 1
#else
#define OPSERVER_STREAM 0
#endif

// The SIMD kernels, one line each: operator, dtype (every operand), the
// per-target function's name and what it runs. Drives the per-target
// definitions, their dynamic-dispatch exports and SimdContigKernel.
#ifndef OPSERVER_SIMD_KERNELS
#define OPSERVER_SIMD_KERNELS(X)                                      \
  X(ThresholdBackward, Float, ThresholdF32, ThresholdFloat<float>)    \
  X(ThresholdBackward, Float16, ThresholdF16, ThresholdFloat<F16>)    \
  X(ThresholdBackward, BFloat16, ThresholdBF16, ThresholdFloat<BF16>) \
  X(ThresholdBackward, Int32, ThresholdI32, ThresholdInt<int32_t>)    \
  X(ThresholdBackward, Int8, ThresholdI8, ThresholdInt<int8_t>)       \
  X(ThresholdBackward, Uint8, ThresholdU8, ThresholdInt<uint8_t>)     \
  X(SoftshrinkBackward, Float, SoftshrinkF32, Softshrink<float>)      \
  X(SoftshrinkBackward, Float16, SoftshrinkF16, Softshrink<F16>)      \
  X(SoftshrinkBackward, BFloat16, SoftshrinkBF16, Softshrink<BF16>)   \
  X(HardswishBackward, Float, HardswishF32, Hardswish<float>)         \
  X(HardswishBackward, Float16, HardswishF16, Hardswish<F16>)         \
  X(HardswishBackward, BFloat16, HardswishBF16, Hardswish<BF16>)      \
  X(LeakyReluBackward, Float, LeakyF32, Leaky<float>)                 \
  X(LeakyReluBackward, Float16, LeakyF16, Leaky<F16>)                 \
  X(LeakyReluBackward, BFloat16, LeakyBF16, Leaky<BF16>)              \
  X(LeakyReluBackward, Double, LeakyF64, Leaky<double>)               \
  X(DropoutBackward, Float, DropoutF32, Dropout<float>)               \
  X(DropoutBackward, Float16, DropoutF16, Dropout<F16>)               \
  X(DropoutBackward, BFloat16, DropoutBF16, Dropout<BF16>)
#endif

// ---------------------------------------------------------------- scalar IO

template <class CT, class T>
HWY_INLINE CT LoadS(const T* p) {
  if constexpr (std::is_same_v<T, F16>) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return HalfToFloat(b);
  } else if constexpr (std::is_same_v<T, BF16>) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return BFloat16ToFloat(b);
  } else {
    // Through memcpy: aclnn tensors may start at any byte address.
    T v;
    std::memcpy(&v, p, sizeof(T));
    return static_cast<CT>(v);
  }
}

template <class T, class CT>
HWY_INLINE void StoreS(CT v, T* p) {
  if constexpr (std::is_same_v<T, F16>) {
    const uint16_t b = FloatToHalf(v);
    std::memcpy(p, &b, 2);
  } else if constexpr (std::is_same_v<T, BF16>) {
    const uint16_t b = FloatToBFloat16(v);
    std::memcpy(p, &b, 2);
  } else {
    const T t = static_cast<T>(v);
    std::memcpy(p, &t, sizeof(T));
  }
}

// ---------------------------------------------------------------- vector IO

template <class D, class T>
HWY_INLINE hn::VFromD<D> LoadV(D d, const T* p) {
  if constexpr (std::is_same_v<T, hn::TFromD<D>>) {
    return hn::LoadU(d, p);
  } else {
    const hn::Rebind<T, D> dt;
    return hn::PromoteTo(d, hn::LoadU(dt, p));
  }
}

template <class D, class V>
HWY_INLINE void StoreBits16(D d16, V bits, uint16_t* p, bool stream) {
#if OPSERVER_STREAM
  if (stream) {
    hn::Stream(bits, d16, p);
    return;
  }
#else
  (void)stream;
#endif
  hn::StoreU(bits, d16, p);
}

template <class D, class T>
HWY_INLINE void StoreV(D d, hn::VFromD<D> v, T* p, bool stream) {
  if constexpr (std::is_same_v<T, hn::TFromD<D>>) {
#if OPSERVER_STREAM
    if (stream) {
      hn::Stream(v, d, p);
      return;
    }
#endif
    hn::StoreU(v, d, p);
  } else if constexpr (std::is_same_v<T, BF16>) {
    // Round to nearest-even by adding 0x7FFF plus the lowest kept bit; NaN
    // keeps its upper bits and gets the quiet bit (the add could carry it
    // into Inf). Highway's own DemoteTo truncates, hence done by hand.
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const hn::Rebind<uint16_t, D> d16;
    const auto u = hn::BitCast(du, v);
    const auto hi = hn::ShiftRight<16>(u);
    auto r = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)),
                                        hn::And(hi, hn::Set(du, 1u))));
    r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)),
                       hn::Or(hi, hn::Set(du, 0x40u)), r);
    StoreBits16(d16, hn::DemoteTo(d16, hn::BitCast(di, r)),
                reinterpret_cast<uint16_t*>(p), stream);
  } else {
    static_assert(std::is_same_v<T, F16>);
#if OPSERVER_HW_F16
    const hn::Rebind<F16, D> dh;
    const hn::Rebind<uint16_t, D> d16;
    StoreBits16(d16, hn::BitCast(d16, hn::DemoteTo(dh, v)),
                reinterpret_cast<uint16_t*>(p), stream);
#else
    (void)stream;
    alignas(64) float tmp[64 / sizeof(float)];
    hn::Store(v, d, tmp);
    for (size_t k = 0; k < hn::Lanes(d); ++k) StoreS(tmp[k], p + k);
#endif
  }
}

// Skips to the first element whose output address is aligned for streaming
// stores, returning how many leading elements to handle one by one, or
// clears `*stream` when streaming is not possible.
template <class D, class T>
HWY_INLINE size_t StreamHead(D d, const T* o, size_t n, bool* stream) {
#if OPSERVER_STREAM
  if (!*stream) return 0;
  const size_t vbytes = hn::Lanes(d) * sizeof(T);
  const uintptr_t addr = reinterpret_cast<uintptr_t>(o);
  if (addr % sizeof(T) != 0) {
    *stream = false;
    return 0;
  }
  const size_t head = ((vbytes - addr % vbytes) % vbytes) / sizeof(T);
  if (head >= n) {
    *stream = false;
    return 0;
  }
  return head;
#else
  (void)d;
  (void)o;
  (void)n;
  *stream = false;
  return 0;
#endif
}

HWY_INLINE void StreamFence(bool stream) {
  // Non-temporal stores are weakly ordered: fence before the launch counts
  // as complete (another thread or the next launch may read the output).
  if (stream) hwy::FlushStream();
}

// ---------------------------------------------------------------- loops

// out[i] = op(g[i], s[i]) computed in TFromD<D>.
template <class D, class T, class Op>
HWY_INLINE void BinaryLoop(D d, const T* g, const T* s, T* o, size_t n,
                           const Op& op, bool stream) {
  using CT = hn::TFromD<D>;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  const size_t head = StreamHead(d, o, n, &stream);
  for (; i < head; ++i) {
    StoreS(op(LoadS<CT>(g + i), LoadS<CT>(s + i)), o + i);
  }
  if (n >= N) {
    for (; i + 2 * N <= n; i += 2 * N) {
      const auto r0 = op(d, LoadV(d, g + i), LoadV(d, s + i));
      const auto r1 = op(d, LoadV(d, g + i + N), LoadV(d, s + i + N));
      StoreV(d, r0, o + i, stream);
      StoreV(d, r1, o + i + N, stream);
    }
    for (; i + N <= n; i += N) {
      StoreV(d, op(d, LoadV(d, g + i), LoadV(d, s + i)), o + i, stream);
    }
  }
  for (; i < n; ++i) {
    StoreS(op(LoadS<CT>(g + i), LoadS<CT>(s + i)), o + i);
  }
  StreamFence(stream);
}

// Each operator's vector form beside its scalar form (kernels/formulas.h,
// used for head and tail elements).

struct ThresholdOp : ThresholdFormula {
  using ThresholdFormula::ThresholdFormula;
  using ThresholdFormula::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    return hn::IfThenZeroElse(hn::Le(x, hn::Set(d, t)), g);
  }
};

template <class TI>
struct IntThresholdOp : IntThresholdFormula<TI> {
  using IntThresholdFormula<TI>::IntThresholdFormula;
  using IntThresholdFormula<TI>::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    return hn::IfThenElseZero(hn::Gt(x, hn::Set(d, this->bound)), g);
  }
};

struct SoftshrinkOp : SoftshrinkFormula {
  using SoftshrinkFormula::SoftshrinkFormula;
  using SoftshrinkFormula::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    return hn::IfThenZeroElse(hn::Le(hn::Abs(x), hn::Set(d, l)), g);
  }
};

struct HardswishOp : HardswishFormula {
  using HardswishFormula::HardswishFormula;
  using HardswishFormula::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    const V three = hn::Set(d, 3.0f);
    const V mid = hn::Add(hn::Div(x, three), hn::Set(d, 0.5f));
    V deriv = hn::IfThenElse(hn::Le(x, three), mid, hn::Set(d, 1.0f));
    deriv = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -3.0f)), deriv);
    return hn::Mul(g, deriv);
  }
};

template <class CT>
struct LeakyOp : LeakyFormula<CT> {
  using LeakyFormula<CT>::LeakyFormula;
  using LeakyFormula<CT>::operator();
  template <class D, class V>
  HWY_INLINE V operator()(D d, V g, V x) const {
    return hn::IfThenElse(hn::Gt(x, hn::Zero(d)), g,
                          hn::Mul(g, hn::Set(d, this->slope)));
  }
};

template <class T>
void ThresholdFloat(const KernelParams& p, const void* g, const void* s,
                    void* o, int64_t n, int64_t, bool stream) {
  BinaryLoop(hn::ScalableTag<float>(), static_cast<const T*>(g),
             static_cast<const T*>(s), static_cast<T*>(o),
             static_cast<size_t>(n), ThresholdOp(p), stream);
}

template <class TI>
void ThresholdInt(const KernelParams& p, const void* g, const void* s, void* o,
                  int64_t n, int64_t, bool stream) {
  const IntThresholdOp<TI> op(p);
  const size_t bytes = static_cast<size_t>(n) * sizeof(TI);
  using Whole = typename IntThresholdOp<TI>::Whole;
  if (op.whole == Whole::kAllZero) {
    std::memset(o, 0, bytes);
    return;
  }
  if (op.whole == Whole::kAllPass) {
    if (o != g) std::memmove(o, g, bytes);
    return;
  }
  BinaryLoop(hn::ScalableTag<TI>(), static_cast<const TI*>(g),
             static_cast<const TI*>(s), static_cast<TI*>(o),
             static_cast<size_t>(n), op, stream);
}

template <class T>
void Softshrink(const KernelParams& p, const void* g, const void* s, void* o,
                int64_t n, int64_t, bool stream) {
  BinaryLoop(hn::ScalableTag<float>(), static_cast<const T*>(g),
             static_cast<const T*>(s), static_cast<T*>(o),
             static_cast<size_t>(n), SoftshrinkOp(p), stream);
}

template <class T>
void Hardswish(const KernelParams& p, const void* g, const void* s, void* o,
               int64_t n, int64_t, bool stream) {
  BinaryLoop(hn::ScalableTag<float>(), static_cast<const T*>(g),
             static_cast<const T*>(s), static_cast<T*>(o),
             static_cast<size_t>(n), HardswishOp(p), stream);
}

template <class T>
void Leaky(const KernelParams& p, const void* g, const void* s, void* o,
           int64_t n, int64_t, bool stream) {
  if constexpr (std::is_same_v<T, double>) {
    BinaryLoop(hn::ScalableTag<double>(), static_cast<const T*>(g),
               static_cast<const T*>(s), static_cast<T*>(o),
               static_cast<size_t>(n), LeakyOp<double>(p), stream);
  } else {
    BinaryLoop(hn::ScalableTag<float>(), static_cast<const T*>(g),
               static_cast<const T*>(s), static_cast<T*>(o),
               static_cast<size_t>(n), LeakyOp<float>(p), stream);
  }
}

template <class T>
void Dropout(const KernelParams& p, const void* gv, const void* sv, void* ov,
             int64_t n_signed, int64_t bit0_signed, bool stream) {
  const size_t n = static_cast<size_t>(n_signed);
  const T* g = static_cast<const T*>(gv);
  T* o = static_cast<T*>(ov);
  if (p.dropout_mode == DropoutMode::kZero) {
    std::memset(o, 0, n * sizeof(T));  // +0.0 in every float format.
    return;
  }
  if (p.dropout_mode == DropoutMode::kCopy) {
    if (o != g) std::memmove(o, g, n * sizeof(T));
    return;
  }
  const uint8_t* bits = static_cast<const uint8_t*>(sv);
  const uint64_t bit0 = static_cast<uint64_t>(bit0_signed);
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const DropoutFormula formula(p);
  // Bits of N elements starting at element i as a mask. Whole bytes are
  // read directly; otherwise the (at most 3) bytes covering them are shifted
  // into place, never reading past the last byte holding one of the bits.
  auto mask_at = [&](size_t i) {
    const uint64_t pos = bit0 + i;
    if (N >= 8 && (pos & 7) == 0) return hn::LoadMaskBits(d, bits + (pos >> 3));
    const unsigned shift = static_cast<unsigned>(pos & 7);
    const size_t nbytes = (shift + N + 7) / 8;
    uint32_t w = 0;
    std::memcpy(&w, bits + (pos >> 3), nbytes);
    w >>= shift;
    uint8_t tmp[8] = {0};
    std::memcpy(tmp, &w, sizeof(w));
    return hn::LoadMaskBits(d, tmp);
  };
  auto scalar = [&](size_t i) {
    StoreS(formula(LoadS<float>(g + i), MaskBit(bits, bit0 + i)), o + i);
  };
  static_assert(HWY_MAX_BYTES / sizeof(float) <= 16, "mask_at reads 3 bytes");
  size_t i = 0;
  const size_t head = StreamHead(d, o, n, &stream);
  for (; i < head; ++i) scalar(i);
  const auto vscale = hn::Set(d, formula.scale);
  for (; i + N <= n; i += N) {
    // A select, not a multiply by 0/1: dropped NaN/Inf become exactly 0.
    const auto r =
        hn::IfThenElseZero(mask_at(i), hn::Mul(LoadV(d, g + i), vscale));
    StoreV(d, r, o + i, stream);
  }
  for (; i < n; ++i) scalar(i);
  StreamFence(stream);
}

#define OPSERVER_CONTIG(OP, DT, NAME, FN)                                 \
  void NAME(const KernelParams& p, const void* g, const void* s, void* o, \
            int64_t n, int64_t bit0, bool stream) {                       \
    FN(p, g, s, o, n, bit0, stream);                                      \
  }
OPSERVER_SIMD_KERNELS(OPSERVER_CONTIG)
#undef OPSERVER_CONTIG

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kernels
}  // namespace opserver
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opserver {
namespace kernels {

#define OPSERVER_EXPORT(OP, DT, NAME, FN)                                  \
  HWY_EXPORT(NAME);                                                        \
  void Dispatch##NAME(const KernelParams& p, const void* g, const void* s, \
                      void* o, int64_t n, int64_t bit0, bool stream) {     \
    HWY_DYNAMIC_DISPATCH(NAME)(p, g, s, o, n, bit0, stream);               \
  }
OPSERVER_SIMD_KERNELS(OPSERVER_EXPORT)
#undef OPSERVER_EXPORT

ContigFn SimdContigKernel(OpKind op, DType dtype) {
#define OPSERVER_MATCH(OP, DT, NAME, FN)                     \
  if (op == OpKind::k##OP && dtype == DType::k##DT) {       \
    return &Dispatch##NAME;                                  \
  }
  OPSERVER_SIMD_KERNELS(OPSERVER_MATCH)
#undef OPSERVER_MATCH
  return nullptr;
}

}  // namespace kernels
}  // namespace opserver
#endif  // HWY_ONCE
