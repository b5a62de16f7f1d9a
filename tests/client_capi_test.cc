// The aclnn-compatible C API against a real Server on a free loopback port:
// opaque device pointers and their arithmetic, every operator and dtype,
// broadcast and strided views, executors, and the exact acl/aclnn code plus
// aclGetRecentErrMsg() of each error path.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_dropout_backward.h"
#include "aclnnop/aclnn_hardswish_backward.h"
#include "aclnnop/aclnn_leaky_relu_backward.h"
#include "aclnnop/aclnn_softshrink_backward.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/half.h"
#include "server/server.h"
#include "testing/closed_port.h"
#include "testing/metrics_scrape.h"

namespace opserver {
namespace {

using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string LastError() { return aclGetRecentErrMsg(); }

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartServer("127.0.0.1:0");
    setenv("OPSERVER_ADDRESS", server_->address().c_str(), 1);
    unsetenv("OPSERVER_TIMEOUT_MS");
    unsetenv("OPSERVER_SYNC_TIMEOUT_MS");
    // The tests keep Abseil's lock-order checking (aclInit turns it off).
    setenv("OPSERVER_DETECT_MUTEX_DEADLOCKS", "1", 1);
    ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
    ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
    ASSERT_EQ(aclrtCreateStream(&stream_), ACL_SUCCESS) << LastError();
  }

  void TearDown() override {
    for (aclTensor* t : tensors_) aclDestroyTensor(t);
    if (stream_ != nullptr) aclrtDestroyStream(stream_);
    aclrtResetDevice(0);
    aclFinalize();
  }

  void StartServer(const std::string& listen) {
    Options options;
    options.listen = listen;
    options.threads = 2;
    options.metrics_listen = "127.0.0.1:0";
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // aclInit with the environment as it is now, device 0, and `size` bytes
  // of device memory (nullptr, the failure reported, when any step fails).
  void* InitAndMalloc(size_t size) {
    void* device = nullptr;
    if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS ||
        aclrtMalloc(&device, size, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) {
      ADD_FAILURE() << LastError();
      return nullptr;
    }
    return device;
  }

  // Device memory holding `bytes`.
  void* Device(const void* bytes, size_t size) {
    void* pointer = nullptr;
    EXPECT_EQ(aclrtMalloc(&pointer, size, ACL_MEM_MALLOC_HUGE_FIRST),
              ACL_SUCCESS)
        << LastError();
    EXPECT_EQ(
        aclrtMemcpy(pointer, size, bytes, size, ACL_MEMCPY_HOST_TO_DEVICE),
        ACL_SUCCESS)
        << LastError();
    return pointer;
  }
  template <typename T>
  void* Device(const std::vector<T>& values) {
    return Device(values.data(), values.size() * sizeof(T));
  }

  template <typename T>
  std::vector<T> Host(const void* device, size_t n) {
    std::vector<T> out(n);
    EXPECT_EQ(aclrtMemcpy(out.data(), n * sizeof(T), device, n * sizeof(T),
                          ACL_MEMCPY_DEVICE_TO_HOST),
              ACL_SUCCESS)
        << LastError();
    return out;
  }

  aclTensor* Tensor(void* data, std::vector<int64_t> shape, aclDataType dtype,
                    std::vector<int64_t> strides = {}, int64_t offset = 0,
                    std::vector<int64_t> storage = {}) {
    if (storage.empty()) storage = shape;
    aclTensor* t =
        aclCreateTensor(shape.data(), shape.size(), dtype,
                        strides.empty() ? nullptr : strides.data(), offset,
                        ACL_FORMAT_ND, storage.data(), storage.size(), data);
    EXPECT_NE(t, nullptr) << LastError();
    tensors_.push_back(t);
    return t;
  }

  // Launches a planned executor with no workspace and waits for it.
  aclnnStatus RunThreshold(aclTensor* grad, aclTensor* self, float threshold,
                           aclTensor* out) {
    aclScalar* scalar = aclCreateScalar(&threshold, ACL_FLOAT);
    uint64_t workspace = 0;
    aclOpExecutor* executor = nullptr;
    aclnnStatus status = aclnnThresholdBackwardGetWorkspaceSize(
        grad, self, scalar, out, &workspace, &executor);
    aclDestroyScalar(scalar);
    if (status != ACLNN_SUCCESS) return status;
    EXPECT_EQ(workspace, 0u);
    status = aclnnThresholdBackward(nullptr, 0, executor, stream_);
    if (status != ACLNN_SUCCESS) return status;
    EXPECT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS) << LastError();
    return ACLNN_SUCCESS;
  }

  std::unique_ptr<Server> server_;
  aclrtStream stream_ = nullptr;
  std::vector<aclTensor*> tensors_;
};

