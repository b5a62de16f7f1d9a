// Contiguous SIMD kernels (Highway, runtime-dispatched to the best
// instruction set of the running CPU). Internal to //kernels: use ops.h.
#ifndef OPSERVER_KERNELS_ELEMENTWISE_SIMD_H_
#define OPSERVER_KERNELS_ELEMENTWISE_SIMD_H_

#include "kernels/dtype.h"
#include "kernels/kernel_types.h"
#include "kernels/op_kind.h"

namespace opserver::kernels {

// The SIMD kernel for `op` when every operand has dtype `dtype` (for an
// operator with a bit-mask input: gradOutput and out), compiled for the
// best instruction set of the running CPU; nullptr when there is none (the
// strided kernel then serves unit strides). Which there are is each
// operator's kKernels and Simd() (kernels/ops/).
ContigFn SimdContigKernel(OpKind op, DType dtype);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_ELEMENTWISE_SIMD_H_
