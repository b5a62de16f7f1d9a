// aclnnLeakyReluBackward, written as the official aclnn sample is: it builds
// unchanged against CANN on an NPU host or against opserver's compatible
// headers and libaclnn_remote.so (the device is then the opserver named by
// OPSERVER_ADDRESS).
#include <iostream>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"

#define CHECK_RET(cond, return_expr) \
  do {                               \
    if (!(cond)) {                   \
      return_expr;                   \
    }                                \
  } while (0)

#define LOG_PRINT(message, ...)     \
  do {                              \
    printf(message, ##__VA_ARGS__); \
  } while (0)

int64_t GetShapeSize(const std::vector<int64_t>& shape) {
  int64_t shapeSize = 1;
  for (auto i : shape) {
    shapeSize *= i;
  }
  return shapeSize;
}

int Init(int32_t deviceId, aclrtStream* stream) {
  // Fixed boilerplate: initialise acl, set the device, create a stream.
  auto ret = aclInit(nullptr);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclInit failed. ERROR: %d: %s\n",
                                          ret, aclGetRecentErrMsg());
            return ret);
  ret = aclrtSetDevice(deviceId);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclrtSetDevice failed. ERROR: %d: %s\n", ret,
                      aclGetRecentErrMsg());
            return ret);
  ret = aclrtCreateStream(stream);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclrtCreateStream failed. ERROR: %d: %s\n", ret,
                      aclGetRecentErrMsg());
            return ret);
  return 0;
}

template <typename T>
int CreateAclTensor(const std::vector<T>& hostData,
                    const std::vector<int64_t>& shape, void** deviceAddr,
                    aclDataType dataType, aclTensor** tensor) {
  auto size = GetShapeSize(shape) * sizeof(T);
  // Device memory for the tensor.
  auto ret = aclrtMalloc(deviceAddr, size, ACL_MEM_MALLOC_HUGE_FIRST);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMalloc failed. ERROR: %d: %s\n",
                                          ret, aclGetRecentErrMsg());
            return ret);
  // Host data to the device.
  ret = aclrtMemcpy(*deviceAddr, size, hostData.data(), size,
                    ACL_MEMCPY_HOST_TO_DEVICE);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMemcpy failed. ERROR: %d: %s\n",
                                          ret, aclGetRecentErrMsg());
            return ret);

  // Contiguous strides.
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = shape.size() - 2; i >= 0; i--) {
    strides[i] = shape[i + 1] * strides[i + 1];
  }

  *tensor = aclCreateTensor(shape.data(), shape.size(), dataType,
                            strides.data(), 0, aclFormat::ACL_FORMAT_ND,
                            shape.data(), shape.size(), *deviceAddr);
  return 0;
}

int main() {
  // 1. Device and stream.
  int32_t deviceId = 0;
  aclrtStream stream;
  auto ret = Init(deviceId, &stream);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("Init acl failed. ERROR: %d: %s\n",
                                          ret, aclGetRecentErrMsg());
            return ret);

  // 2. Inputs and outputs.
  std::vector<int64_t> gradOutputShape = {2, 2};
  std::vector<int64_t> selfShape = {2, 2};
  std::vector<int64_t> outShape = {2, 2};
  void* gradOutputDeviceAddr = nullptr;
  void* selfDeviceAddr = nullptr;
  void* outDeviceAddr = nullptr;
  aclTensor* gradOutput = nullptr;
  aclTensor* self = nullptr;
  aclScalar* negativeSlope = nullptr;
  aclTensor* out = nullptr;
  std::vector<float> gradOutputHostData = {1, 2, 3, 4};
  std::vector<float> selfHostData = {-1, 0, 1, 2};
  std::vector<float> outHostData = {0, 0, 0, 0};
  float negativeSlopeValue = 0.01f;
  bool selfIsResult = true;
  ret = CreateAclTensor(gradOutputHostData, gradOutputShape,
                        &gradOutputDeviceAddr, aclDataType::ACL_FLOAT,
                        &gradOutput);
  CHECK_RET(ret == ACL_SUCCESS, return ret);
  ret = CreateAclTensor(selfHostData, selfShape, &selfDeviceAddr,
                        aclDataType::ACL_FLOAT, &self);
  CHECK_RET(ret == ACL_SUCCESS, return ret);
  negativeSlope = aclCreateScalar(&negativeSlopeValue, aclDataType::ACL_FLOAT);
  CHECK_RET(negativeSlope != nullptr, return ret);
  ret = CreateAclTensor(outHostData, outShape, &outDeviceAddr,
                        aclDataType::ACL_FLOAT, &out);
  CHECK_RET(ret == ACL_SUCCESS, return ret);

  // 3. The operator: phase one, then the launch.
  uint64_t workspaceSize = 0;
  aclOpExecutor* executor;
  ret = aclnnLeakyReluBackwardGetWorkspaceSize(gradOutput, self, negativeSlope,
                                               selfIsResult, out,
                                               &workspaceSize, &executor);
  CHECK_RET(
      ret == ACL_SUCCESS,
      LOG_PRINT(
          "aclnnLeakyReluBackwardGetWorkspaceSize failed. ERROR: %d: %s\n", ret,
          aclGetRecentErrMsg());
      return ret);
  void* workspaceAddr = nullptr;
  if (workspaceSize > 0) {
    ret = aclrtMalloc(&workspaceAddr, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS,
              LOG_PRINT("allocate workspace failed. ERROR: %d: %s\n", ret,
                        aclGetRecentErrMsg());
              return ret);
  }
  ret = aclnnLeakyReluBackward(workspaceAddr, workspaceSize, executor, stream);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclnnLeakyReluBackward failed. ERROR: %d: %s\n", ret,
                      aclGetRecentErrMsg());
            return ret);

  // 4. Wait for the stream.
  ret = aclrtSynchronizeStream(stream);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclrtSynchronizeStream failed. ERROR: %d: %s\n", ret,
                      aclGetRecentErrMsg());
            return ret);

  // 5. The result back to the host.
  auto size = GetShapeSize(outShape);
  std::vector<float> resultData(size, 0);
  ret = aclrtMemcpy(resultData.data(),
                    resultData.size() * sizeof(resultData[0]), outDeviceAddr,
                    size * sizeof(resultData[0]), ACL_MEMCPY_DEVICE_TO_HOST);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("copy result from device to host failed. ERROR: %d: %s\n",
                      ret, aclGetRecentErrMsg());
            return ret);
  for (int64_t i = 0; i < size; i++) {
    LOG_PRINT("result[%ld] is: %f\n", i, resultData[i]);
  }

  // 6. Release the aclTensors and aclScalars.
  aclDestroyTensor(gradOutput);
  aclDestroyTensor(self);
  aclDestroyScalar(negativeSlope);
  aclDestroyTensor(out);

  // 7. Release device memory, the stream and the device.
  aclrtFree(gradOutputDeviceAddr);
  aclrtFree(selfDeviceAddr);
  aclrtFree(outDeviceAddr);
  if (workspaceSize > 0) {
    aclrtFree(workspaceAddr);
  }
  aclrtDestroyStream(stream);
  aclrtResetDevice(deviceId);
  aclFinalize();
  return 0;
}
