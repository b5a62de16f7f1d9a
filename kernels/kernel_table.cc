#include "kernels/kernel_table.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <unordered_map>

#include "kernels/half.h"

namespace opserver::kernels {
namespace {

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

constexpr DType Promote(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kDouble || b == DType::kDouble) return DType::kDouble;
  return DType::kFloat;
}

// Stores a result computed for compute dtype C into an `out` of dtype O:
// rounded to C first, then cast to O, as aclnn's Cast after the kernel and
// PyTorch's out= do (../shared/spec/operators.md, common rules). FLOAT16
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

// ------------------------------------------------------- strided kernels
// The formulas match elementwise_simd.cc operation for operation, so the
// SIMD and strided paths give bit-identical results.

template <DType DT>
void ThresholdFloatStrided(const KernelParams& p, const char* g, int64_t gs,
                           const char* s, int64_t ss, char* o, int64_t os,
                           int64_t n, int64_t) {
  const float t = p.threshold;
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    const float x = Load<float, DT>(s);
    // Every FLOAT16/BFLOAT16 value round-trips through float exactly, as in
    // the SIMD path.
    Store<DT>(o, x <= t ? 0.0f : Load<float, DT>(g));
  }
}

template <DType DT>
void ThresholdIntStrided(const KernelParams& p, const char* g, int64_t gs,
                         const char* s, int64_t ss, char* o, int64_t os,
                         int64_t n, int64_t) {
  using T = typename St<DT>::Raw;
  const double t = p.threshold_d;
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    // Every int8/uint8/int32 value is exact as a double.
    const bool pass = static_cast<double>(Raw<DT>(s)) > t;
    PutRaw<DT>(o, pass ? Raw<DT>(g) : static_cast<T>(0));
  }
}

template <DType G, DType S, DType O>
void SoftshrinkStrided(const KernelParams& p, const char* g, int64_t gs,
                       const char* s, int64_t ss, char* o, int64_t os,
                       int64_t n, int64_t) {
  const float l = p.lambd;
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    const float x = Load<float, S>(s);
    StoreVia<Promote(G, S), O>(o, std::fabs(x) <= l ? 0.0f : Load<float, G>(g));
  }
}

template <DType DT>
void HardswishStrided(const KernelParams&, const char* g, int64_t gs,
                      const char* s, int64_t ss, char* o, int64_t os, int64_t n,
                      int64_t) {
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    const float x = Load<float, DT>(s);
    const float deriv = x < -3.0f ? 0.0f : (x <= 3.0f ? x / 3.0f + 0.5f : 1.0f);
    Store<DT>(o, Load<float, DT>(g) * deriv);
  }
}

template <DType G, DType S, DType O>
void LeakyStrided(const KernelParams& p, const char* g, int64_t gs,
                  const char* s, int64_t ss, char* o, int64_t os, int64_t n,
                  int64_t) {
  using CT = std::conditional_t<Promote(G, S) == DType::kDouble, double, float>;
  CT slope;
  if constexpr (std::is_same_v<CT, double>) {
    slope = p.slope_d;
  } else {
    slope = p.slope_f;
  }
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    const CT x = Load<CT, S>(s);
    const CT gv = Load<CT, G>(g);
    StoreVia<Promote(G, S), O>(o, x > 0 ? gv : gv * slope);
  }
}

template <DType G, DType O>
void DropoutStrided(const KernelParams& p, const char* g, int64_t gs,
                    const char* s, int64_t, char* o, int64_t os, int64_t n,
                    int64_t bit0) {
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(s);
  const float scale = p.scale;
  for (int64_t i = 0; i < n; ++i, g += gs, o += os) {
    float r;
    switch (p.dropout_mode) {
      case DropoutMode::kZero:
        r = 0.0f;
        break;
      case DropoutMode::kCopy:
        r = Load<float, G>(g);
        break;
      default: {
        const uint64_t pos = static_cast<uint64_t>(bit0 + i);
        r = ((bits[pos >> 3] >> (pos & 7)) & 1) ? Load<float, G>(g) * scale
                                                : 0.0f;
      }
    }
    StoreVia<G, O>(o, r);
  }
}

// ------------------------------------------------------------ the table

