// The one table of element kernels, keyed by operator and operand dtypes,
// built from each operator's kKernels (kernels/ops/). Internal to
// //kernels: use ops.h.
#ifndef OPSERVER_KERNELS_KERNEL_TABLE_H_
#define OPSERVER_KERNELS_KERNEL_TABLE_H_

#include "kernels/dtype.h"
#include "kernels/elementwise_simd.h"
#include "kernels/kernel_types.h"
#include "kernels/op_kind.h"

namespace opserver::kernels {

struct Kernel {
  ContigFn contig = nullptr;  // SIMD, unit strides; may be null.
  StridedFn strided = nullptr;
};

// The kernel for `op` with gradOutput dtype `g`, self (mask for dropout)
// dtype `s` and output dtype `o`, or nullptr when the combination is not
// supported. The operators' checks (validate.h) decide what is valid; this
// table holds exactly the valid combinations.
const Kernel* FindKernel(OpKind op, DType g, DType s, DType o);

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_KERNEL_TABLE_H_
