// The operators' call signatures in aclnn's argument order, once, beside
// the operator definitions, for every surface that calls an operator by
// its signature: the C++ Session::ThresholdBackward(...) wrappers
// (client.h), the C API's aclnnXxxGetWorkspaceSize / aclnnXxx shims
// (aclnn_ops.cc), the Python module's typed calls, the Ascend device's
// calls into CANN (devices/ascend) and the soak's operator list. Each
// expands OPSERVER_OPERATORS; op_signatures_test checks the table against
// the kernels' registry, and the C shims and the Ascend device fail to
// compile when a signature differs from its aclnnop/ header. Tools that
// take operators from the server (opctl) need none of this: see
// client/op_catalog.h.
//
// A new operator: its line in OPSERVER_OPERATORS and its parameter list.
#ifndef OPSERVER_KERNELS_OP_SIGNATURES_H_
#define OPSERVER_KERNELS_OP_SIGNATURES_H_

// X(Name, in0, in1, out, PARAMS) once per operator, in aclnn's argument
// order: Name without the "aclnn" prefix, the two input tensors and the
// output tensor by their wire names (which also name the C and C++
// parameters), and PARAMS, the operator's parameter list below.
#define OPSERVER_OPERATORS(X)                                     \
  X(ThresholdBackward, gradOutput, self, out,                     \
    OPSERVER_THRESHOLD_BACKWARD_PARAMS)                           \
  X(SoftshrinkBackward, gradOutput, self, gradInput,              \
    OPSERVER_SOFTSHRINK_BACKWARD_PARAMS)                          \
  X(HardswishBackward, gradOutput, self, out, OPSERVER_NO_PARAMS) \
  X(LeakyReluBackward, gradOutput, self, out,                     \
    OPSERVER_LEAKY_RELU_BACKWARD_PARAMS)                          \
  X(DropoutBackward, gradOutput, mask, out, OPSERVER_DROPOUT_BACKWARD_PARAMS)

// PARAMS(P) calls P(KIND, aclnnName, field) per parameter, between the
// inputs and the output: `field` is its v1::OpParams field (and C++
// parameter name); KIND is how aclnn passes it and the C++ client takes it:
//   FLOAT   const aclScalar* (its value; nullptr is 161001)  double
//   SCALAR  const aclScalar* (dtype and value; nullptr too)  ScalarValue
//   DOUBLE  double                                           double
//   BOOL    bool                                             bool
#define OPSERVER_THRESHOLD_BACKWARD_PARAMS(P) P(FLOAT, threshold, threshold)
#define OPSERVER_SOFTSHRINK_BACKWARD_PARAMS(P) P(FLOAT, lambd, lambd)
#define OPSERVER_NO_PARAMS(P)
#define OPSERVER_LEAKY_RELU_BACKWARD_PARAMS(P) \
  P(SCALAR, negativeSlope, negative_slope)     \
  P(BOOL, selfIsResult, self_is_result)
#define OPSERVER_DROPOUT_BACKWARD_PARAMS(P) P(DOUBLE, scale, scale)

#endif  // OPSERVER_KERNELS_OP_SIGNATURES_H_
