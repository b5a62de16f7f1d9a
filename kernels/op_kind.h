// The operator identifiers, shared by the operator table and the kernels.
#ifndef OPSERVER_KERNELS_OP_KIND_H_
#define OPSERVER_KERNELS_OP_KIND_H_

namespace opserver::kernels {

enum class OpKind {
  kThresholdBackward,
  kSoftshrinkBackward,
  kHardswishBackward,
  kLeakyReluBackward,
  kDropoutBackward,
};

}  // namespace opserver::kernels

#endif  // OPSERVER_KERNELS_OP_KIND_H_
