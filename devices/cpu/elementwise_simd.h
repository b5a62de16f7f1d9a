// Contiguous SIMD kernels (Highway, runtime-dispatched to the best
// instruction set of the running CPU). Internal to //devices/cpu: use plan.h.
#ifndef OPSERVER_DEVICES_CPU_ELEMENTWISE_SIMD_H_
#define OPSERVER_DEVICES_CPU_ELEMENTWISE_SIMD_H_

#include "devices/cpu/kernel_types.h"
#include "kernels/dtype.h"
#include "kernels/op_kind.h"

namespace opserver::cpu {

// The SIMD kernel for `op` when every operand has dtype `dtype` (for an
// operator with a bit-mask input: gradOutput and out), compiled for the
// best instruction set of the running CPU; nullptr when there is none (the
// strided kernel then serves unit strides). Which there are is each
// operator's kKernels (kernels/ops/), OpLoops<Op>::Simd (op_loops.h) and
// its vector form (simd/).
ContigFn SimdContigKernel(kernels::OpKind op, kernels::DType dtype);

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_ELEMENTWISE_SIMD_H_
