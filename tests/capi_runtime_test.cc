// The C API's device queries, host memory and asynchronous copies against
// a live server: what each returns for good arguments, CANN's code for bad
// ones, and aclrtMemcpyAsync ordered with the launches on its stream.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

std::string LastError() { return aclGetRecentErrMsg(); }

class CApiRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    options.device_memory_bytes = 256ull << 20;
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    setenv("OPSERVER_ADDRESS", server_->address().c_str(), 1);
    setenv("OPSERVER_DETECT_MUTEX_DEADLOCKS", "1", 1);
    ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS);
  }
  void TearDown() override {
    aclrtResetDevice(0);
    aclFinalize();
  }

  aclTensor* Tensor(void* data, int64_t n) {
    const int64_t shape[] = {n};
    return aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND,
                           shape, 1, data);
  }

  std::unique_ptr<Server> server_;
};

TEST_F(CApiRuntimeTest, DeviceQueries) {
  int32_t device = -1;
  // Before aclrtSetDevice: no device on the thread.
  EXPECT_EQ(aclrtGetDevice(&device), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_THAT(LastError(), HasSubstr("aclrtSetDevice"));
  EXPECT_EQ(aclrtGetSocName(), nullptr);
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(aclrtGetDeviceCount(nullptr), ACL_ERROR_INVALID_PARAM);

  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtGetDevice(&device), ACL_SUCCESS);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(aclrtGetDevice(nullptr), ACL_ERROR_INVALID_PARAM);
  const char* soc = aclrtGetSocName();
  ASSERT_NE(soc, nullptr) << LastError();
  EXPECT_STREQ(soc, "opserver-cpu");
  EXPECT_EQ(aclrtGetSocName(), soc);  // The same string, still valid.

  size_t free = 0, total = 0;
  ASSERT_EQ(aclrtGetMemInfo(ACL_HBM_MEM, &free, &total), ACL_SUCCESS)
      << LastError();
  EXPECT_EQ(total, 256ull << 20);
  void* block = nullptr;
  ASSERT_EQ(aclrtMalloc(&block, 1 << 20, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  size_t after = 0;
  ASSERT_EQ(aclrtGetMemInfo(ACL_DDR_MEM, &after, &total), ACL_SUCCESS);
  EXPECT_LE(after + (1 << 20), free);
  EXPECT_EQ(aclrtGetMemInfo(ACL_HBM_MEM, nullptr, &total),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetMemInfo(static_cast<aclrtMemAttr>(99), &free, &total),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtFree(block), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
}

TEST_F(CApiRuntimeTest, StreamsWithConfigAndMemory) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStreamWithConfig(
                &stream, 3, ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC),
            ACL_SUCCESS)
      << LastError();
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtCreateStreamWithConfig(&stream, 8, 0),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("priority 8"));
  EXPECT_EQ(aclrtCreateStreamWithConfig(&stream, 0, 0x400),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCreateStreamWithConfig(nullptr, 0, 0),
            ACL_ERROR_INVALID_PARAM);

  void* host = nullptr;
  ASSERT_EQ(aclrtMallocHost(&host, 100), ACL_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(host) % 64, 0u);
  std::memset(host, 7, 100);
  EXPECT_EQ(aclrtFreeHost(host), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHost(host), ACL_ERROR_INVALID_PARAM);  // Twice.
  int on_stack = 0;
  EXPECT_EQ(aclrtFreeHost(&on_stack), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMallocHost(nullptr, 8), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMallocHost(&host, 0), ACL_ERROR_INVALID_PARAM);

  void* dev = nullptr;
  ASSERT_EQ(aclrtMallocAlign32(&dev, 33, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  // Rounded up to 64: a 64-byte copy fits, 65 does not.
  std::vector<char> bytes(65, 1);
  EXPECT_EQ(aclrtMemcpy(dev, 64, bytes.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE),
            ACL_SUCCESS);
  EXPECT_NE(aclrtMemcpy(dev, 65, bytes.data(), 65, ACL_MEMCPY_HOST_TO_DEVICE),
            ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(dev), ACL_SUCCESS);
}

// Inputs copied in, an operator, its result copied out, all queued on one
// stream: the result is in `out` once the stream is synchronized, and not
// before (the copy lands then).
TEST_F(CApiRuntimeTest, AsyncCopiesAreOrderedWithLaunches) {
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  void* dev = nullptr;
  ASSERT_EQ(aclrtMalloc(&dev, 48, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  char* base = static_cast<char*>(dev);
  const float grad[] = {4.5, 4.4, 4.3, 4.2};
  const float self[] = {0.2, 1.2, 2.2, 3.2};
  ASSERT_EQ(
      aclrtMemcpyAsync(base, 16, grad, 16, ACL_MEMCPY_HOST_TO_DEVICE, stream),
      ACL_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtMemcpyAsync(base + 16, 16, self, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                             stream),
            ACL_SUCCESS);
  aclTensor* g = Tensor(base, 4);
  aclTensor* x = Tensor(base + 16, 4);
  aclTensor* o = Tensor(base + 32, 4);
  float one = 1;
  aclScalar* threshold = aclCreateScalar(&one, ACL_FLOAT);
  uint64_t workspace = 0;
  aclOpExecutor* executor = nullptr;
  ASSERT_EQ(aclnnThresholdBackwardGetWorkspaceSize(g, x, threshold, o,
                                                   &workspace, &executor),
            ACLNN_SUCCESS);
  ASSERT_EQ(aclnnThresholdBackward(nullptr, 0, executor, stream),
            ACLNN_SUCCESS);
  float out[4] = {-1, -1, -1, -1};
  ASSERT_EQ(aclrtMemcpyAsync(out, 16, base + 32, 16, ACL_MEMCPY_DEVICE_TO_HOST,
                             stream),
            ACL_SUCCESS)
      << LastError();
  // Device to device, ordered too: the output copied next to itself.
  void* copy = nullptr;
  ASSERT_EQ(aclrtMalloc(&copy, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(copy, 16, base + 32, 16,
                             ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            ACL_SUCCESS);
  EXPECT_EQ(out[0], -1);  // Not landed: the stream was not synchronized.
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(std::vector<float>(out, out + 4),
            (std::vector<float>{0, 4.4f, 4.3f, 4.2f}));
  float copied[4] = {};
  ASSERT_EQ(aclrtMemcpy(copied, 16, copy, 16, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  EXPECT_EQ(std::vector<float>(copied, copied + 4),
            (std::vector<float>{0, 4.4f, 4.3f, 4.2f}));

  // Many small copies in, one synchronize: each lands, in order.
  std::vector<uint32_t> values(1000 * 1024);
  void* big = nullptr;
  ASSERT_EQ(aclrtMalloc(&big, values.size() * 4, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  for (size_t i = 0; i < values.size(); ++i) values[i] = i;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_EQ(aclrtMemcpyAsync(static_cast<char*>(big) + 4096 * i, 4096,
                               values.data() + 1024 * i, 4096,
                               ACL_MEMCPY_HOST_TO_DEVICE, stream),
              ACL_SUCCESS);
  }
  std::vector<uint32_t> back(values.size());
  ASSERT_EQ(aclrtMemcpyAsync(back.data(), back.size() * 4, big, back.size() * 4,
                             ACL_MEMCPY_DEVICE_TO_HOST, stream),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
  EXPECT_EQ(back, values);

  aclDestroyTensor(g);
  aclDestroyTensor(x);
  aclDestroyTensor(o);
  aclDestroyScalar(threshold);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
}

TEST_F(CApiRuntimeTest, AsyncCopyArgumentsAreChecked) {
  float host[4] = {};
  aclrtStream none = nullptr;
  // Before aclrtSetDevice, as every call that needs the device.
  void* unset = nullptr;
  const aclError before_device =
      aclrtMalloc(&unset, 16, ACL_MEM_MALLOC_HUGE_FIRST);
  EXPECT_NE(before_device, ACL_SUCCESS);
  EXPECT_EQ(
      aclrtMemcpyAsync(host, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE, none),
      before_device);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  void* dev = nullptr;
  ASSERT_EQ(aclrtMalloc(&dev, 16, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  const struct {
    aclError error;
    const char* message;
  } cases[] = {
      {aclrtMemcpyAsync(nullptr, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                        nullptr),
       "dst is NULL"},
      {aclrtMemcpyAsync(dev, 16, nullptr, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                        nullptr),
       "src is NULL"},
      {aclrtMemcpyAsync(dev, 8, host, 16, ACL_MEMCPY_HOST_TO_DEVICE, nullptr),
       "larger than destMax"},
      {aclrtMemcpyAsync(dev, 16, host, 16, static_cast<aclrtMemcpyKind>(9),
                        nullptr),
       "unknown aclrtMemcpyKind"},
      {aclrtMemcpyAsync(static_cast<char*>(dev) + 8, 16, host, 16,
                        ACL_MEMCPY_HOST_TO_DEVICE, nullptr),
       "run past the end"},
      {aclrtMemcpyAsync(host, 16, host, 16, ACL_MEMCPY_DEVICE_TO_HOST, nullptr),
       "src"},
      {aclrtMemcpyAsync(dev, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                        reinterpret_cast<aclrtStream>(0x1234)),
       "aclrtMemcpyAsync"},
  };
  for (const auto& c : cases) {
    EXPECT_NE(c.error, ACL_SUCCESS) << c.message;
  }
  EXPECT_EQ(aclrtMemcpyAsync(dev, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                             reinterpret_cast<aclrtStream>(0x1234)),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemcpyAsync(nullptr, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE,
                             nullptr),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("aclrtMemcpyAsync: dst is NULL"));
  EXPECT_EQ(aclrtFree(dev), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver
