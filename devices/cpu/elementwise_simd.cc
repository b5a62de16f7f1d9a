// Highway re-includes this file once per target instruction set; each pass
// compiles every operator's vector form (simd/all-inl.h) for that target.
#include "devices/cpu/elementwise_simd.h"

#include <cstddef>
#include <utility>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "devices/cpu/elementwise_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h must come first.
#include "devices/cpu/op_loops.h"
#include "devices/cpu/simd/all-inl.h"
#include "hwy/highway.h"
#include "kernels/ops/all.h"

HWY_BEFORE_NAMESPACE();
namespace opserver {
namespace cpu {
namespace HWY_NAMESPACE {

using kernels::DType;
using kernels::DTypes;
using kernels::OpKind;
#define OPSERVER_USING(Name) using kernels::Name;
OPSERVER_OPS(OPSERVER_USING)
#undef OPSERVER_USING

// Op##Simd::Contig for out dtype `dt` when combination I of Op::kKernels
// has a SIMD kernel for it (OpLoops<Op>::Simd), else nullptr.
template <class Op, class OpSimd, size_t I>
ContigFn ContigAt(DType dt) {
  constexpr DTypes d = Op::kKernels[I];
  if constexpr (OpLoops<Op>::Simd(d)) {
    if (d.o == dt) return &OpSimd::template Contig<SimdType<d.o>>;
  }
  return nullptr;
}

template <class Op, class OpSimd, size_t... I>
ContigFn ContigOf(DType dt, std::index_sequence<I...>) {
  ContigFn fn = nullptr;
  ((fn = fn != nullptr ? fn : ContigAt<Op, OpSimd, I>(dt)), ...);
  return fn;
}

// This target's contiguous kernel for `op` and dtype `dt`, or nullptr.
ContigFn SelectContig(OpKind op, DType dt) {
#define OPSERVER_SELECT(Name)                                   \
  if (op == OpKind::k##Name) {                                  \
    return ContigOf<Name, Name##Simd>(                          \
        dt, std::make_index_sequence<Name::kKernels.size()>()); \
  }
  OPSERVER_OPS(OPSERVER_SELECT)
#undef OPSERVER_SELECT
  return nullptr;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace opserver
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace opserver {
namespace cpu {

using kernels::DType;
using kernels::OpKind;

HWY_EXPORT(SelectContig);

ContigFn SimdContigKernel(OpKind op, DType dtype) {
  // The pointer comes from the best target of the running CPU.
  return HWY_DYNAMIC_DISPATCH(SelectContig)(op, dtype);
}

}  // namespace cpu
}  // namespace opserver
#endif  // HWY_ONCE
