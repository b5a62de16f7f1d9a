// A program written the way InfiniCore's Ascend runtime layer drives a
// device, compiled against the C API's headers only: a thin runtime table
// over aclrt* calls (device count, streams with config, events, pinned host
// memory, 32-byte-aligned device memory, asynchronous copies), and a step
// that uses it: inputs copied in on one stream, an operator on another that
// waits for them through an event, the result copied back asynchronously
// and polled for with aclrtQueryEventStatus. The numbers must be the host's.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "gtest/gtest.h"
#include "server/server.h"

// ---- The runtime layer, in InfiniCore's shape: every call returns a
// status, and a failing ACL call says which one failed. ----
namespace infinirt_style {

enum Status { kSuccess = 0, kInternalError = 1 };

#define CHECK_ACL(call)                                        \
  do {                                                         \
    aclError error_ = (call);                                  \
    if (error_ != ACL_SUCCESS) {                               \
      ADD_FAILURE() << #call << " returned " << error_ << ": " \
                    << aclGetRecentErrMsg();                   \
      return kInternalError;                                   \
    }                                                          \
  } while (0)

using Stream = aclrtStream;
using Event = aclrtEvent;

Status getDeviceCount(int* count) {
  uint32_t n = 0;
  CHECK_ACL(aclrtGetDeviceCount(&n));
  *count = static_cast<int>(n);
  return kSuccess;
}
Status setDevice(int id) {
  CHECK_ACL(aclrtSetDevice(id));
  return kSuccess;
}
Status deviceSynchronize() {
  CHECK_ACL(aclrtSynchronizeDevice());
  return kSuccess;
}
Status streamCreate(Stream* stream) {
  CHECK_ACL(aclrtCreateStreamWithConfig(stream, 0, ACL_STREAM_FAST_LAUNCH));
  return kSuccess;
}
Status streamDestroy(Stream stream) {
  CHECK_ACL(aclrtDestroyStream(stream));
  return kSuccess;
}
Status streamSynchronize(Stream stream) {
  CHECK_ACL(aclrtSynchronizeStream(stream));
  return kSuccess;
}
Status streamWaitEvent(Stream stream, Event event) {
  CHECK_ACL(aclrtStreamWaitEvent(stream, event));
  return kSuccess;
}
Status eventCreate(Event* event) {
  CHECK_ACL(aclrtCreateEvent(event));
  return kSuccess;
}
Status eventRecord(Event event, Stream stream) {
  CHECK_ACL(aclrtRecordEvent(event, stream));
  return kSuccess;
}
// Complete or not, as InfiniCore's eventQuery reports it.
Status eventQuery(Event event, bool* complete) {
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  CHECK_ACL(aclrtQueryEventStatus(event, &status));
  *complete = status == ACL_EVENT_RECORDED_STATUS_COMPLETE;
  return kSuccess;
}
Status eventSynchronize(Event event) {
  CHECK_ACL(aclrtSynchronizeEvent(event));
  return kSuccess;
}
Status eventDestroy(Event event) {
  CHECK_ACL(aclrtDestroyEvent(event));
  return kSuccess;
}
Status mallocDevice(void** p, size_t size) {
  CHECK_ACL(aclrtMallocAlign32(p, size, ACL_MEM_MALLOC_HUGE_FIRST));
  return kSuccess;
}
Status freeDevice(void* p) {
  CHECK_ACL(aclrtFree(p));
  return kSuccess;
}
Status mallocHost(void** p, size_t size) {
  CHECK_ACL(aclrtMallocHost(p, size));
  return kSuccess;
}
Status freeHost(void* p) {
  CHECK_ACL(aclrtFreeHost(p));
  return kSuccess;
}
Status memcpyAsync(void* dst, const void* src, size_t size,
                   aclrtMemcpyKind kind, Stream stream) {
  CHECK_ACL(aclrtMemcpyAsync(dst, size, src, size, kind, stream));
  return kSuccess;
}

#undef CHECK_ACL

}  // namespace infinirt_style

