// The one table of element kernels, keyed by operator and operand dtypes,
// built from each operator's kKernels (kernels/ops/) and its loops on the
// CPU (op_loops.h). Internal to //devices/cpu: use plan.h.
#ifndef OPSERVER_DEVICES_CPU_KERNEL_TABLE_H_
#define OPSERVER_DEVICES_CPU_KERNEL_TABLE_H_

#include "devices/cpu/elementwise_simd.h"
#include "devices/cpu/kernel_types.h"
#include "kernels/dtype.h"
#include "kernels/op_kind.h"

namespace opserver::cpu {

struct Kernel {
  ContigFn contig = nullptr;  // SIMD, unit strides; may be null.
  StridedFn strided = nullptr;
};

// The kernel for `op` with gradOutput dtype `g`, self (mask for dropout)
// dtype `s` and output dtype `o`, or nullptr when the combination is not
// supported. The operators' checks (validate.h) decide what is valid; this
// table holds exactly the valid combinations.
const Kernel* FindKernel(kernels::OpKind op, kernels::DType g, kernels::DType s,
                         kernels::DType o);

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_KERNEL_TABLE_H_
