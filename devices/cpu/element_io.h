// Scalar element access for the CPU's strided loops (op_loops.h) and the
// SIMD kernels' head and tail elements: the storage format of each dtype,
// loads and stores in a compute type, the mixed-dtype rounding rule and the
// bit-mask reads. Internal to //devices/cpu.
#ifndef OPSERVER_DEVICES_CPU_ELEMENT_IO_H_
#define OPSERVER_DEVICES_CPU_ELEMENT_IO_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/dtype.h"
#include "kernels/half.h"

namespace opserver::cpu {

// Storage format of each dtype and its conversions to the compute types.
template <kernels::DType DT>
struct St;

template <>
struct St<kernels::DType::kFloat> {
  using Raw = float;
  static float ToF(Raw v) { return v; }
  static double ToD(Raw v) { return v; }
  static Raw FromF(float v) { return v; }
  static Raw FromD(double v) { return static_cast<float>(v); }
};
template <>
struct St<kernels::DType::kDouble> {
  using Raw = double;
  static float ToF(Raw v) { return static_cast<float>(v); }
  static double ToD(Raw v) { return v; }
  static Raw FromF(float v) { return v; }
  static Raw FromD(double v) { return v; }
};
template <>
struct St<kernels::DType::kFloat16> {
  using Raw = uint16_t;
  static float ToF(Raw v) { return kernels::HalfToFloat(v); }
  static double ToD(Raw v) { return kernels::HalfToFloat(v); }
  static Raw FromF(float v) { return kernels::FloatToHalf(v); }
  static Raw FromD(double v) { return kernels::DoubleToHalf(v); }
};
template <>
struct St<kernels::DType::kBFloat16> {
  using Raw = uint16_t;
  static float ToF(Raw v) { return kernels::BFloat16ToFloat(v); }
  static double ToD(Raw v) { return kernels::BFloat16ToFloat(v); }
  static Raw FromF(float v) { return kernels::FloatToBFloat16(v); }
  static Raw FromD(double v) { return kernels::DoubleToBFloat16(v); }
};
template <>
struct St<kernels::DType::kInt32> {
  using Raw = int32_t;
};
template <>
struct St<kernels::DType::kInt8> {
  using Raw = int8_t;
};
template <>
struct St<kernels::DType::kUint8> {
  using Raw = uint8_t;
};

// Through memcpy: aclnn tensors may start at any byte address.
template <kernels::DType DT>
typename St<DT>::Raw Raw(const char* p) {
  typename St<DT>::Raw v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <kernels::DType DT>
void PutRaw(char* p, typename St<DT>::Raw v) {
  std::memcpy(p, &v, sizeof(v));
}

template <class CT, kernels::DType DT>
CT Load(const char* p) {
  if constexpr (std::is_same_v<CT, float>) {
    return St<DT>::ToF(Raw<DT>(p));
  } else {
    return St<DT>::ToD(Raw<DT>(p));
  }
}

template <kernels::DType DT, class CT>
void Store(char* p, CT v) {
  if constexpr (std::is_same_v<CT, float>) {
    PutRaw<DT>(p, St<DT>::FromF(v));
  } else {
    PutRaw<DT>(p, St<DT>::FromD(v));
  }
}

// The C++ type the formulas compute in for operands G and S: double for a
// DOUBLE operand, float otherwise (every FLOAT16/BFLOAT16 value round-trips
// through float exactly).
template <kernels::DType G, kernels::DType S>
using ComputeType =
    std::conditional_t<kernels::PromoteDType(G, S) == kernels::DType::kDouble,
                       double, float>;

// Stores a result computed for compute dtype C into an `out` of dtype O:
// rounded to C first, then cast to O, as aclnn's Cast after the kernel and
// PyTorch's out= do (docs/operators.md, common rules). FLOAT16
// 65504 * 2.5 is inf in a FLOAT `out` too, not 163760. Same-dtype stores
// (every SIMD path) round once, as before.
template <kernels::DType C, kernels::DType O, class CT>
void StoreVia(char* p, CT v) {
  if constexpr (C == O || C == kernels::DType::kDouble ||
                (C == kernels::DType::kFloat && std::is_same_v<CT, float>)) {
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

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_ELEMENT_IO_H_
