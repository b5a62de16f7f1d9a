// Scalar conversions between float/double and the 16-bit float formats,
// rounding to nearest-even. Used for kernel tails, the strided paths and
// scalar arguments; the SIMD paths implement the same rounding in vectors.
#ifndef OPSERVER_KERNELS_HALF_H_
#define OPSERVER_KERNELS_HALF_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace opserver::kernels {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// IEEE binary16 -> float, exact (after Maratyszcza's FP16 library).
inline float HalfToFloat(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float normalized = BitsToFloat((two_w >> 4) + exp_offset) * 0x1.0p-112f;
  const float denormalized = BitsToFloat((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result = sign | (two_w < (1u << 27) ? FloatBits(denormalized)
                                                     : FloatBits(normalized));
  return BitsToFloat(result);
}

// float -> IEEE binary16, round to nearest-even; NaN stays NaN (quiet).
inline uint16_t FloatToHalf(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = FloatBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = BitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float BFloat16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// float -> bfloat16, round to nearest-even; NaN stays NaN (quiet bit set).
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t u = FloatBits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// double -> float rounding to odd: the result, rounded once more to a
// format with at most 22 significand bits, equals direct rounding of `d`.
inline float DoubleToFloatRoundOdd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || std::isinf(f) || static_cast<double>(f) == d) return f;
  uint32_t u = FloatBits(f);
  if ((u & 1u) == 0) {
    // f is even and inexact: step one ulp towards d (same sign side as f
    // unless f is zero, handled by nextafter).
    f = std::nextafter(f, d > static_cast<double>(f)
                              ? std::numeric_limits<float>::infinity()
                              : -std::numeric_limits<float>::infinity());
  }
  return f;
}

// double -> binary16 / bfloat16 with a single correct rounding.
inline uint16_t DoubleToHalf(double d) {
  return FloatToHalf(DoubleToFloatRoundOdd(d));
}
inline uint16_t DoubleToBFloat16(double d) {
  return FloatToBFloat16(DoubleToFloatRoundOdd(d));
}

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_HALF_H_
