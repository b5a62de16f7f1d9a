// Every operator definition listed in OPSERVER_OPS (kernels/op_kind.h;
// the order here does not matter): what the registry (validate.cc) and a
// device's tables (the CPU's kernel_table.cc, elementwise_simd.cc) are
// built from.
#ifndef OPSERVER_KERNELS_OPS_ALL_H_
#define OPSERVER_KERNELS_OPS_ALL_H_

#include "kernels/ops/dropout_backward.h"
#include "kernels/ops/hardswish_backward.h"
#include "kernels/ops/leaky_relu_backward.h"
#include "kernels/ops/softshrink_backward.h"
#include "kernels/ops/threshold_backward.h"

#endif  // OPSERVER_KERNELS_OPS_ALL_H_
