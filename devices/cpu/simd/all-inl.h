// Every operator's vector form, for elementwise_simd.cc, which Highway
// compiles once per SIMD target. No include guard: each vector form has its
// per-target one. An operator without a vector form here runs its strided
// (scalar-formula) kernel on the CPU.
#include "devices/cpu/simd/dropout_backward-inl.h"
#include "devices/cpu/simd/hardswish_backward-inl.h"
#include "devices/cpu/simd/leaky_relu_backward-inl.h"
#include "devices/cpu/simd/softshrink_backward-inl.h"
#include "devices/cpu/simd/threshold_backward-inl.h"