TEST_F(CApiTest, PointerArithmeticWithinOneAllocation) {
  // One allocation holds gradOutput at +0, self at +16 and out at +32.
  std::vector<float> host = {4.5, 4.4, 4.3, 4.2, 0.2, 1.2,
                             2.2, 3.2, -1,  -1,  -1,  -1};
  char* base = static_cast<char*>(Device(host));
  ASSERT_EQ(RunThreshold(Tensor(base, {4}, ACL_FLOAT),
                         Tensor(base + 16, {4}, ACL_FLOAT), 1.0f,
                         Tensor(base + 32, {4}, ACL_FLOAT)),
            ACLNN_SUCCESS)
      << LastError();
  EXPECT_THAT(Host<float>(base + 32, 4), ElementsAre(0, 4.4f, 4.3f, 4.2f));
  EXPECT_THAT(Host<float>(base + 36, 2), ElementsAre(4.4f, 4.3f));

  // A copy running past the allocation, and a pointer into nothing.
  float scratch[8];
  EXPECT_EQ(aclrtMemcpy(scratch, sizeof(scratch), base + 40, 16,
                        ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("past the end"));
  EXPECT_EQ(aclrtMemcpy(scratch, sizeof(scratch), base + 4096, 4,
                        ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("not inside any live aclrtMalloc"));
  // Device to device inside the same allocation.
  ASSERT_EQ(aclrtMemcpy(base, 16, base + 32, 16, ACL_MEMCPY_DEVICE_TO_DEVICE),
            ACL_SUCCESS)
      << LastError();
  EXPECT_THAT(Host<float>(base, 4), ElementsAre(0, 4.4f, 4.3f, 4.2f));
  // Only the allocation's start can be freed; then it is gone.
  EXPECT_EQ(aclrtFree(base + 4), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFree(base), ACL_SUCCESS);
  EXPECT_EQ(aclrtMemcpy(scratch, 4, base, 4, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
}

// ThresholdBackward in every dtype it supports, values as host bytes.
TEST_F(CApiTest, ThresholdBackwardInEveryDtype) {
  const std::vector<float> grad = {4, 5, 6, 7};
  const std::vector<float> self = {0, 1, 2, 3};
  const std::vector<float> want = {0, 0, 6, 7};  // threshold 1.5
  auto bytes_of = [](aclDataType dtype, const std::vector<float>& values) {
    std::vector<uint8_t> out;
    for (float v : values) {
      uint8_t buf[4];
      size_t n = 0;
      switch (dtype) {
        case ACL_FLOAT:
          std::memcpy(buf, &v, n = 4);
          break;
        case ACL_FLOAT16: {
          uint16_t h = kernels::FloatToHalf(v);
          std::memcpy(buf, &h, n = 2);
          break;
        }
        case ACL_BF16: {
          uint16_t h = kernels::FloatToBFloat16(v);
          std::memcpy(buf, &h, n = 2);
          break;
        }
        case ACL_INT32: {
          int32_t i = static_cast<int32_t>(v);
          std::memcpy(buf, &i, n = 4);
          break;
        }
        case ACL_INT8:
        case ACL_UINT8:
          buf[0] = static_cast<uint8_t>(v);
          n = 1;
          break;
        default:
          break;
      }
      out.insert(out.end(), buf, buf + n);
    }
    return out;
  };
  for (aclDataType dtype :
       {ACL_FLOAT, ACL_FLOAT16, ACL_BF16, ACL_INT32, ACL_INT8, ACL_UINT8}) {
    SCOPED_TRACE(static_cast<int>(dtype));
    std::vector<uint8_t> zeros(16, 0);
    void* g = Device(bytes_of(dtype, grad));
    void* s = Device(bytes_of(dtype, self));
    void* o = Device(zeros);
    ASSERT_EQ(RunThreshold(Tensor(g, {4}, dtype), Tensor(s, {4}, dtype), 1.5f,
                           Tensor(o, {4}, dtype)),
              ACLNN_SUCCESS)
        << LastError();
    const std::vector<uint8_t> expected = bytes_of(dtype, want);
    EXPECT_EQ(Host<uint8_t>(o, expected.size()), expected);
    aclrtFree(g);
    aclrtFree(s);
    aclrtFree(o);
  }
}

TEST_F(CApiTest, LeakyReluInDoubleWithAnIntegerSlopeAndBroadcast) {
  // self [2,1] broadcasts against gradOutput [2,2]; DOUBLE throughout.
  void* grad = Device(std::vector<double>{1, 2, 3, 4});
  void* self = Device(std::vector<double>{-1, 1});
  void* out = Device(std::vector<double>(4, 0));
  int32_t slope = 2;
  aclScalar* negative_slope = aclCreateScalar(&slope, ACL_INT32);
  uint64_t workspace = 0;
  aclOpExecutor* executor = nullptr;
  ASSERT_EQ(aclnnLeakyReluBackwardGetWorkspaceSize(
                Tensor(grad, {2, 2}, ACL_DOUBLE),
                Tensor(self, {2, 1}, ACL_DOUBLE), negative_slope, false,
                Tensor(out, {2, 2}, ACL_DOUBLE), &workspace, &executor),
            ACLNN_SUCCESS)
      << LastError();
  aclDestroyScalar(negative_slope);
  ASSERT_EQ(aclnnLeakyReluBackward(nullptr, 0, executor, stream_),
            ACLNN_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS);
  EXPECT_THAT(Host<double>(out, 4), ElementsAre(2, 4, 3, 4));
}

TEST_F(CApiTest, StridedAndOffsetViews) {
  // gradOutput: the transpose of a 3x2 buffer; out: a strided view with a
  // view offset of 1 element into its storage.
  void* grad = Device(std::vector<float>{1, 2, 3, 4, 5, 6});
  void* self = Device(std::vector<float>{0, 5});
  void* out = Device(std::vector<float>(16, -1));
  ASSERT_EQ(RunThreshold(Tensor(grad, {2, 3}, ACL_FLOAT, {1, 2}),
                         Tensor(self, {2, 1}, ACL_FLOAT), 1.0f,
                         Tensor(out, {2, 3}, ACL_FLOAT, {8, 2}, 1, {16})),
            ACLNN_SUCCESS)
      << LastError();
  EXPECT_THAT(Host<float>(out, 16), ElementsAre(-1, 0, -1, 0, -1, 0, -1, -1, -1,
                                                2, -1, 4, -1, 6, -1, -1));
}

TEST_F(CApiTest, InvalidArgumentsReturnTheExactAclnnStatus) {
  void* a = Device(std::vector<float>(16, 1));
  aclTensor* f4 = Tensor(a, {4}, ACL_FLOAT);
  aclTensor* i8 = Tensor(a, {4}, ACL_INT8);
  aclTensor* f22 = Tensor(a, {2, 2}, ACL_FLOAT);
  aclTensor* u8 = Tensor(a, {8}, ACL_UINT8);
  float one = 1, minus = -1;
  aclScalar* s1 = aclCreateScalar(&one, ACL_FLOAT);
  aclScalar* sm = aclCreateScalar(&minus, ACL_FLOAT);
  uint64_t ws = 0;
  aclOpExecutor* ex = nullptr;

  EXPECT_EQ(aclnnThresholdBackwardGetWorkspaceSize(f4, i8, s1, f4, &ws, &ex),
            ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("dtype"));
  EXPECT_EQ(
      aclnnThresholdBackwardGetWorkspaceSize(nullptr, f4, s1, f4, &ws, &ex),
      ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_THAT(LastError(), HasSubstr("gradOutput"));
  EXPECT_EQ(
      aclnnThresholdBackwardGetWorkspaceSize(f4, f4, nullptr, f4, &ws, &ex),
      ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_THAT(LastError(), HasSubstr("threshold"));

  EXPECT_EQ(aclnnSoftshrinkBackwardGetWorkspaceSize(f4, f4, sm, f4, &ws, &ex),
            ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("lambd"));
  EXPECT_EQ(
      aclnnSoftshrinkBackwardGetWorkspaceSize(f4, f4, s1, nullptr, &ws, &ex),
      ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_THAT(LastError(), HasSubstr("gradInput"));

  EXPECT_EQ(aclnnHardswishBackwardGetWorkspaceSize(f4, f22, f4, &ws, &ex),
            ACLNN_ERR_PARAM_INVALID);
  EXPECT_EQ(aclnnHardswishBackwardGetWorkspaceSize(f4, f4, f4, nullptr, &ex),
            ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_THAT(LastError(), HasSubstr("workspaceSize"));

  EXPECT_EQ(
      aclnnLeakyReluBackwardGetWorkspaceSize(f4, f4, sm, true, f4, &ws, &ex),
      ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("negativeSlope"));
  EXPECT_EQ(aclnnLeakyReluBackwardGetWorkspaceSize(f4, f4, nullptr, true, f4,
                                                   &ws, &ex),
            ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_EQ(
      aclnnLeakyReluBackwardGetWorkspaceSize(f4, f4, s1, false, i8, &ws, &ex),
      ACLNN_ERR_PARAM_INVALID);

  EXPECT_EQ(aclnnDropoutBackwardGetWorkspaceSize(f4, u8, 2.0, f4, &ws, &ex),
            ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("mask"));
  EXPECT_EQ(
      aclnnDropoutBackwardGetWorkspaceSize(f4, nullptr, 2.0, f4, &ws, &ex),
      ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_EQ(aclnnDropoutBackwardGetWorkspaceSize(f4, u8, 0.5, f4, &ws, &ex),
            ACLNN_ERR_PARAM_INVALID);

  // A tensor whose data is not device memory.
  float host[4];
  aclTensor* on_host = Tensor(host, {4}, ACL_FLOAT);
  EXPECT_EQ(
      aclnnThresholdBackwardGetWorkspaceSize(on_host, f4, s1, f4, &ws, &ex),
      ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("not inside any live aclrtMalloc"));

  aclDestroyScalar(s1);
  aclDestroyScalar(sm);
}

TEST_F(CApiTest, UnknownConsumedAndRepeatableExecutors) {
  void* a = Device(std::vector<float>{1, 2, 3, 4});
  aclTensor* t = Tensor(a, {4}, ACL_FLOAT);
  float threshold = 2;
  aclScalar* s = aclCreateScalar(&threshold, ACL_FLOAT);
  uint64_t ws = 0;
  aclOpExecutor* once = nullptr;
  ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(t, t, s, t, &ws, &once),
            ACLNN_SUCCESS);
  ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, once, stream_), ACLNN_SUCCESS);
  EXPECT_EQ(aclnnThresholdBackward(nullptr, 0, once, stream_),
            ACLNN_ERR_INNER_NULLPTR);
  EXPECT_THAT(LastError(), HasSubstr("consumed"));
  EXPECT_EQ(aclnnThresholdBackward(
                nullptr, 0, reinterpret_cast<aclOpExecutor*>(0x1234), stream_),
            ACLNN_ERR_INNER_NULLPTR);
  EXPECT_EQ(aclDestroyAclOpExecutor(once), ACLNN_ERR_INNER_NULLPTR);

  aclOpExecutor* repeatable = nullptr;
  ASSERT_EQ(
      aclnnThresholdBackwardGetWorkspaceSize(t, t, s, t, &ws, &repeatable),
      ACLNN_SUCCESS);
  ASSERT_EQ(aclSetAclOpExecutorRepeatable(repeatable), ACLNN_SUCCESS);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, repeatable, stream_),
              ACLNN_SUCCESS)
        << LastError();
  }
  ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS);
  EXPECT_THAT(Host<float>(a, 4), ElementsAre(0, 0, 3, 4));
  EXPECT_EQ(aclDestroyAclOpExecutor(repeatable), ACLNN_SUCCESS);
  EXPECT_EQ(aclnnThresholdBackward(nullptr, 0, repeatable, stream_),
            ACLNN_ERR_INNER_NULLPTR);
  EXPECT_EQ(aclDestroyAclOpExecutor(repeatable), ACLNN_ERR_INNER_NULLPTR);
  aclDestroyScalar(s);
}

TEST_F(CApiTest, WorkspaceTooSmallIs161002) {
  // A strided (non-contiguous) dropout mask needs a workspace.
  void* grad = Device(std::vector<float>(8, 1));
  std::vector<uint8_t> bits(32, 0);
  bits[0] = 0xFF;
  void* mask = Device(bits);
  void* out = Device(std::vector<float>(8, 0));
  uint64_t ws = 0;
  aclOpExecutor* executor = nullptr;
  ASSERT_EQ(aclnnDropoutBackwardGetWorkspaceSize(
                Tensor(grad, {8}, ACL_FLOAT),
                Tensor(mask, {16}, ACL_UINT8, {2}, 0, {32}), 2.0,
                Tensor(out, {8}, ACL_FLOAT), &ws, &executor),
            ACLNN_SUCCESS)
      << LastError();
  ASSERT_GT(ws, 0u);
  void* workspace = nullptr;
  ASSERT_EQ(aclrtMalloc(&workspace, ws, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  EXPECT_EQ(aclnnDropoutBackward(nullptr, 0, executor, stream_),
            ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("smaller than"));
  EXPECT_EQ(aclnnDropoutBackward(workspace, ws - 1, executor, stream_),
            ACLNN_ERR_PARAM_INVALID);
  // Past the end of the workspace's allocation.
  EXPECT_EQ(aclnnDropoutBackward(static_cast<char*>(workspace) + 1, ws,
                                 executor, stream_),
            ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("past the end"));
  // The rejected launches did not consume it.
  ASSERT_EQ(aclnnDropoutBackward(workspace, ws, executor, stream_),
            ACLNN_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(stream_), ACL_SUCCESS);
  EXPECT_THAT(Host<float>(out, 8), ElementsAre(2, 2, 2, 2, 2, 2, 2, 2));
}

TEST_F(CApiTest, ThreadsWithTheirOwnStreamsRunConcurrently) {
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // As in CANN, each thread sets its device (binds its context).
      ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
      aclrtStream stream;
      ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS) << LastError();
      std::vector<float> host = {4.5f + t, 4.4, 4.3, 4.2, 0.2, 1.2,
                                 2.2,      3.2, 0,   0,   0,   0};
      void* dev = nullptr;
      ASSERT_EQ(aclrtMalloc(&dev, 48, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
      ASSERT_EQ(
          aclrtMemcpy(dev, 48, host.data(), 48, ACL_MEMCPY_HOST_TO_DEVICE),
          ACL_SUCCESS);
      char* base = static_cast<char*>(dev);
      int64_t shape[] = {4};
      aclTensor* g = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                     ACL_FORMAT_ND, shape, 1, base);
      aclTensor* s = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                     ACL_FORMAT_ND, shape, 1, base + 16);
      aclTensor* o = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                     ACL_FORMAT_ND, shape, 1, base + 32);
      float one = 1;
      aclScalar* threshold = aclCreateScalar(&one, ACL_FLOAT);
      uint64_t ws = 0;
      aclOpExecutor* executor = nullptr;
      for (int i = 0; i < 10; ++i) {
        ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(g, s, threshold, o,
                                                         &ws, &executor),
                  ACLNN_SUCCESS);
        ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, executor, stream),
                  ACLNN_SUCCESS);
        ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
      }
      results[t].resize(4);
      ASSERT_EQ(aclrtMemcpy(results[t].data(), 16, base + 32, 16,
                            ACL_MEMCPY_DEVICE_TO_HOST),
                ACL_SUCCESS);
      aclDestroyTensor(g);
      aclDestroyTensor(s);
      aclDestroyTensor(o);
      aclDestroyScalar(threshold);
      aclrtFree(dev);
      aclrtDestroyStream(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) {
    EXPECT_THAT(results[t], ElementsAre(0, 4.4f, 4.3f, 4.2f)) << t;
  }
}