uint64_t Key(OpKind op, DType g, DType s, DType o) {
  return (static_cast<uint64_t>(op) << 48) |
         (static_cast<uint64_t>(static_cast<uint32_t>(g)) << 32) |
         (static_cast<uint64_t>(static_cast<uint32_t>(s)) << 16) |
         static_cast<uint64_t>(static_cast<uint32_t>(o));
}

using Table = std::unordered_map<uint64_t, Kernel>;

void Add(Table& t, OpKind op, DType g, DType s, DType o, StridedFn strided) {
  Kernel k;
  k.strided = strided;
  if (g == o && (s == o || op == OpKind::kDropoutBackward)) {
    k.contig = SimdContigKernel(op, o);
  }
  t[Key(op, g, s, o)] = k;
}

constexpr DType kF = DType::kFloat;
constexpr DType kH = DType::kFloat16;
constexpr DType kB = DType::kBFloat16;
constexpr DType kD = DType::kDouble;

template <DType G, DType S>
void AddSoftshrink(Table& t) {
  constexpr DType O = Promote(G, S);
  Add(t, OpKind::kSoftshrinkBackward, G, S, O, &SoftshrinkStrided<G, S, O>);
}

template <DType G, DType S, DType... Os>
void AddLeakyOuts(Table& t) {
  (Add(t, OpKind::kLeakyReluBackward, G, S, Os, &LeakyStrided<G, S, Os>), ...);
}

template <DType G, DType... Ss>
void AddLeakySelves(Table& t) {
  (AddLeakyOuts<G, Ss, kF, kH, kB, kD>(t), ...);
}

template <DType G, DType... Os>
void AddDropout(Table& t) {
  (Add(t, OpKind::kDropoutBackward, G, DType::kUint8, Os,
       &DropoutStrided<G, Os>),
   ...);
}

Table BuildTable() {
  Table t;
  constexpr OpKind kThr = OpKind::kThresholdBackward;
  Add(t, kThr, kF, kF, kF, &ThresholdFloatStrided<kF>);
  Add(t, kThr, kH, kH, kH, &ThresholdFloatStrided<kH>);
  Add(t, kThr, kB, kB, kB, &ThresholdFloatStrided<kB>);
  Add(t, kThr, DType::kInt32, DType::kInt32, DType::kInt32,
      &ThresholdIntStrided<DType::kInt32>);
  Add(t, kThr, DType::kInt8, DType::kInt8, DType::kInt8,
      &ThresholdIntStrided<DType::kInt8>);
  Add(t, kThr, DType::kUint8, DType::kUint8, DType::kUint8,
      &ThresholdIntStrided<DType::kUint8>);

  AddSoftshrink<kF, kF>(t);
  AddSoftshrink<kF, kH>(t);
  AddSoftshrink<kF, kB>(t);
  AddSoftshrink<kH, kF>(t);
  AddSoftshrink<kH, kH>(t);
  AddSoftshrink<kH, kB>(t);
  AddSoftshrink<kB, kF>(t);
  AddSoftshrink<kB, kH>(t);
  AddSoftshrink<kB, kB>(t);

  constexpr OpKind kHs = OpKind::kHardswishBackward;
  Add(t, kHs, kF, kF, kF, &HardswishStrided<kF>);
  Add(t, kHs, kH, kH, kH, &HardswishStrided<kH>);
  Add(t, kHs, kB, kB, kB, &HardswishStrided<kB>);

  AddLeakySelves<kF, kF, kH, kB, kD>(t);
  AddLeakySelves<kH, kF, kH, kB, kD>(t);
  AddLeakySelves<kB, kF, kH, kB, kD>(t);
  AddLeakySelves<kD, kF, kH, kB, kD>(t);

  AddDropout<kF, kF, kH, kB, kD>(t);
  AddDropout<kH, kF, kH, kB, kD>(t);
  AddDropout<kB, kF, kH, kB, kD>(t);
  return t;
}

}  // namespace

const Kernel* FindKernel(OpKind op, DType g, DType s, DType o) {
  static const Table* const table = new Table(BuildTable());
  auto it = table->find(Key(op, g, s, o));
  return it == table->end() ? nullptr : &it->second;
}

}  // namespace opserver::kernels
