// The fake CANN's aclnn calls (fake_cann.cc says what the fake is): the
// objects of aclnn/acl_meta.h and each operator's two functions.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "devices/ascend/fake_cann_state.h"

using fake_cann::Count;
using fake_cann::Dims;
using fake_cann::Fake;
using fake_cann::Injected;
using fake_cann::Log;
using fake_cann::PlanOp;
using fake_cann::RunOp;
using fake_cann::State;
using fake_cann::Where;

extern "C" {

// ---- aclnn/acl_meta.h ----

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum,
                           aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format,
                           const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
  if (Injected("aclCreateTensor") != 0) return nullptr;
  std::ostringstream line;
  line << "aclCreateTensor dtype=" << dataType
       << " shape=" << Dims(viewDims, viewDimsNum)
       << " strides=" << Dims(stride, viewDimsNum) << " offset=" << offset
       << " format=" << format
       << " storage=" << Dims(storageDims, storageDimsNum)
       << " data=" << Where(tensorData);
  auto* t =
      new aclTensor{std::vector<int64_t>(viewDims, viewDims + viewDimsNum)};
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  f.tensors.insert(t);
  f.live["tensor"] += 1;
  f.log.push_back(line.str());
  return t;
}

aclScalar* aclCreateScalar(void* value, aclDataType dataType) {
  std::ostringstream line;
  line << "aclCreateScalar dtype=" << dataType;
  if (dataType == ACL_FLOAT) {
    float v;
    std::memcpy(&v, value, sizeof(v));
    line << " value=" << v;
  } else if (dataType == ACL_DOUBLE) {
    double v;
    std::memcpy(&v, value, sizeof(v));
    line << " value=" << v;
  } else if (dataType == ACL_INT64) {
    int64_t v;
    std::memcpy(&v, value, sizeof(v));
    line << " value=" << v;
  }
  Log(line.str());
  Count("scalar", 1);
  return new aclScalar{dataType};
}

aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.tensors.erase(tensor) == 0) return ACLNN_ERR_PARAM_NULLPTR;
  f.live["tensor"] -= 1;
  f.log.push_back("aclDestroyTensor");
  delete tensor;
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyScalar(const aclScalar* scalar) {
  Log("aclDestroyScalar");
  Count("scalar", -1);
  delete scalar;
  return ACLNN_SUCCESS;
}

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor* executor) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.executors.count(executor) == 0) return ACLNN_ERR_INNER_NULLPTR;
  executor->repeatable = true;
  f.log.push_back("aclSetAclOpExecutorRepeatable");
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor* executor) {
  Fake& f = State();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.executors.count(executor) == 0 || !executor->repeatable) {
    return ACLNN_ERR_INNER_NULLPTR;
  }
  f.executors.erase(executor);
  f.live["executor"] -= 1;
  f.log.push_back("aclDestroyAclOpExecutor");
  delete executor;
  return ACLNN_SUCCESS;
}

// ---- aclnnop/aclnn_*.h ----

aclnnStatus aclnnThresholdBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar*,
    aclTensor* out, uint64_t* workspaceSize, aclOpExecutor** executor) {
  return PlanOp("aclnnThresholdBackwardGetWorkspaceSize", "ThresholdBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnThresholdBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return RunOp("aclnnThresholdBackward", workspace, workspaceSize, executor,
               stream);
}

aclnnStatus aclnnSoftshrinkBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar*,
    aclTensor* gradInput, uint64_t* workspaceSize, aclOpExecutor** executor) {
  return PlanOp("aclnnSoftshrinkBackwardGetWorkspaceSize", "SoftshrinkBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(gradInput));
}
aclnnStatus aclnnSoftshrinkBackward(void* workspace, uint64_t workspaceSize,
                                    aclOpExecutor* executor,
                                    aclrtStream stream) {
  return RunOp("aclnnSoftshrinkBackward", workspace, workspaceSize, executor,
               stream);
}

aclnnStatus aclnnHardswishBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                   const aclTensor* self,
                                                   aclTensor* out,
                                                   uint64_t* workspaceSize,
                                                   aclOpExecutor** executor) {
  return PlanOp("aclnnHardswishBackwardGetWorkspaceSize", "HardswishBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnHardswishBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return RunOp("aclnnHardswishBackward", workspace, workspaceSize, executor,
               stream);
}

aclnnStatus aclnnLeakyReluBackwardGetWorkspaceSize(
    const aclTensor* gradOutput, const aclTensor* self, const aclScalar*,
    bool selfIsResult, aclTensor* out, uint64_t* workspaceSize,
    aclOpExecutor** executor) {
  Log(std::string("selfIsResult=") + (selfIsResult ? "true" : "false"));
  return PlanOp("aclnnLeakyReluBackwardGetWorkspaceSize", "LeakyReluBackward",
                workspaceSize, executor, gradOutput, self,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnLeakyReluBackward(void* workspace, uint64_t workspaceSize,
                                   aclOpExecutor* executor,
                                   aclrtStream stream) {
  return RunOp("aclnnLeakyReluBackward", workspace, workspaceSize, executor,
               stream);
}

#ifndef FAKE_CANN_NO_DROPOUT
aclnnStatus aclnnDropoutBackwardGetWorkspaceSize(const aclTensor* gradOutput,
                                                 const aclTensor* mask,
                                                 double scale, aclTensor* out,
                                                 uint64_t* workspaceSize,
                                                 aclOpExecutor** executor) {
  // Not std::to_string: its vsnprintf crashed in glibc 2.36's printf_fp
  // on a thread of the test (this library's libc is a second copy, in
  // the namespace dlmopen made); the stream's formatting does not.
  std::ostringstream line;
  line << "scale=" << scale;
  Log(line.str());
  return PlanOp("aclnnDropoutBackwardGetWorkspaceSize", "DropoutBackward",
                workspaceSize, executor, gradOutput, mask,
                static_cast<const aclTensor*>(out));
}
aclnnStatus aclnnDropoutBackward(void* workspace, uint64_t workspaceSize,
                                 aclOpExecutor* executor, aclrtStream stream) {
  return RunOp("aclnnDropoutBackward", workspace, workspaceSize, executor,
               stream);
}
#endif

}  // extern "C"