// A launch only the server can refuse (--max_launch_elements): pipelined
// (the default), aclnnXxxGetWorkspaceSize and the launch succeed and the
// next aclrtSynchronizeStream reports the refusal with the server's
// message, once; with OPSERVER_PIPELINE=0 phase one is the server's and
// fails at once with 161002. Work after it on the stream still runs.
TEST_F(CApiTest, ServerOnlyRefusalIsDeferredToSynchronizeWhenPipelined) {
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  ASSERT_EQ(aclrtResetDevice(0), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  Options options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  options.session_limits.max_launch_elements = 1024;
  auto limited = Server::Start(options);
  ASSERT_TRUE(limited.ok()) << limited.status();
  setenv("OPSERVER_ADDRESS", (*limited)->address().c_str(), 1);
  for (const char* pipeline : {"1", "0"}) {
    SCOPED_TRACE(pipeline);
    setenv("OPSERVER_PIPELINE", pipeline, 1);
    ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS) << LastError();
    ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
    aclrtStream stream = nullptr;
    ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS) << LastError();
    std::vector<float> host(2048, 4.0f);
    void* big = Device(host.data(), host.size() * sizeof(float));
    int64_t shape[] = {2048};
    aclTensor* t = aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0,
                                   ACL_FORMAT_ND, shape, 1, big);
    uint64_t ws = 0;
    aclOpExecutor* executor = nullptr;
    const aclnnStatus planned =
        aclnnHardswishBackwardGetWorkspaceSize(t, t, t, &ws, &executor);
    if (std::string(pipeline) == "0") {
      EXPECT_EQ(planned, 161002);
      EXPECT_THAT(LastError(), HasSubstr("--max_launch_elements"));
    } else {
      ASSERT_EQ(planned, ACLNN_SUCCESS) << LastError();
      ASSERT_EQ(aclnnHardswishBackward(nullptr, 0, executor, stream),
                ACLNN_SUCCESS)
          << LastError();
      EXPECT_NE(aclrtSynchronizeStream(stream), ACL_SUCCESS);
      EXPECT_THAT(LastError(), HasSubstr("--max_launch_elements"));
      EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
    }
    // The stream goes on: a launch within the limit runs.
    int64_t small[] = {4};
    aclTensor* s4 = aclCreateTensor(small, 1, ACL_FLOAT, nullptr, 0,
                                    ACL_FORMAT_ND, small, 1, big);
    ASSERT_EQ(
        aclnnHardswishBackwardGetWorkspaceSize(s4, s4, s4, &ws, &executor),
        ACLNN_SUCCESS)
        << LastError();
    ASSERT_EQ(aclnnHardswishBackward(nullptr, 0, executor, stream),
              ACLNN_SUCCESS);
    ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
    float out[4];
    ASSERT_EQ(aclrtMemcpy(out, 16, big, 16, ACL_MEMCPY_DEVICE_TO_HOST),
              ACL_SUCCESS);
    EXPECT_THAT(out, ElementsAre(4, 4, 4, 4));  // hardswish'(4) = 1.
    aclDestroyTensor(t);
    aclDestroyTensor(s4);
    ASSERT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS) << LastError();
    ASSERT_EQ(aclrtResetDevice(0), ACL_SUCCESS) << LastError();
    ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  }
  unsetenv("OPSERVER_PIPELINE");
  setenv("OPSERVER_ADDRESS", server_->address().c_str(), 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);  // For TearDown.
}

TEST_F(CApiTest, CallsOutOfOrderAreErrorsNotCrashes) {
  aclrtResetDevice(0);
  void* p = nullptr;
  // The reset destroyed the device's context, which the thread was bound
  // to: CANN's 107002.
  EXPECT_EQ(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_THAT(LastError(), HasSubstr("aclrtSetDevice"));
  EXPECT_EQ(aclrtSetDevice(3), ACL_ERROR_INVALID_DEVICE);
  EXPECT_THAT(LastError(), HasSubstr("aclrtSetDevice: device 3 does not "
                                     "exist; the opserver at "));
  EXPECT_EQ(aclrtResetDevice(-1), ACL_ERROR_INVALID_DEVICE);
  EXPECT_THAT(LastError(), HasSubstr("aclrtResetDevice: device -1 does not"));
  EXPECT_EQ(aclInit(nullptr), ACL_ERROR_REPEAT_INITIALIZE);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  EXPECT_EQ(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtSetDevice(0), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(LastError(), "aclrtSetDevice: aclInit was not called");
  EXPECT_EQ(aclrtResetDevice(0), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(LastError(), "aclrtResetDevice: aclInit was not called");
  EXPECT_EQ(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);
  stream_ = nullptr;
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);  // For TearDown.
}

// The environment's switches take 1/on/true and 0/off/false in any case;
// anything else fails aclInit with the variable's name.
TEST_F(CApiTest, EnvironmentSwitchesAreCheckedByAclInit) {
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  aclrtResetDevice(0);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  for (const char* name :
       {"OPSERVER_PIPELINE", "OPSERVER_DATA_PATH",
        "OPSERVER_KEEP_DATA_CONNECTIONS", "OPSERVER_DETECT_MUTEX_DEADLOCKS"}) {
    setenv(name, "maybe", 1);
    EXPECT_EQ(aclInit(nullptr), ACL_ERROR_INVALID_PARAM) << name;
    EXPECT_EQ(LastError(), absl::StrCat("aclInit: ", name,
                                        ": 'maybe' is not 0/off/false or "
                                        "1/on/true"));
    for (const char* value : {"ON", "0", "False", ""}) {
      setenv(name, value, 1);
      ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS) << name << "=" << value;
      ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
    }
  }
  unsetenv("OPSERVER_PIPELINE");
  unsetenv("OPSERVER_DATA_PATH");
  unsetenv("OPSERVER_KEEP_DATA_CONNECTIONS");
  setenv("OPSERVER_DETECT_MUTEX_DEADLOCKS", "1", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);  // For TearDown.
}

// OPSERVER_TRANSFER_CONNECTIONS: 1 to 16, anything else fails aclInit; a
// copy of 32 MiB or more arrives byte for byte over the data path, and
// with OPSERVER_DATA_PATH=0 split over that many gRPC connections.
TEST_F(CApiTest, UploadConnectionsComeFromTheEnvironment) {
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  aclrtResetDevice(0);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  for (const char* value : {"0", "17", "two", "-1"}) {
    setenv("OPSERVER_TRANSFER_CONNECTIONS", value, 1);
    EXPECT_EQ(aclInit(nullptr), ACL_ERROR_INVALID_PARAM) << value;
    EXPECT_EQ(LastError(),
              absl::StrCat("aclInit: OPSERVER_TRANSFER_CONNECTIONS: '", value,
                           "' is not a number from 1 to 16"));
  }
  const size_t size = (40 << 20) + 3;
  std::vector<char> data(size);
  std::mt19937 rng(23);
  for (char& byte : data) byte = static_cast<char>(rng());
  // Over the data path (the default), and over gRPC split or not.
  for (auto [data_path, value] :
       {std::pair{"1", "1"}, std::pair{"0", "1"}, std::pair{"0", "3"}}) {
    SCOPED_TRACE(
        absl::StrCat("data path ", data_path, ", connections ", value));
    setenv("OPSERVER_DATA_PATH", data_path, 1);
    setenv("OPSERVER_TRANSFER_CONNECTIONS", value, 1);
    void* device = InitAndMalloc(size);
    ASSERT_NE(device, nullptr);
    ASSERT_EQ(
        aclrtMemcpy(device, size, data.data(), size, ACL_MEMCPY_HOST_TO_DEVICE),
        ACL_SUCCESS)
        << LastError();
    std::vector<char> back(size);
    ASSERT_EQ(
        aclrtMemcpy(back.data(), size, device, size, ACL_MEMCPY_DEVICE_TO_HOST),
        ACL_SUCCESS)
        << LastError();
    EXPECT_TRUE(back == data) << "bytes differ";
    EXPECT_EQ(aclrtFree(device), ACL_SUCCESS);
    aclrtResetDevice(0);
    ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  }
  unsetenv("OPSERVER_TRANSFER_CONNECTIONS");
  unsetenv("OPSERVER_DATA_PATH");
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);  // For TearDown.
}

// Large copies share one data connection, which the library keeps for the
// next; with OPSERVER_KEEP_DATA_CONNECTIONS=0 each copy dials its own.
TEST_F(CApiTest, KeptDataConnectionsComeFromTheEnvironment) {
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  aclrtResetDevice(0);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  const auto dialed = [&] {
    return scrape::Sum(scrape::Metrics(server_->metrics_address()),
                       "opserver_data_port_connections_total");
  };
  const size_t size = (4 << 20) + 1;
  std::vector<char> data(size, 'k');
  for (auto [value, connections] : {std::pair{"1", 1.0}, std::pair{"0", 3.0}}) {
    SCOPED_TRACE(absl::StrCat("OPSERVER_KEEP_DATA_CONNECTIONS=", value));
    setenv("OPSERVER_KEEP_DATA_CONNECTIONS", value, 1);
    const double before = dialed();
    void* device = InitAndMalloc(size);
    ASSERT_NE(device, nullptr);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(aclrtMemcpy(device, size, data.data(), size,
                            ACL_MEMCPY_HOST_TO_DEVICE),
                ACL_SUCCESS)
          << LastError();
    }
    EXPECT_EQ(dialed() - before, connections);
    EXPECT_EQ(aclrtFree(device), ACL_SUCCESS);
    aclrtResetDevice(0);
    ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  }
  unsetenv("OPSERVER_KEEP_DATA_CONNECTIONS");
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);  // For TearDown.
}

TEST_F(CApiTest, UnreachableServerIsAnErrorCodeWithinTheDeadline) {
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  aclrtResetDevice(0);
  aclFinalize();
  // A refused port fails at once and says so, however long the time-out
  // (the first-hour review, problem 4).
  const std::string address = ClosedPortAddress();
  setenv("OPSERVER_ADDRESS", address.c_str(), 1);
  setenv("OPSERVER_TIMEOUT_MS", "600000", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetDevice(0), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr("cannot reach opserver at " + address +
                                     ": connection refused"));
  // Everything after it fails cleanly too: the thread has no context.
  aclrtStream stream;
  EXPECT_EQ(aclrtCreateStream(&stream), ACL_ERROR_RT_CONTEXT_NULL);
  uint64_t ws;
  aclOpExecutor* executor;
  EXPECT_EQ(aclnnHardswishBackwardGetWorkspaceSize(nullptr, nullptr, nullptr,
                                                   &ws, &executor),
            ACLNN_ERR_RUNTIME_ERROR);
}

TEST_F(CApiTest, DeadlineExceededOnSynchronize) {
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  aclrtResetDevice(0);
  aclFinalize();
  setenv("OPSERVER_SYNC_TIMEOUT_MS", "1", 1);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  // ~200 MB of fresh device memory to compute: far more than 1 ms.
  const int64_t n = 16 << 20;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(aclrtMalloc(&a, n * 4, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMalloc(&b, n * 4, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  float zero = 0;
  aclScalar* s = aclCreateScalar(&zero, ACL_FLOAT);
  uint64_t ws;
  aclOpExecutor* executor;
  ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(
                Tensor(a, {n}, ACL_FLOAT), Tensor(a, {n}, ACL_FLOAT), s,
                Tensor(b, {n}, ACL_FLOAT), &ws, &executor),
            ACLNN_SUCCESS)
      << LastError();
  aclDestroyScalar(s);
  // Queued 32 times (hundreds of ms), so that even a test thread descheduled
  // for a while on a loaded machine synchronizes before the work is done
  // (one launch flaked: it had finished before the synchronize was sent).
  ASSERT_EQ(aclSetAclOpExecutorRepeatable(executor), ACLNN_SUCCESS);
  for (int i = 0; i < 32; ++i) {
    ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, executor, nullptr),
              ACLNN_SUCCESS);
  }
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr("Deadline Exceeded"));
}

