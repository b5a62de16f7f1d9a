// The types every element kernel shares: the operator scalars as the
// kernels compute with them, and the two kernel signatures (contiguous SIMD
// and strided). Internal to //kernels.
#ifndef OPSERVER_KERNELS_KERNEL_TYPES_H_
#define OPSERVER_KERNELS_KERNEL_TYPES_H_

#include <cstdint>

namespace opserver::kernels {

enum class DropoutMode { kScale, kZero, kCopy };

// Operator scalars, already converted to the types the kernels compute in
// (filled by each operator's Check, kernels/ops/).
struct KernelParams {
  float threshold = 0;     // ThresholdBackward, float self.
  double threshold_d = 0;  // Same value, compared exactly with int self.
  float lambd = 0;         // SoftshrinkBackward.
  float slope_f = 0;       // LeakyReluBackward computed in float.
  double slope_d = 0;      // LeakyReluBackward computed in double.
  float scale = 1;         // DropoutBackward, kScale mode.
  DropoutMode dropout_mode = DropoutMode::kScale;
};

// Computes n elements of unit-stride operands. `g` is gradOutput, `s` is
// self (or, for an operator whose second input is a bit mask, the mask
// bytes, element i using bit bit_offset + i). `stream` asks for
// non-temporal stores (for outputs larger than the caches). `o` may equal
// `g` or `s` (in place).
using ContigFn = void (*)(const KernelParams& p, const void* g, const void* s,
                          void* o, int64_t n, int64_t bit_offset, bool stream);

// Computes n elements whose addresses advance by the given byte strides
// (any of them may be 0). `s` is self, or a bit mask (not advanced; element
// i uses bit bit_offset + i).
using StridedFn = void (*)(const KernelParams& p, const char* g,
                           int64_t g_stride, const char* s, int64_t s_stride,
                           char* o, int64_t o_stride, int64_t n,
                           int64_t bit_offset);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_KERNEL_TYPES_H_
