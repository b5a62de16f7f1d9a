#include "kernels/kernel_table.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <unordered_map>

#include "kernels/formulas.h"
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
// One loop for every binary operator: the element formula is the scalar
// form in formulas.h, the same the SIMD kernels use for their tails, so
// the SIMD and strided paths give bit-identical results.

// out = F(gradOutput, self) computed in CT (the formula's type), rounded to
// the compute dtype Promote(G, S), stored as O.
template <class F, class CT, DType G, DType S, DType O>
void BinaryStrided(const KernelParams& p, const char* g, int64_t gs,
                   const char* s, int64_t ss, char* o, int64_t os, int64_t n,
                   int64_t) {
  const F f(p);
  for (int64_t i = 0; i < n; ++i, g += gs, s += ss, o += os) {
    // Every FLOAT16/BFLOAT16 value round-trips through float exactly.
    StoreVia<Promote(G, S), O>(o, f(Load<CT, G>(g), Load<CT, S>(s)));
  }
}

template <DType DT>
void ThresholdIntStrided(const KernelParams& p, const char* g, int64_t gs,
                         const char* s, int64_t ss, char* o, int64_t os,
                         int64_t n, int64_t) {
  using T = typename St<DT>::Raw;
  const IntThresholdFormula<T> f(p);
  using Whole = typename IntThresholdFormula<T>::Whole;
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

template <DType G, DType O>
void DropoutStrided(const KernelParams& p, const char* g, int64_t gs,
                    const char* s, int64_t, char* o, int64_t os, int64_t n,
                    int64_t bit0) {
  const uint8_t* bits = reinterpret_cast<const uint8_t*>(s);
  const DropoutFormula f(p);
  for (int64_t i = 0; i < n; ++i, g += gs, o += os) {
    float r;
    switch (p.dropout_mode) {
      case DropoutMode::kZero:
        r = 0.0f;
        break;
      case DropoutMode::kCopy:
        r = Load<float, G>(g);
        break;
      default:
        r = f(Load<float, G>(g),
              MaskBit(bits, static_cast<uint64_t>(bit0 + i)));
    }
    StoreVia<G, O>(o, r);
  }
}

// The compute type of LeakyReluBackward for gradOutput G and self S.
template <DType G, DType S>
using LeakyCT =
    std::conditional_t<Promote(G, S) == DType::kDouble, double, float>;

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
  Add(t, OpKind::kSoftshrinkBackward, G, S, O,
      &BinaryStrided<SoftshrinkFormula, float, G, S, O>);
}

template <DType G, DType S, DType... Os>
void AddLeakyOuts(Table& t) {
  (Add(t, OpKind::kLeakyReluBackward, G, S, Os,
       &BinaryStrided<LeakyFormula<LeakyCT<G, S>>, LeakyCT<G, S>, G, S, Os>),
   ...);
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
  Add(t, kThr, kF, kF, kF, &BinaryStrided<ThresholdFormula, float, kF, kF, kF>);
  Add(t, kThr, kH, kH, kH, &BinaryStrided<ThresholdFormula, float, kH, kH, kH>);
  Add(t, kThr, kB, kB, kB, &BinaryStrided<ThresholdFormula, float, kB, kB, kB>);
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
  Add(t, kHs, kF, kF, kF, &BinaryStrided<HardswishFormula, float, kF, kF, kF>);
  Add(t, kHs, kH, kH, kH, &BinaryStrided<HardswishFormula, float, kH, kH, kH>);
  Add(t, kHs, kB, kB, kB, &BinaryStrided<HardswishFormula, float, kB, kB, kB>);

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
