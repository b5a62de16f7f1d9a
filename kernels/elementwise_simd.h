// Contiguous SIMD kernels (Highway, runtime-dispatched to the best
// instruction set of the running CPU) and the types every element kernel
// shares. Internal to //kernels: use ops.h.
#ifndef OPSERVER_KERNELS_ELEMENTWISE_SIMD_H_
#define OPSERVER_KERNELS_ELEMENTWISE_SIMD_H_

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/formulas.h"
#include "kernels/op_kind.h"

namespace opserver::kernels {

// Computes n elements of unit-stride operands. `g` is gradOutput, `s` is
// self (or, for DropoutBackward, the mask bytes, element i using bit
// bit_offset + i). `stream` asks for non-temporal stores (for outputs larger
// than the caches). `o` may equal `g` or `s` (in place).
using ContigFn = void (*)(const KernelParams& p, const void* g, const void* s,
                          void* o, int64_t n, int64_t bit_offset, bool stream);

// The SIMD kernel for `op` when every operand has dtype `dtype`, or nullptr
// when there is none (the strided scalar kernel then serves unit strides).
ContigFn SimdContigKernel(OpKind op, DType dtype);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_ELEMENTWISE_SIMD_H_
