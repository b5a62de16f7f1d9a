// The C API's tensors, scalars and executors (aclnn/acl_meta.h):
// aclCreateTensor, aclCreateScalar, their destroys, and the executor calls
// aclSetAclOpExecutorRepeatable and aclDestroyAclOpExecutor.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "client/aclnn_state.h"
#include "client/client.h"
#include "kernels/dtype.h"
#include "kernels/scalar.h"

using opserver::Fail;
using opserver::FailAcl;
using opserver::GetState;
using opserver::State;

extern "C" {

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum,
                           aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format,
                           const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
  if (viewDimsNum > 0 && viewDims == nullptr) {
    Fail(0, "aclCreateTensor: viewDims is NULL");
    return nullptr;
  }
  if (viewDimsNum > 8 || storageDimsNum > 8) {
    Fail(0, "aclCreateTensor: more than 8 dimensions");
    return nullptr;
  }
  if (storageDimsNum > 0 && storageDims == nullptr) {
    Fail(0, "aclCreateTensor: storageDims is NULL");
    return nullptr;
  }
  auto* tensor = new aclTensor;
  tensor->shape.assign(viewDims, viewDims + viewDimsNum);
  if (stride != nullptr) tensor->strides.assign(stride, stride + viewDimsNum);
  if (storageDimsNum > 0) {
    tensor->storage_shape.assign(storageDims, storageDims + storageDimsNum);
  }
  tensor->dtype = dataType;
  tensor->format = format;
  tensor->offset = offset;
  tensor->data = reinterpret_cast<uintptr_t>(tensorData);
  return tensor;
}

aclScalar* aclCreateScalar(void* value, aclDataType dataType) {
  if (value == nullptr) {
    Fail(0, "aclCreateScalar: value is NULL");
    return nullptr;
  }
  // aclCreateScalar copies one element of `dataType` from `value`.
  const auto dtype = static_cast<opserver::kernels::DType>(dataType);
  const int64_t size = opserver::kernels::DTypeSize(dtype);
  absl::StatusOr<opserver::kernels::Scalar> scalar =
      size == 0 ? absl::InvalidArgumentError("unknown dtype")
                : opserver::kernels::Scalar::FromBytes(dtype, value, size);
  if (!scalar.ok()) {
    Fail(0, absl::StrCat("aclCreateScalar: unsupported aclDataType ",
                         static_cast<int>(dataType)));
    return nullptr;
  }
  return new aclScalar{dataType, scalar->AsDouble()};
}

aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
  delete tensor;
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyScalar(const aclScalar* scalar) {
  delete scalar;
  return ACLNN_SUCCESS;
}

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor* executor) {
  State& state = GetState();
  absl::MutexLock lock(&state.mu);
  auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
  if (it == state.executors.end()) {
    return Fail(ACLNN_ERR_INNER_NULLPTR,
                "aclSetAclOpExecutorRepeatable: executor is unknown, "
                "destroyed or already consumed");
  }
  absl::Status status = it->second.executor.SetRepeatable();
  if (!status.ok()) return opserver::FailAclnn(status);
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor* executor) {
  State& state = GetState();
  opserver::Pinned pinned;
  opserver::remote::Executor doomed;
  {
    absl::MutexLock lock(&state.mu);
    auto it = state.executors.find(reinterpret_cast<uintptr_t>(executor));
    if (it == state.executors.end()) {
      return Fail(ACLNN_ERR_INNER_NULLPTR,
                  "aclDestroyAclOpExecutor: executor is unknown, destroyed "
                  "or already consumed");
    }
    pinned = state.Pin(it->second.device);
    doomed = std::move(it->second.executor);
    state.executors.erase(it);
  }
  // The call runs without the lock.
  absl::Status status = doomed.Destroy();
  if (!status.ok()) return opserver::FailAclnn(status);
  return ACLNN_SUCCESS;
}

}  // extern "C"
