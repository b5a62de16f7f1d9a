// aclnnDropoutBackward, written as the official aclnn sample is: it builds
// unchanged against CANN on an NPU host or against opserver's compatible
// headers and libaclnn_remote.so (the device is then the opserver named by
// OPSERVER_ADDRESS).
#include <iostream>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_dropout_backward.h"

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
  std::vector<int64_t> gradOutputShape = {4, 2};
  std::vector<int64_t> maskShape = {16};  // align(8, 128) / 8 bytes of bits.
  std::vector<int64_t> outShape = {4, 2};
  void* gradOutputDeviceAddr = nullptr;
  void* maskDeviceAddr = nullptr;
  void* outDeviceAddr = nullptr;
  aclTensor* gradOutput = nullptr;
  aclTensor* mask = nullptr;
  aclTensor* out = nullptr;
  std::vector<float> gradOutputHostData = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<uint8_t> maskHostData(16, 0);
  maskHostData[0] = 42;  // 0b00101010: elements 1, 3 and 5 are kept.
  std::vector<float> outHostData(8, 0);
  double scale = 2.0;
  ret = CreateAclTensor(gradOutputHostData, gradOutputShape,
                        &gradOutputDeviceAddr, aclDataType::ACL_FLOAT,
                        &gradOutput);
  CHECK_RET(ret == ACL_SUCCESS, return ret);
  ret = CreateAclTensor(maskHostData, maskShape, &maskDeviceAddr,
                        aclDataType::ACL_UINT8, &mask);
  CHECK_RET(ret == ACL_SUCCESS, return ret);
  ret = CreateAclTensor(outHostData, outShape, &outDeviceAddr,
                        aclDataType::ACL_FLOAT, &out);
  CHECK_RET(ret == ACL_SUCCESS, return ret);

  // 3. The operator: phase one, then the launch.
  uint64_t workspaceSize = 0;
  aclOpExecutor* executor;
  ret = aclnnDropoutBackwardGetWorkspaceSize(gradOutput, mask, scale, out,
                                             &workspaceSize, &executor);
  CHECK_RET(
      ret == ACL_SUCCESS,
      LOG_PRINT("aclnnDropoutBackwardGetWorkspaceSize failed. ERROR: %d: %s\n",
                ret, aclGetRecentErrMsg());
      return ret);
  void* workspaceAddr = nullptr;
  if (workspaceSize > 0) {
    ret = aclrtMalloc(&workspaceAddr, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS,
              LOG_PRINT("allocate workspace failed. ERROR: %d: %s\n", ret,
                        aclGetRecentErrMsg());
              return ret);
  }
  ret = aclnnDropoutBackward(workspaceAddr, workspaceSize, executor, stream);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclnnDropoutBackward failed. ERROR: %d: %s\n", ret,
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
  aclDestroyTensor(mask);
  aclDestroyTensor(out);

  // 7. Release device memory, the stream and the device.
  aclrtFree(gradOutputDeviceAddr);
  aclrtFree(maskDeviceAddr);
  aclrtFree(outDeviceAddr);
  if (workspaceSize > 0) {
    aclrtFree(workspaceAddr);
  }
  aclrtDestroyStream(stream);
  aclrtResetDevice(deviceId);
  aclFinalize();
  return 0;
}