TEST_F(CApiTest, ServerRestartedUnderTheProgram) {
  void* p = Device(std::vector<float>{1, 2, 3, 4});
  const std::string address = server_->address();
  server_.reset();
  StartServer(address);
  void* q = nullptr;
  aclError error = ACL_SUCCESS;
  for (int i = 0; i < 600; ++i) {
    error = aclrtMalloc(&q, 16, ACL_MEM_MALLOC_HUGE_FIRST);
    if (error != ACL_ERROR_RT_FAILURE) break;  // Still reconnecting.
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(error, ACL_ERROR_INVALID_RESOURCE_HANDLE);
  // The server's answer, or the client's own once it saw Attach end.
  EXPECT_THAT(LastError(), AnyOf(HasSubstr("no session"),
                                 HasSubstr("the session was lost")));
  // The old session's handles are dead. Which of the two true causes this
  // call names depends on which the client saw first for its channel (the
  // old server going away, or the new one not knowing the session), so
  // either code is right, with its words.
  float back[4];
  const aclError copy = aclrtMemcpy(back, 16, p, 16, ACL_MEMCPY_DEVICE_TO_HOST);
  EXPECT_THAT(copy, AnyOf(ACL_ERROR_INVALID_RESOURCE_HANDLE,
                          ACL_ERROR_RT_FAILURE));
  EXPECT_THAT(LastError(), AnyOf(HasSubstr("no session"),
                                 HasSubstr("the session was lost"),
                                 HasSubstr("went away")));
  // Starting over on the new server works.
  stream_ = nullptr;  // It died with the old session.
  ASSERT_EQ(aclrtResetDevice(0), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  void* r = Device(std::vector<float>{1, 2, 3, 4});
  EXPECT_THAT(Host<float>(r, 4), ElementsAre(1, 2, 3, 4));
}

// When the server frees the session under the program
// (its Attach call ended: a restart here, a network blip in real life),
// later calls say so, naming the server, instead of failing with a bare
// "no session"; aclrtSetDevice then starts over on a new session (the old
// handles died with the old one), with or without aclrtResetDevice first.
TEST_F(CApiTest, LostAttachIsReportedAndSetDeviceReconnects) {
  void* p = Device(std::vector<float>{1, 2, 3, 4});
  const std::string address = server_->address();
  server_.reset();
  StartServer(address);
  aclError error = ACL_SUCCESS;
  void* q = nullptr;
  for (int i = 0; i < 1200; ++i) {
    error = aclrtMalloc(&q, 16, ACL_MEM_MALLOC_HUGE_FIRST);
    if (error == ACL_ERROR_INVALID_RESOURCE_HANDLE &&
        LastError().find("the session was lost") != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(error, ACL_ERROR_INVALID_RESOURCE_HANDLE);
  EXPECT_THAT(LastError(), HasSubstr("the session was lost"));
  EXPECT_THAT(LastError(), HasSubstr(address));
  EXPECT_THAT(LastError(), HasSubstr("aclrtResetDevice(0)"));
  uint64_t ws = 0;
  aclOpExecutor* executor = nullptr;
  aclTensor* t = Tensor(p, {4}, ACL_FLOAT);
  EXPECT_EQ(aclnnHardswishBackwardGetWorkspaceSize(t, t, t, &ws, &executor),
            ACLNN_ERR_RUNTIME_ERROR);
  EXPECT_THAT(LastError(), HasSubstr("the session was lost"));
  // Starting over works without a reset: aclrtSetDevice reconnects.
  stream_ = nullptr;  // It died with the old session.
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  void* r = Device(std::vector<float>{5, 6, 7, 8});
  EXPECT_THAT(Host<float>(r, 4), ElementsAre(5, 6, 7, 8));
  // The old pointer is unknown now, not an alias of a new allocation.
  float back[4];
  EXPECT_EQ(aclrtMemcpy(back, 16, p, 16, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
}

// A pointer from before aclFinalize never names an
// allocation made after the next aclInit (it is unknown instead).
TEST_F(CApiTest, StalePointersDoNotAliasAfterReinit) {
  void* before = nullptr;
  ASSERT_EQ(aclrtMalloc(&before, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  aclrtDestroyStream(stream_);
  stream_ = nullptr;
  ASSERT_EQ(aclrtResetDevice(0), ACL_SUCCESS);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  void* after = nullptr;
  ASSERT_EQ(aclrtMalloc(&after, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_NE(after, before);
  float host[16] = {};
  EXPECT_EQ(aclrtMemcpy(host, 64, before, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFree(after), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver
