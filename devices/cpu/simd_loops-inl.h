// The SIMD building blocks of the contiguous kernels, per Highway target:
// element IO in every dtype (scalar and vector), streaming stores and the
// one binary loop. Included by each operator's vector form (simd/), which
// Highway compiles once per instruction set through elementwise_simd.cc.
// Internal to //devices/cpu.

// Per-target include guard (Highway's -inl.h idiom): compiled again for
// each target as foreach_target.h toggles HWY_TARGET_TOGGLE.
#if defined(OPSERVER_DEVICES_CPU_SIMD_LOOPS_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_DEVICES_CPU_SIMD_LOOPS_INL_H_
#undef OPSERVER_DEVICES_CPU_SIMD_LOOPS_INL_H_
#else
#define OPSERVER_DEVICES_CPU_SIMD_LOOPS_INL_H_
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "devices/cpu/element_io.h"
#include "devices/cpu/kernel_types.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/dtype.h"
#include "kernels/half.h"

HWY_BEFORE_NAMESPACE();
namespace opserver {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// The operators' vocabulary (kernels/), by name in the SIMD code.
using kernels::BFloat16ToFloat;
using kernels::DType;
using kernels::FloatToBFloat16;
using kernels::FloatToHalf;
using kernels::HalfToFloat;
using kernels::KernelParams;

using F16 = hwy::float16_t;
using BF16 = hwy::bfloat16_t;

// F16C (AVX2 and up) converts binary16 in hardware with round-to-nearest-
// even; on older targets Highway emulates the demotion without that
// guarantee, so those targets convert lane by lane.
// (Highway compiles this file once per target: the macros are redefined.)
#undef OPSERVER_HW_F16
#undef OPSERVER_STREAM
#undef OPSERVER_BF16_PAIRS
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

// HWY_SCALAR has no 16-bit lanes of its own beside one float: its bf16
// elements all go through the scalar element loop.
#if HWY_TARGET == HWY_SCALAR
#define OPSERVER_BF16_PAIRS 0
#else
#define OPSERVER_BF16_PAIRS 1
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

// Every dtype but BFLOAT16, which goes through LoadPairBF16/PackBF16.
template <class D, class T>
HWY_INLINE hn::VFromD<D> LoadV(D d, const T* p) {
  static_assert(!std::is_same_v<T, BF16>);
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

// Every dtype but BFLOAT16, which goes through LoadPairBF16/PackBF16.
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
  } else {
    static_assert(std::is_same_v<T, F16>);
#if OPSERVER_HW_F16
    const hn::Rebind<F16, D> dh;
    const hn::Rebind<uint16_t, D> d16;
    StoreBits16(d16, hn::BitCast(d16, hn::DemoteTo(dh, v)),
                reinterpret_cast<uint16_t*>(p), stream);
#else
    (void)stream;
    // As many floats as the target's widest vector: SVE's reach 64 (2048
    // bits), not a fixed 64 bytes, and Lanes(d) is only known at run time.
    alignas(64) float tmp[hn::MaxLanes(D())];
    hn::Store(v, d, tmp);
    for (size_t k = 0; k < hn::Lanes(d); ++k) StoreS(tmp[k], p + k);
#endif
  }
}

// ---------------------------------------------------------- bf16 in pairs

// A bfloat16 is the upper half of a float. 2N of them loaded as N 32-bit
// words become two float vectors with one integer op each and no shuffle:
// the even elements (low halves) shifted up, the odd ones (high halves)
// masked. An element-wise formula does not care which lanes hold which
// elements, and PackBF16 puts them back in order with a shift, an AND and
// an OR. Widening with PromoteTo and narrowing with a saturating pack and a
// cross-lane permute took 14 vector instructions per 16 elements on
// AVX-512, 4 of them shuffles (against 8 and none here), which made the
// bf16 kernels 1.3-1.7x slower than fp16 (one conversion instruction each
// way) on data in cache and kept them below memory speed.
#if OPSERVER_BF16_PAIRS
template <class D>
HWY_INLINE void LoadPairBF16(D d, const BF16* p, hn::VFromD<D>* even,
                             hn::VFromD<D>* odd) {
  const hn::RebindToUnsigned<D> du;
  const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  *even = hn::BitCast(d, hn::ShiftLeft<16>(w));
  *odd = hn::BitCast(d, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

// The bits of float v rounded to nearest-even at bit 16, the bfloat16 in
// the upper half (the lower half is left over): adding 0x7FFF plus the
// lowest kept bit carries exactly when the dropped half is above the
// halfway point, or at it with the kept part odd. NaN keeps its upper bits
// and gets the quiet bit instead (the add could carry it into Inf).
// FloatToBFloat16 is the same rule for one element; Highway's DemoteTo to
// bfloat16 truncates instead. kArithmeticNaNs: see ArithmeticNaNs.
template <bool kArithmeticNaNs, class D>
HWY_INLINE hn::VFromD<hn::RebindToUnsigned<D>> RoundToBF16Bits(
    D d, hn::VFromD<D> v) {
  (void)d;
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  // 0x7FFF + the kept bit 16 as a select on a bit test (a masked add on
  // AVX-512) rather than a shift, an AND and a second add.
  const auto r = hn::IfThenElse(hn::TestBit(u, hn::Set(du, 0x10000u)),
                                hn::Add(u, hn::Set(du, 0x8000u)),
                                hn::Add(u, hn::Set(du, 0x7FFFu)));
  if constexpr (kArithmeticNaNs) return r;
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)),
                        hn::Or(u, hn::Set(du, 0x00400000u)), r);
}

// The 2N bfloat16 of the (even, odd) vectors LoadPairBF16 split, in order,
// rounded to nearest-even, as 16-bit lanes.
template <bool kArithmeticNaNs, class D>
HWY_INLINE hn::VFromD<hn::Repartition<uint16_t, D>> PackBF16(
    D d, hn::VFromD<D> even, hn::VFromD<D> odd) {
  const hn::RebindToUnsigned<D> du;
  const hn::Repartition<uint16_t, D> d16;
  return hn::BitCast(
      d16, hn::Or(hn::ShiftRight<16>(RoundToBF16Bits<kArithmeticNaNs>(d, even)),
                  hn::And(RoundToBF16Bits<kArithmeticNaNs>(d, odd),
                          hn::Set(du, 0xFFFF0000u))));
}

#endif  // OPSERVER_BF16_PAIRS

// Whether every NaN the vector form Op returns comes out of a float
// operation on bf16 inputs and non-NaN constants, none passed through by a
// select: the operator says so with `static constexpr bool kArithmeticNaNs
// = true`. Such a NaN is quiet, and its low 16 bits are zero because x86
// and Arm return either an input NaN's payload (whose low bits a bf16
// input leaves zero) or the default NaN: it rounds to itself, so the store
// skips the NaN test, which took a sixth of a bf16 kernel's time in cache.
// A NaN passed through (gradOutput in ThresholdBackward, SoftshrinkBackward
// and LeakyReluBackward) may be signalling and needs the test.
// elementwise_simd_test would see a wrong claim (it plants NaNs).
template <class Op, class = void>
struct ArithmeticNaNs : std::false_type {};
template <class Op>
struct ArithmeticNaNs<Op, std::void_t<decltype(Op::kArithmeticNaNs)>>
    : std::bool_constant<Op::kArithmeticNaNs> {};

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
  if constexpr (std::is_same_v<T, BF16>) {
#if OPSERVER_BF16_PAIRS
    // 2N elements (one full vector of bf16) per step, see LoadPairBF16.
    const hn::Repartition<uint16_t, D> d16;
    const size_t head = StreamHead(d16, o, n, &stream);
    for (; i < head; ++i) {
      StoreS(op(LoadS<CT>(g + i), LoadS<CT>(s + i)), o + i);
    }
    for (; i + 2 * N <= n; i += 2 * N) {
      hn::VFromD<D> g0, g1, s0, s1;
      LoadPairBF16(d, g + i, &g0, &g1);
      LoadPairBF16(d, s + i, &s0, &s1);
      StoreBits16(
          d16,
          PackBF16<ArithmeticNaNs<Op>::value>(d, op(d, g0, s0), op(d, g1, s1)),
          reinterpret_cast<uint16_t*>(o + i), stream);
    }
#else
    stream = false;
#endif
  } else {
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
  }
  for (; i < n; ++i) {
    StoreS(op(LoadS<CT>(g + i), LoadS<CT>(s + i)), o + i);
  }
  StreamFence(stream);
}

// The element type of a dtype in the SIMD kernels.
template <DType DT>
struct SimdTypeOf;
template <>
struct SimdTypeOf<DType::kFloat> {
  using T = float;
};
template <>
struct SimdTypeOf<DType::kDouble> {
  using T = double;
};
template <>
struct SimdTypeOf<DType::kFloat16> {
  using T = F16;
};
template <>
struct SimdTypeOf<DType::kBFloat16> {
  using T = BF16;
};
template <>
struct SimdTypeOf<DType::kInt32> {
  using T = int32_t;
};
template <>
struct SimdTypeOf<DType::kInt8> {
  using T = int8_t;
};
template <>
struct SimdTypeOf<DType::kUint8> {
  using T = uint8_t;
};
template <DType DT>
using SimdType = typename SimdTypeOf<DT>::T;

// The type a floating formula computes in for elements of T: double for
// double, float for float, FLOAT16 and BFLOAT16.
template <class T>
using FloatCT = std::conditional_t<std::is_same_v<T, double>, double, float>;

// out[i] = Vec(p)(g[i], s[i]) for n contiguous elements of T, computed in
// CT: the whole contiguous kernel of a binary operator whose vector form
// (with its scalar form for head and tail) is Vec.
template <class Vec, class CT, class T>
HWY_INLINE void BinaryContig(const KernelParams& p, const void* g,
                             const void* s, void* o, int64_t n, bool stream) {
  BinaryLoop(hn::ScalableTag<CT>(), static_cast<const T*>(g),
             static_cast<const T*>(s), static_cast<T*>(o),
             static_cast<size_t>(n), Vec(p), stream);
}

// The SIMD part of a binary floating operator whose vector form is
// Vec<CT> (a template on the compute type, float or double, deriving from
// the scalar formula): `struct XSimd : BinarySimd<XVec> {};`.
template <template <class> class Vec>
struct BinarySimd {
  template <class T>
  static void Contig(const KernelParams& p, const void* g, const void* s,
                     void* o, int64_t n, int64_t, bool stream) {
    BinaryContig<Vec<FloatCT<T>>, FloatCT<T>, T>(p, g, s, o, n, stream);
  }
};

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace opserver
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
