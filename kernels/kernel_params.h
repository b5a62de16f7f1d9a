// An operator call's scalars as its element formulas compute with them
// (kernels/ops/): filled by each operator's Check, part of the validated
// call (validate.h), read by every device's kernels.
#ifndef OPSERVER_KERNELS_KERNEL_PARAMS_H_
#define OPSERVER_KERNELS_KERNEL_PARAMS_H_

namespace opserver::kernels {

enum class DropoutMode { kScale, kZero, kCopy };

// Operator scalars, already converted to the types the formulas compute in.
struct KernelParams {
  float threshold = 0;     // ThresholdBackward, float self.
  double threshold_d = 0;  // Same value, compared exactly with int self.
  float lambd = 0;         // SoftshrinkBackward.
  float slope_f = 0;       // LeakyReluBackward computed in float.
  double slope_d = 0;      // LeakyReluBackward computed in double.
  float scale = 1;         // DropoutBackward, kScale mode.
  DropoutMode dropout_mode = DropoutMode::kScale;
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_KERNEL_PARAMS_H_
