// The one table of element kernels, keyed by operator and operand dtypes.
// Internal to //kernels: use ops.h.
#ifndef OPSERVER_KERNELS_KERNEL_TABLE_H_
#define OPSERVER_KERNELS_KERNEL_TABLE_H_

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/elementwise_simd.h"
#include "kernels/op_kind.h"

namespace opserver::kernels {

// Computes n elements whose addresses advance by the given byte strides
// (any of them may be 0). `s` is self, or for DropoutBackward the mask
// bytes (not advanced; element i uses bit bit_offset + i).
using StridedFn = void (*)(const KernelParams& p, const char* g,
                           int64_t g_stride, const char* s, int64_t s_stride,
                           char* o, int64_t o_stride, int64_t n,
                           int64_t bit_offset);

struct Kernel {
  ContigFn contig = nullptr;  // SIMD, unit strides; may be null.
  StridedFn strided = nullptr;
};

// The kernel for `op` with gradOutput dtype `g`, self (mask for dropout)
// dtype `s` and output dtype `o`, or nullptr when the combination is not
// supported. The argument checks in ops.cc decide what is valid; this table
// holds exactly the valid combinations.
const Kernel* FindKernel(OpKind op, DType g, DType s, DType o);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_KERNEL_TABLE_H_