namespace opserver {
namespace {

namespace rt = infinirt_style;

aclTensor* Tensor(void* data, int64_t rows, int64_t cols) {
  const int64_t shape[] = {rows, cols};
  const int64_t strides[] = {cols, 1};
  return aclCreateTensor(shape, 2, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, shape,
                         2, data);
}

// The spec's derivative: closed interval, so d(-3) = -0.5 and d(3) = 1.5.
float HardswishGrad(float g, float x) {
  if (x < -3) return 0;
  if (x > 3) return g;
  return g * (x / 3 + 0.5f);
}

TEST(InfinirtStyleTest, AStepOverTwoStreamsWithEvents) {
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  setenv("OPSERVER_ADDRESS", (*server)->address().c_str(), 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);

  int count = 0;
  ASSERT_EQ(rt::getDeviceCount(&count), rt::kSuccess);
  ASSERT_GE(count, 1);
  ASSERT_EQ(rt::setDevice(0), rt::kSuccess);
  rt::Stream copy_stream, compute_stream;
  ASSERT_EQ(rt::streamCreate(&copy_stream), rt::kSuccess);
  ASSERT_EQ(rt::streamCreate(&compute_stream), rt::kSuccess);
  rt::Event inputs_ready, done;
  ASSERT_EQ(rt::eventCreate(&inputs_ready), rt::kSuccess);
  ASSERT_EQ(rt::eventCreate(&done), rt::kSuccess);

  const int64_t rows = 16, cols = 37, n = rows * cols;
  const size_t bytes = n * sizeof(float);
  float *grad = nullptr, *x = nullptr, *out = nullptr;
  ASSERT_EQ(rt::mallocHost(reinterpret_cast<void**>(&grad), bytes),
            rt::kSuccess);
  ASSERT_EQ(rt::mallocHost(reinterpret_cast<void**>(&x), bytes), rt::kSuccess);
  ASSERT_EQ(rt::mallocHost(reinterpret_cast<void**>(&out), bytes),
            rt::kSuccess);
  for (int64_t i = 0; i < n; ++i) {
    grad[i] = 0.25f * static_cast<float>(i % 9) - 1;
    x[i] = 0.0625f * static_cast<float>(i % 128) - 4;
    out[i] = NAN;
  }
  void *d_grad, *d_x, *d_hardswish, *d_leaky;
  for (void** p : {&d_grad, &d_x, &d_hardswish, &d_leaky}) {
    ASSERT_EQ(rt::mallocDevice(p, bytes), rt::kSuccess);
  }

  // Inputs in on the copy stream; the compute stream waits for them
  // through the event, never the host.
  ASSERT_EQ(rt::memcpyAsync(d_grad, grad, bytes, ACL_MEMCPY_HOST_TO_DEVICE,
                            copy_stream),
            rt::kSuccess);
  ASSERT_EQ(
      rt::memcpyAsync(d_x, x, bytes, ACL_MEMCPY_HOST_TO_DEVICE, copy_stream),
      rt::kSuccess);
  ASSERT_EQ(rt::eventRecord(inputs_ready, copy_stream), rt::kSuccess);
  ASSERT_EQ(rt::streamWaitEvent(compute_stream, inputs_ready), rt::kSuccess);

  aclTensor* g = Tensor(d_grad, rows, cols);
  aclTensor* t = Tensor(d_x, rows, cols);
  aclTensor* h = Tensor(d_hardswish, rows, cols);
  aclTensor* l = Tensor(d_leaky, rows, cols);
  uint64_t workspace = 0;
  aclOpExecutor* executor = nullptr;
  ASSERT_EQ(
      aclnnHardswishBackwardGetWorkspaceSize(g, t, h, &workspace, &executor),
      ACL_SUCCESS)
      << aclGetRecentErrMsg();
  ASSERT_EQ(aclnnHardswishBackward(nullptr, 0, executor, compute_stream),
            ACL_SUCCESS);
  // The second operator takes the first one's output as its gradient.
  float slope = 0.125f;
  aclScalar* negative_slope = aclCreateScalar(&slope, ACL_FLOAT);
  ASSERT_EQ(aclnnLeakyReluBackwardGetWorkspaceSize(h, t, negative_slope, false,
                                                   l, &workspace, &executor),
            ACL_SUCCESS)
      << aclGetRecentErrMsg();
  ASSERT_EQ(aclnnLeakyReluBackward(nullptr, 0, executor, compute_stream),
            ACL_SUCCESS);
  ASSERT_EQ(rt::memcpyAsync(out, d_leaky, bytes, ACL_MEMCPY_DEVICE_TO_HOST,
                            compute_stream),
            rt::kSuccess);
  ASSERT_EQ(rt::eventRecord(done, compute_stream), rt::kSuccess);

  // InfiniCore polls its events; it synchronizes the stream before it
  // reads the copied bytes (CANN's rule for asynchronous copies).
  bool complete = false;
  for (int i = 0; i < 10000 && !complete; ++i) {
    ASSERT_EQ(rt::eventQuery(done, &complete), rt::kSuccess);
  }
  ASSERT_EQ(rt::eventSynchronize(done), rt::kSuccess);
  ASSERT_EQ(rt::eventQuery(done, &complete), rt::kSuccess);
  EXPECT_TRUE(complete);
  ASSERT_EQ(rt::streamSynchronize(compute_stream), rt::kSuccess);
  ASSERT_EQ(rt::deviceSynchronize(), rt::kSuccess);

  for (int64_t i = 0; i < n; ++i) {
    const float hardswish = HardswishGrad(grad[i], x[i]);
    const float expected = x[i] > 0 ? hardswish : hardswish * slope;
    ASSERT_FLOAT_EQ(out[i], expected) << i << ": x " << x[i];
  }

  aclDestroyTensor(g);
  aclDestroyTensor(t);
  aclDestroyTensor(h);
  aclDestroyTensor(l);
  aclDestroyScalar(negative_slope);
  for (void* p : {d_grad, d_x, d_hardswish, d_leaky}) {
    EXPECT_EQ(rt::freeDevice(p), rt::kSuccess);
  }
  for (float* p : {grad, x, out}) EXPECT_EQ(rt::freeHost(p), rt::kSuccess);
  EXPECT_EQ(rt::eventDestroy(inputs_ready), rt::kSuccess);
  EXPECT_EQ(rt::eventDestroy(done), rt::kSuccess);
  EXPECT_EQ(rt::streamDestroy(copy_stream), rt::kSuccess);
  EXPECT_EQ(rt::streamDestroy(compute_stream), rt::kSuccess);
  EXPECT_EQ(aclrtResetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver
