// DropoutBackward's vector form (kernels/ops/dropout_backward.h holds the rest
// of its definition and its scalar formula, which this computes lane-wise),
// once per SIMD target: elementwise_simd.cc includes it through all-inl.h as
// Highway compiles that file for each instruction set.

// Per-target include guard (Highway's -inl.h idiom).
#include "kernels/ops/dropout_backward.h"
#if defined(OPSERVER_DEVICES_CPU_SIMD_DROPOUT_BACKWARD_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_DEVICES_CPU_SIMD_DROPOUT_BACKWARD_INL_H_
#undef OPSERVER_DEVICES_CPU_SIMD_DROPOUT_BACKWARD_INL_H_
#else
#define OPSERVER_DEVICES_CPU_SIMD_DROPOUT_BACKWARD_INL_H_
#endif
#include "devices/cpu/simd_loops-inl.h"
HWY_BEFORE_NAMESPACE();
namespace opserver::cpu::HWY_NAMESPACE {

struct DropoutBackwardSimd {
  template <class T>
  static void Contig(const kernels::KernelParams& p, const void* gv,
                     const void* sv, void* ov, int64_t n_signed,
                     int64_t bit0_signed, bool stream) {
    const size_t n = static_cast<size_t>(n_signed);
    const T* g = static_cast<const T*>(gv);
    T* o = static_cast<T*>(ov);
    if (p.dropout_mode == kernels::DropoutMode::kZero) {
      std::memset(o, 0, n * sizeof(T));  // +0.0 in every float format.
      return;
    }
    if (p.dropout_mode == kernels::DropoutMode::kCopy) {
      if (o != g) std::memmove(o, g, n * sizeof(T));
      return;
    }
    const uint8_t* bits = static_cast<const uint8_t*>(sv);
    const uint64_t bit0 = static_cast<uint64_t>(bit0_signed);
    const hn::ScalableTag<float> d;
    const size_t N = hn::Lanes(d);
    const kernels::DropoutFormula formula(p);
    // Bits of Lanes(dm) elements starting at element i as a mask of dm.
    // LoadMaskBits may read 8 bytes however few lanes dm has (SVE's float
    // form does): whole bytes are read in place only when 8 of them lie
    // within the mask; otherwise the bits are repacked into a zeroed
    // buffer as long as the widest vector's 16-bit mask (SVE: 128 bits),
    // never reading past the last byte holding one of them.
    const uint64_t mask_bytes = (bit0 + n + 7) / 8;
    auto mask_at = [&](auto dm, size_t i) {
      const size_t M = hn::Lanes(dm);
      const uint64_t pos = bit0 + i;
      if (M >= 8 && (pos & 7) == 0 && (pos >> 3) + 8 <= mask_bytes) {
        return hn::LoadMaskBits(dm, bits + (pos >> 3));
      }
      constexpr size_t kTmpBytes =
          HWY_MAX(8, HWY_MAX_BYTES / sizeof(uint16_t) / 8);
      uint8_t tmp[kTmpBytes] = {0};
      ExtractMaskBits(bits, pos, M, tmp);
      return hn::LoadMaskBits(dm, tmp);
    };
    auto scalar = [&](size_t i) {
      StoreS(formula(LoadS<float>(g + i), MaskBit(bits, bit0 + i)), o + i);
    };
    const auto vscale = hn::Set(d, formula.scale);
    size_t i = 0;
    if constexpr (std::is_same_v<T, BF16>) {
#if OPSERVER_BF16_PAIRS
      // 2N elements per step (see LoadPairBF16); the dropped ones are
      // zeroed after packing, as 16-bit lanes in element order.
      const hn::Repartition<uint16_t, decltype(d)> d16;
      const size_t head = StreamHead(d16, o, n, &stream);
      for (; i < head; ++i) scalar(i);
      for (; i + 2 * N <= n; i += 2 * N) {
        hn::VFromD<decltype(d)> g0, g1;
        LoadPairBF16(d, g + i, &g0, &g1);
        // Every kept result is a product: see ArithmeticNaNs.
        const auto r =
            PackBF16<true>(d, hn::Mul(g0, vscale), hn::Mul(g1, vscale));
        StoreBits16(d16, hn::IfThenElseZero(mask_at(d16, i), r),
                    reinterpret_cast<uint16_t*>(o + i), stream);
      }
#else
      stream = false;
#endif
    } else {
      const size_t head = StreamHead(d, o, n, &stream);
      for (; i < head; ++i) scalar(i);
      for (; i + N <= n; i += N) {
        // A select, not a multiply by 0/1: dropped NaN/Inf become exactly 0.
        const auto r =
            hn::IfThenElseZero(mask_at(d, i), hn::Mul(LoadV(d, g + i), vscale));
        StoreV(d, r, o + i, stream);
      }
    }
    for (; i < n; ++i) scalar(i);
    StreamFence(stream);
  }
};

}  // namespace opserver::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // OPSERVER_DEVICES_CPU_SIMD_DROPOUT_BACKWARD_INL_H_
