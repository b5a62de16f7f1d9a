// DropoutBackward: out = bit i of mask ? gradOutput * scale : 0. Its
// registry entry, checks, element formula and kernels (see
// kernels/op_spec.h).
#ifndef OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_H_

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/aclnn_status.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// kScale mode: g * scale where the mask bit is set, else exactly 0 (a
// select, not a multiply: dropped NaN/Inf become 0). The kZero and kCopy
// modes are whole-tensor fills and copies.
struct DropoutFormula {
  explicit DropoutFormula(const KernelParams& p) : scale(p.scale) {}
  float operator()(float g, bool kept) const { return kept ? g * scale : 0.0f; }
  float scale;
};

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

struct DropoutBackward : OpDefinition<DropoutBackward> {
  static constexpr std::array<DType, 1> kMaskSet = {DType::kUint8};
  // The result cast to any floating out.
  static constexpr auto kKernels =
      AllDTypes(kHalfFloatSet, kMaskSet, kFloatSet);

  static OpInfo Info() {
    OpInfo info{OpKind::kDropoutBackward,
                "DropoutBackward",
                "aclnnDropoutBackward",
                {{"gradOutput", false, DTypeVector(kHalfFloatSet)},
                 {"mask", false, DTypeVector(kMaskSet)},
                 {"out", true, DTypeVector(kFloatSet)}},
                {{"scale", "double", {}, 2.0}},  // nn.Dropout: p = 0.5.
                "out = bit i of mask (LSB first) ? gradOutput * scale : 0; "
                "mask holds align(numel,128)/8 bytes; scale 0 or >= 1 (1 "
                "copies)"};
    info.bit_mask_input = true;
    return info;
  }

  static absl::Status Check(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
    const Names n(info);
    const TensorView& g = *call.grad_output;
    const TensorView& s = *call.self;
    const TensorView& o = *call.out;
    const double scale = call.params.scale;
    if (absl::Status st = CheckDType(info, g, n.g, info.tensors[0].dtypes);
        !st.ok()) {
      return st;
    }
    if (s.dtype != DType::kUint8) {
      return ParamInvalid(absl::StrCat(n.s, " has dtype ", DTypeName(s.dtype),
                                       "; it must be UINT8"));
    }
    if (!IsFloating(o.dtype)) {
      return ParamInvalid(absl::StrCat(n.o, " has dtype ", DTypeName(o.dtype),
                                       "; ", n.g, " (", DTypeName(g.dtype),
                                       ") can only be cast to ",
                                       DTypeList(info.tensors[2].dtypes)));
    }
    if (std::isnan(scale) || (scale != 0 && scale < 1)) {
      return ParamInvalid(
          absl::StrCat("scale must be 0 or >= 1 (it is 1/(1-p)), got ", scale));
    }
    const int64_t numel = NumElements(g);
    // align(numel, 128) / 8 without overflowing for numel near 2^63.
    const int64_t need = numel / 128 * 16 + (numel % 128 != 0 ? 16 : 0);
    const int64_t have = NumElements(s);
    if (have != need) {
      return ParamInvalid(absl::StrCat(n.s, " has ", have, " elements; a ", n.g,
                                       " of ", numel, " elements needs align(",
                                       numel, ", 128) / 8 = ", need));
    }
    if (scale == 0) {
      kp->dropout_mode = DropoutMode::kZero;
    } else if (scale == 1) {
      kp->dropout_mode = DropoutMode::kCopy;
    } else {
      kp->dropout_mode = DropoutMode::kScale;
      kp->scale = static_cast<float>(scale);
    }
    *out_shape = g.shape;
    return CheckOutShape(o, n.o, *out_shape, absl::StrCat(n.g, " shape"));
  }

  // A mask that is not contiguous is gathered into the workspace.
  static uint64_t WorkspaceSize(const OpCall& call,
                                const std::vector<int64_t>& out_shape) {
    if (NumElements(out_shape) == 0 || IsContiguous(*call.self)) return 0;
    return static_cast<uint64_t>(NumElements(*call.self));
  }

  static constexpr bool Simd(DTypes d) { return d.g == d.o; }

  template <DType G, DType S, DType O>
  static constexpr StridedFn Strided() {
    return &DropoutStrided<G, O>;
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_H_

// ---- vector form, once per SIMD target (see elementwise_simd.cc) ----------
#if defined(OPSERVER_SIMD_PASS) &&                          \
    defined(OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_SIMD_) == \
        defined(HWY_TARGET_TOGGLE)
#ifdef OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_SIMD_
#undef OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_SIMD_
#else
#define OPSERVER_KERNELS_OPS_DROPOUT_BACKWARD_SIMD_
#endif
#include "kernels/simd_loops-inl.h"
HWY_BEFORE_NAMESPACE();
namespace opserver::kernels::HWY_NAMESPACE {

struct DropoutBackwardSimd {
  template <class T>
  static void Contig(const KernelParams& p, const void* gv, const void* sv,
                     void* ov, int64_t n_signed, int64_t bit0_signed,
                     bool stream) {
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
    // Bits of Lanes(dm) elements starting at element i as a mask of dm.
    // Whole bytes are read directly; otherwise the (at most 5) bytes
    // covering them are shifted into place, never reading past the last
    // byte holding one of the bits.
    auto mask_at = [&](auto dm, size_t i) {
      const size_t M = hn::Lanes(dm);
      const uint64_t pos = bit0 + i;
      if (M >= 8 && (pos & 7) == 0) {
        return hn::LoadMaskBits(dm, bits + (pos >> 3));
      }
      const unsigned shift = static_cast<unsigned>(pos & 7);
      const size_t nbytes = (shift + M + 7) / 8;
      uint64_t w = 0;
      std::memcpy(&w, bits + (pos >> 3), nbytes);
      w >>= shift;
      uint8_t tmp[8] = {0};
      std::memcpy(tmp, &w, sizeof(w));
      return hn::LoadMaskBits(dm, tmp);
    };
    auto scalar = [&](size_t i) {
      StoreS(formula(LoadS<float>(g + i), MaskBit(bits, bit0 + i)), o + i);
    };
    static_assert(HWY_MAX_BYTES / sizeof(uint16_t) <= 56,
                  "mask_at shifts the bits within 8 bytes");
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

}  // namespace opserver::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif  // OPSERVER_SIMD_PASS
