// ThresholdBackward: out = self > threshold ? gradOutput : 0. Its registry
// entry, checks, element formulas and dtype combinations (see
// kernels/op_spec.h).
#ifndef OPSERVER_KERNELS_OPS_THRESHOLD_BACKWARD_H_
#define OPSERVER_KERNELS_OPS_THRESHOLD_BACKWARD_H_

#include <cmath>
#include <limits>
#include <type_traits>

#include "common/status_macros.h"
#include "kernels/op_spec.h"

namespace opserver::kernels {

// Float-like self: the gradient passes where self > t. `x <= t` is false
// for NaN x: NaN self passes the gradient.
template <class CT>
struct ThresholdFormula {
  explicit ThresholdFormula(const KernelParams& p) : t(p.threshold) {}
  float operator()(float g, float x) const { return x <= t ? 0.0f : g; }
  float t;
};

// Integer self of type TI compared with a real threshold: x > t exactly iff
// x > floor(t), so the comparison happens in TI. Ranges where floor(t) is
// outside TI are resolved as a whole (see Whole()).
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

struct ThresholdBackward : OpDefinition<ThresholdBackward> {
  static constexpr std::array<DType, 6> kDTypes = {
      kF, kH, kB, DType::kInt32, DType::kInt8, DType::kUint8};
  static constexpr auto kKernels = SameDTypes(kDTypes);
  template <class CT>
  using Formula = ThresholdFormula<CT>;

  static OpInfo Info() {
    return {OpKind::kThresholdBackward,
            "ThresholdBackward",
            "aclnnThresholdBackward",
            {{"gradOutput", false, DTypeVector(kDTypes)},
             {"self", false, DTypeVector(kDTypes)},
             {"out", true, DTypeVector(kDTypes)}},
            {{"threshold", "float", {}, 0.0}},  // 0: ReLU (PyTorch has none).
            "out = self > threshold ? gradOutput : 0 (NaN self passes); "
            "gradOutput, self, out same dtype; gradOutput/self broadcast"};
  }

  static absl::Status Check(const OpInfo& info, const OpCall& call,
                            std::vector<int64_t>* out_shape, KernelParams* kp) {
    RETURN_IF_ERROR(CheckOneDType(info, call));
    kp->threshold = static_cast<float>(call.params.threshold);
    kp->threshold_d = kp->threshold;
    return CheckBroadcastOut(info, call, out_shape);
  }
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OPS_THRESHOLD_BACKWARD_H_
