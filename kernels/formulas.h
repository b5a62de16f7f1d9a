#ifndef OPSERVER_KERNELS_FORMULAS_H_
#define OPSERVER_KERNELS_FORMULAS_H_

// The element formula of each operator in its scalar form, written once.
// The SIMD kernels (elementwise_simd.cc) derive from these, add the vector
// form beside it and use this one for their head and tail elements; the
// strided/broadcast kernels (kernel_table.cc) use it for every element. So
// each formula exists twice at most (scalar and vector), as in ATen, and the
// two paths give bit-identical results.
//
// Each formula is built from the launch's KernelParams and called as
// `f(gradOutput, self)` in its compute type (DropoutFormula: `f(g, kept)`).

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace opserver::kernels {

enum class DropoutMode { kScale, kZero, kCopy };

// Operator scalars, already converted to the types the kernels compute in.
struct KernelParams {
  float threshold = 0;     // ThresholdBackward, float self.
  double threshold_d = 0;  // Same value, compared exactly with int self.
  float lambd = 0;         // SoftshrinkBackward.
  float slope_f = 0;       // LeakyReluBackward computed in float.
  double slope_d = 0;      // LeakyReluBackward computed in double.
  float scale = 1;         // DropoutBackward, kScale mode.
  DropoutMode dropout_mode = DropoutMode::kScale;
};

// ThresholdBackward, float-like self: the gradient passes where self > t.
// `x <= t` is false for NaN x: NaN self passes the gradient.
struct ThresholdFormula {
  explicit ThresholdFormula(const KernelParams& p) : t(p.threshold) {}
  float operator()(float g, float x) const { return x <= t ? 0.0f : g; }
  float t;
};

// ThresholdBackward, integer self of type TI compared with a real threshold:
// x > t exactly iff x > floor(t), so the comparison happens in TI. Ranges
// where floor(t) is outside TI are resolved as a whole (see Whole()).
template <class TI>
struct IntThresholdFormula {
  enum class Whole { kNone, kAllZero, kAllPass };
  explicit IntThresholdFormula(const KernelParams& p) {
    const double t = p.threshold_d;
    const double c = std::floor(t);
    if (std::isnan(t) ||
        c >= static_cast<double>(std::numeric_limits<TI>::max())) {
      whole = Whole::kAllZero;  // Nothing is greater.
    } else if (c < static_cast<double>(std::numeric_limits<TI>::min())) {
      whole = Whole::kAllPass;  // Everything is greater.
    } else {
      bound = static_cast<TI>(c);
    }
  }
  // Only for whole == kNone.
  TI operator()(TI g, TI x) const { return x > bound ? g : static_cast<TI>(0); }
  Whole whole = Whole::kNone;
  TI bound = 0;
};

// SoftshrinkBackward: the gradient passes where |self| > lambd.
struct SoftshrinkFormula {
  explicit SoftshrinkFormula(const KernelParams& p) : l(p.lambd) {}
  float operator()(float g, float x) const {
    return std::fabs(x) <= l ? 0.0f : g;
  }
  float l;
};

// HardswishBackward: g * (0 below -3, x/3 + 1/2 up to 3, 1 above; NaN x
// fails both comparisons and keeps the derivative 1).
struct HardswishFormula {
  explicit HardswishFormula(const KernelParams&) {}
  float operator()(float g, float x) const {
    const float deriv = x < -3.0f ? 0.0f : (x <= 3.0f ? x / 3.0f + 0.5f : 1.0f);
    return g * deriv;
  }
};

// LeakyReluBackward in compute type CT (float, or double when an operand is
// DOUBLE): g where self > 0, else g * negativeSlope.
template <class CT>
struct LeakyFormula {
  explicit LeakyFormula(const KernelParams& p)
      : slope(static_cast<CT>(std::is_same_v<CT, double> ? p.slope_d
                                                         : p.slope_f)) {}
  CT operator()(CT g, CT x) const { return x > 0 ? g : g * slope; }
  CT slope;
};

// DropoutBackward in kScale mode: g * scale where the mask bit is set, else
// exactly 0 (a select, not a multiply: dropped NaN/Inf become 0). The kZero
// and kCopy modes are whole-tensor fills and copies.
struct DropoutFormula {
  explicit DropoutFormula(const KernelParams& p) : scale(p.scale) {}
  float operator()(float g, bool kept) const { return kept ? g * scale : 0.0f; }
  float scale;
};

// Bit `pos` of a DropoutBackward mask (bit i of byte i/8, LSB first).
inline bool MaskBit(const uint8_t* bits, uint64_t pos) {
  return (bits[pos >> 3] >> (pos & 7)) & 1;
}

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_FORMULAS_H_
