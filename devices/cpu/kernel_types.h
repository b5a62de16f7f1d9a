// The two signatures of the CPU's element kernels: contiguous SIMD
// (elementwise_simd.h) and strided (op_loops.h). Internal to //devices/cpu.
#ifndef OPSERVER_DEVICES_CPU_KERNEL_TYPES_H_
#define OPSERVER_DEVICES_CPU_KERNEL_TYPES_H_

#include <cstdint>

#include "kernels/kernel_params.h"

namespace opserver::cpu {

// Computes n elements of unit-stride operands. `g` is gradOutput, `s` is
// self (or, for an operator whose second input is a bit mask, the mask
// bytes, element i using bit bit_offset + i). `stream` asks for
// non-temporal stores (for outputs larger than the caches). `o` may equal
// `g` or `s` (in place).
using ContigFn = void (*)(const kernels::KernelParams& p, const void* g,
                          const void* s, void* o, int64_t n, int64_t bit_offset,
                          bool stream);

// Computes n elements whose addresses advance by the given byte strides
// (any of them may be 0). `s` is self, or a bit mask (not advanced; element
// i uses bit bit_offset + i).
using StridedFn = void (*)(const kernels::KernelParams& p, const char* g,
                           int64_t g_stride, const char* s, int64_t s_stride,
                           char* o, int64_t o_stride, int64_t n,
                           int64_t bit_offset);

}  // namespace opserver::cpu

#endif  // OPSERVER_DEVICES_CPU_KERNEL_TYPES_H_
