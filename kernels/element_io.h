// Scalar element access for the strided kernels and the operators' scalar
// forms: the storage format of each dtype, loads and stores in a compute
// type, the mixed-dtype rounding rule, and the one generic strided loop.
// Internal to //kernels.
#ifndef OPSERVER_KERNELS_ELEMENT_IO_H_
#define OPSERVER_KERNELS_ELEMENT_IO_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/half.h"
#include "kernels/kernel_types.h"

namespace opserver::kernels {

// Storage format of each dtype and its conversions to the compute types.
template <DType DT>
struct St;

template <>
struct St<DType::kFloat> {
  using Raw = float;
  static float ToF(Raw v) { return v; }
  static double ToD(Raw v) { return v; }
  static Raw FromF(float v) { return v; }
  static Raw FromD(double v) { return static_cast<float>(v); }
};
template <>
struct St<DType::kDouble> {
  using Raw = double;
  static float ToF(Raw v) { return static_cast<float>(v); }
  static double ToD(Raw v) { return v; }
  static Raw FromF(float v) { return v; }
  static Raw FromD(double v) { return v; }
};
template <>
struct St<DType::kFloat16> {
  using Raw = uint16_t;
  static float ToF(Raw v) { return HalfToFloat(v); }
  static double ToD(Raw v) { return HalfToFloat(v); }
  static Raw FromF(float v) { return FloatToHalf(v); }
  static Raw FromD(double v) { return DoubleToHalf(v); }
};
template <>
struct St<DType::kBFloat16> {
  using Raw = uint16_t;
  static float ToF(Raw v) { return BFloat16ToFloat(v); }
  static double ToD(Raw v) { return BFloat16ToFloat(v); }
  static Raw FromF(float v) { return FloatToBFloat16(v); }
  static Raw FromD(double v) { return DoubleToBFloat16(v); }
};
template <>
struct St<DType::kInt32> {
  using Raw = int32_t;
};
template <>
struct St<DType::kInt8> {
  using Raw = int8_t;
};
template <>
struct St<DType::kUint8> {
  using Raw = uint8_t;
};

// Through memcpy: aclnn tensors may start at any byte address.
template <DType DT>
typename St<DT>::Raw Raw(const char* p) {
  typename St<DT>::Raw v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <DType DT>
void PutRaw(char* p, typename St<DT>::Raw v) {
  std::memcpy(p, &v, sizeof(v));
}

template <class CT, DType DT>
CT Load(const char* p) {
  if constexpr (std::is_same_v<CT, float>) {
    return St<DT>::ToF(Raw<DT>(p));
  } else {
    return St<DT>::ToD(Raw<DT>(p));
  }
}

template <DType DT, class CT>
void Store(char* p, CT v) {
  if constexpr (std::is_same_v<CT, float>) {
    PutRaw<DT>(p, St<DT>::FromF(v));
  } else {
    PutRaw<DT>(p, St<DT>::FromD(v));
  }
}

// The dtype a binary floating operator computes in: the operands' common
// dtype, else DOUBLE if either is, else FLOAT.
constexpr DType PromoteDType(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kDouble || b == DType::kDouble) return DType::kDouble;
  return DType::kFloat;
}

// The C++ type the formulas compute in for operands G and S: double for a
// DOUBLE operand, float otherwise (every FLOAT16/BFLOAT16 value round-trips
// through float exactly).
template <DType G, DType S>
using ComputeType =
    std::conditional_t<PromoteDType(G, S) == DType::kDouble, double, float>;

// Stores a result computed for compute dtype C into an `out` of dtype O:
// rounded to C first, then cast to O, as aclnn's Cast after the kernel and
// PyTorch's out= do (docs/operators.md, common rules). FLOAT16
// 65504 * 2.5 is inf in a FLOAT `out` too, not 163760. Same-dtype stores
// (every SIMD path) round once, as before.
template <DType C, DType O, class CT>
void StoreVia(char* p, CT v) {
  if constexpr (C == O || C == DType::kDouble ||
                (C == DType::kFloat && std::is_same_v<CT, float>)) {
    Store<O>(p, v);  // Nothing to round: C holds every CT value exactly.
  } else {
    char rounded[sizeof(typename St<C>::Raw)];
    Store<C>(rounded, v);
    Store<O>(p, Load<CT, C>(rounded));
  }
}

// Bit `pos` of a bit mask (bit i of byte i/8, LSB first).
inline bool MaskBit(const uint8_t* bits, uint64_t pos) {
  return (bits[pos >> 3] >> (pos & 7)) & 1;
}

// Bits [pos, pos + count) of a bit mask, repacked from bit 0 of out[0]
// (same order; (count + 7) / 8 bytes, the unused high bits of the last one
// zero), for SIMD mask loads at any bit offset and any vector length (SVE's
// reach 128 16-bit lanes). Reads only the bytes that hold those bits.
inline void ExtractMaskBits(const uint8_t* bits, uint64_t pos, size_t count,
                            uint8_t* out) {
  const uint8_t* src = bits + (pos >> 3);
  const unsigned shift = static_cast<unsigned>(pos & 7);
  const size_t out_bytes = (count + 7) / 8;
  const size_t src_bytes = (shift + count + 7) / 8;  // >= out_bytes
  for (size_t k = 0; k < out_bytes; ++k) {
    unsigned v = src[k] >> shift;
    if (shift != 0 && k + 1 < src_bytes) v |= unsigned{src[k + 1]} << (8 - shift);
    out[k] = static_cast<uint8_t>(v);
  }
  if (count % 8 != 0) out[out_bytes - 1] &= (1u << (count % 8)) - 1;
}

// The strided loop of every binary operator whose formula F (the scalar
// form, called as f(gradOutput, self) in CT) is all it needs: out =
// F(gradOutput, self) rounded to the compute dtype PromoteDType(G, S) and
// stored as O. The SIMD kernels use the same F for their head and tail
// elements, so both paths give bit-identical results.
template <class F, class CT, DType G, DType S, DType O>
void BinaryStrided(const KernelParams& p, const char* g, int64_t gs,
                   const char* s, int64_t ss, char* o, int64_t os, int64_t n,
                   int64_t) {
  const F f(p);
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    StoreVia<PromoteDType(G, S), O>(o, f(Load<CT, G>(g), Load<CT, S>(s)));
  }
}

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_ELEMENT_IO_H_
