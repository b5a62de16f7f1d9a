// Every operator definition listed in OPSERVER_OPS (kernels/op_kind.h;
// the order here does not matter). No include guard: elementwise_simd.cc
// includes it once per SIMD target, and each definition compiles its vector
// form again for each.
#include "kernels/ops/dropout_backward.h"
#include "kernels/ops/hardswish_backward.h"
#include "kernels/ops/leaky_relu_backward.h"
#include "kernels/ops/softshrink_backward.h"
#include "kernels/ops/threshold_backward.h"
