// The aclnn-compatible C API's operators (aclnnop/aclnn_*_backward.h): each
// is a GetWorkspaceSize shim (opserver::Plan) and a launch shim
// (opserver::Launch), forwarded to the opserver through the C++ client.
// Both are generated from OPSERVER_OPERATORS (kernels/op_signatures.h); a
// new operator needs its line there and its aclnnop/ header here.

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "client/aclnn_state.h"
#include "client/client.h"
#include "kernels/op_signatures.h"

namespace {

// A GetWorkspaceSize shim's answer to a nullptr scalar argument `name`.
aclnnStatus NullScalar(const char* function, const char* name) {
  return opserver::Fail(ACLNN_ERR_PARAM_NULLPTR,
                        absl::StrCat(function, ": ", name, " is nullptr"));
}

}  // namespace

extern "C" {

// Phase one: each shim names its function (__func__, for error messages),
// the server's operator, its parameters and its tensors. A shim whose
// signature drifted from its header's declaration fails to compile (two C
// functions of one name).
#define OPSERVER_C_PARAM_FLOAT const aclScalar*
#define OPSERVER_C_PARAM_SCALAR const aclScalar*
#define OPSERVER_C_PARAM_DOUBLE double
#define OPSERVER_C_PARAM_BOOL bool
#define OPSERVER_C_PARAM(KIND, name, field) , OPSERVER_C_PARAM_##KIND name

#define OPSERVER_C_SET_PARAM_FLOAT(name, field)            \
  if (name == nullptr) return NullScalar(__func__, #name); \
  params.set_##field(name->value);
#define OPSERVER_C_SET_PARAM_SCALAR(name, field)           \
  if (name == nullptr) return NullScalar(__func__, #name); \
  params.mutable_##field()->set_dtype(                     \
      static_cast<opserver::v1::DataType>(name->dtype));   \
  params.mutable_##field()->set_value(name->value);
#define OPSERVER_C_SET_PARAM_DOUBLE(name, field) params.set_##field(name);
#define OPSERVER_C_SET_PARAM_BOOL(name, field) params.set_##field(name);
#define OPSERVER_C_SET_PARAM(KIND, name, field) \
  OPSERVER_C_SET_PARAM_##KIND(name, field)

#define OPSERVER_ACLNN_GET_WORKSPACE_SIZE(Name, in0, in1, out, PARAMS)     \
  aclnnStatus aclnn##Name##GetWorkspaceSize(                               \
      const aclTensor* in0, const aclTensor* in1 PARAMS(OPSERVER_C_PARAM), \
      aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor) { \
    opserver::v1::OpParams params;                                         \
    PARAMS(OPSERVER_C_SET_PARAM)                                           \
    return opserver::Plan(__func__, #Name, params,                         \
                          {{#in0, in0}, {#in1, in1}, {#out, out}},         \
                          workspaceSize, executor);                        \
  }
OPSERVER_OPERATORS(OPSERVER_ACLNN_GET_WORKSPACE_SIZE)
#undef OPSERVER_ACLNN_GET_WORKSPACE_SIZE

// Phase two: the same for every operator.
#define OPSERVER_ACLNN_LAUNCH(Name, in0, in1, out, PARAMS)                     \
  aclnnStatus aclnn##Name(void* workspace, uint64_t workspaceSize,             \
                          aclOpExecutor* executor, aclrtStream stream) {       \
    return opserver::Launch("aclnn" #Name, workspace, workspaceSize, executor, \
                            stream);                                           \
  }
OPSERVER_OPERATORS(OPSERVER_ACLNN_LAUNCH)
#undef OPSERVER_ACLNN_LAUNCH

}  // extern "C"
