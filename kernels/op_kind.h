// The operators, one line each, in registry order (ListOperators lists them
// so). Everything per operator is driven from this list: the OpKind values,
// the registry with each operator's checks (validate.cc), the element-kernel
// table (kernel_table.cc) and the SIMD kernels (elementwise_simd.cc).
//
// X(Name) names the definition in kernels/ops/, included by
// kernels/ops/all.h: struct Name (registry entry, checks, scalar formula,
// dtype combinations) and, per SIMD target, struct Name##Simd (the vector
// form). Adding an operator: its file there, its line here and its
// #include in all.h.
#ifndef OPSERVER_KERNELS_OP_KIND_H_
#define OPSERVER_KERNELS_OP_KIND_H_

#define OPSERVER_OPS(X) \
  X(ThresholdBackward)  \
  X(SoftshrinkBackward) \
  X(HardswishBackward)  \
  X(LeakyReluBackward)  \
  X(DropoutBackward)

namespace opserver::kernels {

enum class OpKind {
#define OPSERVER_OP_KIND(Name) k##Name,
  OPSERVER_OPS(OPSERVER_OP_KIND)
#undef OPSERVER_OP_KIND
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OP_KIND_H_
