// The C API across devices and servers: contexts and per-thread devices,
// device ordinals that span servers, a server lost under the program (and
// back), memset and device-side copies, with CANN's return codes.

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "testing/closed_port.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string LastError() { return aclGetRecentErrMsg(); }

std::unique_ptr<Server> StartServer(int devices,
                                    const std::string& listen = "127.0.0.1:0") {
  Options options;
  options.listen = listen;
  options.threads = 1;
  options.devices = devices;
  options.device_memory_bytes = 64ull << 20;
  // A server that goes away in a test goes at once (as a killed one does).
  options.shutdown_grace = absl::ZeroDuration();
  auto server = Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Buffers and bytes the server reports for its device `device`.
v1::DeviceStats DeviceStatsOf(Server& server, uint32_t device) {
  auto client = remote::Client::Connect(server.address());
  EXPECT_TRUE(client.ok()) << client.status();
  grpc::ClientContext context;
  v1::ServerStats stats;
  EXPECT_TRUE((*client)
                  ->runtime()
                  .GetServerStats(&context, v1::GetServerStatsRequest(), &stats)
                  .ok());
  EXPECT_LT(device, static_cast<uint32_t>(stats.devices_size()));
  return device < static_cast<uint32_t>(stats.devices_size())
             ? stats.devices(device)
             : v1::DeviceStats();
}

void* Device(const std::vector<float>& values) {
  void* data = nullptr;
  const size_t bytes = values.size() * sizeof(float);
  EXPECT_EQ(aclrtMalloc(&data, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS)
      << LastError();
  EXPECT_EQ(
      aclrtMemcpy(data, bytes, values.data(), bytes, ACL_MEMCPY_HOST_TO_DEVICE),
      ACL_SUCCESS)
      << LastError();
  return data;
}

std::vector<float> Host(void* data, size_t n) {
  std::vector<float> values(n);
  EXPECT_EQ(
      aclrtMemcpy(values.data(), n * 4, data, n * 4, ACL_MEMCPY_DEVICE_TO_HOST),
      ACL_SUCCESS)
      << LastError();
  return values;
}

aclTensor* Tensor(void* data, int64_t n) {
  const int64_t shape[] = {n};
  return aclCreateTensor(shape, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, shape,
                         1, data);
}

// gradOutput where self > threshold, else 0: one ThresholdBackward on the
// current device, on `stream`, not synchronized.
aclError Threshold(void* grad, void* self, void* out, int64_t n,
                   float threshold, aclrtStream stream) {
  aclTensor* g = Tensor(grad, n);
  aclTensor* s = Tensor(self, n);
  aclTensor* o = Tensor(out, n);
  aclScalar* t = aclCreateScalar(&threshold, ACL_FLOAT);
  uint64_t workspace = 0;
  aclOpExecutor* executor = nullptr;
  aclError error =
      aclnnThresholdBackwardGetWorkspaceSize(g, s, t, o, &workspace, &executor);
  if (error == ACL_SUCCESS) {
    error = aclnnThresholdBackward(nullptr, 0, executor, stream);
  }
  aclDestroyTensor(g);
  aclDestroyTensor(s);
  aclDestroyTensor(o);
  aclDestroyScalar(t);
  return error;
}

class CApiDevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("OPSERVER_DETECT_MUTEX_DEADLOCKS", "1", 1);
    setenv("OPSERVER_TIMEOUT_MS", "2000", 1);
  }
  // The program ends before the servers do: a server stopped under open
  // sessions waits out its shutdown grace for them.
  void TearDown() override {
    aclFinalize();
    unsetenv("OPSERVER_TIMEOUT_MS");
    server_.reset();
    second_.reset();
  }
  void Init(const std::string& address) {
    setenv("OPSERVER_ADDRESS", address.c_str(), 1);
    ASSERT_EQ(aclInit(nullptr), ACL_SUCCESS) << LastError();
  }

  std::unique_ptr<Server> server_;
  std::unique_ptr<Server> second_;
};

TEST_F(CApiDevicesTest, ContextCallsAndTheirErrors) {
  server_ = StartServer(2);
  Server* server = server_.get();
  Init(server->address());
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS) << LastError();
  EXPECT_EQ(count, 2u);

  aclrtContext context = nullptr;
  // A thread with no context gets CANN's 107002 from every call that needs
  // a device.
  EXPECT_EQ(aclrtGetCurrentContext(&context), ACL_ERROR_RT_CONTEXT_NULL);
  void* p = nullptr;
  EXPECT_EQ(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_THAT(LastError(), HasSubstr("no context"));
  aclrtStream stream = nullptr;
  EXPECT_EQ(aclrtCreateStream(&stream), ACL_ERROR_RT_CONTEXT_NULL);
  int32_t device = -1;
  EXPECT_EQ(aclrtGetDevice(&device), ACL_ERROR_RT_CONTEXT_NULL);

  // Bad arguments.
  EXPECT_EQ(aclrtCreateContext(nullptr, 0), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCreateContext(&context, 2), ACL_ERROR_INVALID_DEVICE);
  EXPECT_THAT(LastError(), HasSubstr("device 2 does not exist"));
  EXPECT_EQ(aclrtCreateContext(&context, -1), ACL_ERROR_INVALID_DEVICE);
  EXPECT_EQ(aclrtSetDevice(2), ACL_ERROR_INVALID_DEVICE);
  EXPECT_EQ(aclrtSetCurrentContext(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtSetCurrentContext(reinterpret_cast<aclrtContext>(0x1234)),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyContext(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetCurrentContext(nullptr), ACL_ERROR_INVALID_PARAM);

  // aclrtSetDevice binds the device's default context.
  ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtGetDevice(&device), ACL_SUCCESS);
  EXPECT_EQ(device, 1);
  aclrtContext default1 = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&default1), ACL_SUCCESS);
  ASSERT_NE(default1, nullptr);
  EXPECT_EQ(aclrtDestroyContext(default1), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("default context"));

  // A created context is current at once; the last set wins.
  aclrtContext created = nullptr;
  ASSERT_EQ(aclrtCreateContext(&created, 0), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtGetDevice(&device), ACL_SUCCESS);
  EXPECT_EQ(device, 0);
  aclrtContext current = nullptr;
  ASSERT_EQ(aclrtGetCurrentContext(&current), ACL_SUCCESS);
  EXPECT_EQ(current, created);
  ASSERT_EQ(aclrtSetCurrentContext(default1), ACL_SUCCESS);
  ASSERT_EQ(aclrtGetDevice(&device), ACL_SUCCESS);
  EXPECT_EQ(device, 1);

  // Memory follows the current context's device.
  void* on1 = Device({1, 2, 3, 4});
  EXPECT_EQ(DeviceStatsOf(*server, 1).buffers(), 1u);
  EXPECT_EQ(DeviceStatsOf(*server, 0).buffers(), 0u);

  // Destroying the current context leaves the thread without one.
  ASSERT_EQ(aclrtSetCurrentContext(created), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyContext(created), ACL_SUCCESS);
  EXPECT_EQ(aclrtGetCurrentContext(&current), ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclrtSetCurrentContext(created), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyContext(created), ACL_ERROR_INVALID_PARAM);

  // Copies address memory by pointer: device 1's buffer reads back from a
  // thread bound to device 0.
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  EXPECT_THAT(Host(on1, 4), ElementsAre(1, 2, 3, 4));
  // But an operator's tensors must be on the current device.
  void* out0 = Device({0, 0, 0, 0});
  EXPECT_EQ(Threshold(on1, on1, out0, 4, 1, nullptr), ACLNN_ERR_PARAM_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("is on device 1"));
  // A stream of device 1 cannot run device 0's work.
  ASSERT_EQ(aclrtSetCurrentContext(default1), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  void* host = nullptr;
  ASSERT_EQ(aclrtMallocHost(&host, 16), ACL_SUCCESS);
  EXPECT_EQ(
      aclrtMemcpyAsync(out0, 16, host, 16, ACL_MEMCPY_HOST_TO_DEVICE, stream),
      ACL_ERROR_RT_STREAM_CONTEXT);
  EXPECT_EQ(aclrtFreeHost(host), ACL_SUCCESS);

  // aclrtResetDevice destroys the device's contexts: threads bound to them
  // get 107002 until they set a device again.
  ASSERT_EQ(aclrtResetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(aclrtMalloc(&p, 16, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_RT_CONTEXT_NULL);
  EXPECT_EQ(aclrtGetDevice(&device), ACL_ERROR_RT_CONTEXT_NULL);
  // Device 1 is untouched.
  ASSERT_EQ(aclrtSetCurrentContext(default1), ACL_SUCCESS);
  EXPECT_THAT(Host(on1, 4), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtFree(on1), ACL_SUCCESS);
}

// Two threads, each with its own context on its own device, run operators
// at the same time; each result lands on its own device.
TEST_F(CApiDevicesTest, ThreadsWithContextsOnTwoDevices) {
  server_ = StartServer(2);
  Server* server = server_.get();
  Init(server->address());
  std::vector<std::vector<float>> results(2);
  std::vector<int32_t> seen(2, -1);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int32_t d = 0; d < 2; ++d) {
    threads.emplace_back([&, d] {
      aclrtContext context = nullptr;
      ASSERT_EQ(aclrtCreateContext(&context, d), ACL_SUCCESS) << LastError();
      const int64_t n = 1024;
      std::vector<float> grad(n, 1.0f + d), self(n);
      for (int64_t i = 0; i < n; ++i) self[i] = static_cast<float>(i % 4);
      void* g = Device(grad);
      void* s = Device(self);
      void* o = Device(std::vector<float>(n, -1));
      ++ready;
      while (ready.load() < 2) std::this_thread::yield();
      for (int i = 0; i < 50; ++i) {
        ASSERT_EQ(Threshold(g, s, o, n, 1.5f, nullptr), ACL_SUCCESS)
            << LastError();
      }
      ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
      results[d] = Host(o, 8);
      ASSERT_EQ(aclrtGetDevice(&seen[d]), ACL_SUCCESS);
      // Three buffers on this device, none of the other thread's.
      EXPECT_EQ(DeviceStatsOf(*server, d).buffers(), 3u) << d;
      aclrtFree(g);
      aclrtFree(s);
      aclrtFree(o);
      ASSERT_EQ(aclrtDestroyContext(context), ACL_SUCCESS);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(seen[0], 0);
  EXPECT_EQ(seen[1], 1);
  EXPECT_THAT(results[0], ElementsAre(0, 0, 1, 1, 0, 0, 1, 1));
  EXPECT_THAT(results[1], ElementsAre(0, 0, 2, 2, 0, 0, 2, 2));
}

TEST_F(CApiDevicesTest, MemsetAndDeviceCopiesRunOnTheServer) {
  server_ = StartServer(2);
  Server* server = server_.get();
  Init(server->address());
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  void* a = Device({1, 2, 3, 4, 5, 6, 7, 8});
  void* b = Device({0, 0, 0, 0, 0, 0, 0, 0});
  // Memset: each byte to the value's low byte.
  ASSERT_EQ(aclrtMemset(b, 32, 0, 32), ACL_SUCCESS) << LastError();
  EXPECT_THAT(Host(b, 8), ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
  ASSERT_EQ(aclrtMemset(static_cast<char*>(b) + 4, 28, 0x13f, 4), ACL_SUCCESS);
  std::vector<float> after = Host(b, 2);
  uint32_t bits;
  std::memcpy(&bits, &after[1], 4);
  EXPECT_EQ(bits, 0x3f3f3f3fu);
  // Bad arguments, with CANN's codes.
  EXPECT_EQ(aclrtMemset(nullptr, 4, 0, 4), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemset(b, 4, 0, 8), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("larger than maxCount"));
  EXPECT_EQ(aclrtMemset(b, 64, 0, 64), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("run past the end"));
  int stack = 0;
  EXPECT_EQ(aclrtMemset(&stack, 4, 0, 4), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtMemsetAsync(b, 32, 0, 32, reinterpret_cast<aclrtStream>(0x99)),
            ACL_ERROR_INVALID_PARAM);

  // Device to device, synchronous and on a stream, then an operator that
  // reads the copy on the same stream.
  ASSERT_EQ(aclrtMemcpy(b, 32, a, 32, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS)
      << LastError();
  EXPECT_THAT(Host(b, 8), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
  aclrtStream stream = nullptr;
  ASSERT_EQ(aclrtCreateStream(&stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemsetAsync(b, 32, 0, 32, stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtMemcpyAsync(static_cast<char*>(b) + 16, 16, a, 16,
                             ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            ACL_SUCCESS)
      << LastError();
  void* out = Device({9, 9, 9, 9, 9, 9, 9, 9});
  ASSERT_EQ(Threshold(b, b, out, 8, 1.5f, stream), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_THAT(Host(out, 8), ElementsAre(0, 0, 0, 0, 0, 2, 3, 4));
  EXPECT_EQ(aclrtMemcpyAsync(b, 16, a, 32, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            ACL_ERROR_INVALID_PARAM);

  // Between devices: aclrtMemcpy goes through the host; the asynchronous
  // copy is refused (its stream is one device's).
  ASSERT_EQ(aclrtSetDevice(1), ACL_SUCCESS);
  void* c = Device({0, 0, 0, 0});
  ASSERT_EQ(aclrtMemcpy(c, 16, a, 16, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_SUCCESS)
      << LastError();
  EXPECT_THAT(Host(c, 4), ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(
      aclrtMemcpyAsync(c, 16, a, 16, ACL_MEMCPY_DEVICE_TO_DEVICE, nullptr),
      ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("is on device 0"));
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS);
}

// Device ordinals span the servers OPSERVER_ADDRESS lists. One server goes
// away in the middle of a step: the calls on its device fail, naming it,
// while the other device's work completes; once it is back, aclrtSetDevice
// reconnects.
TEST_F(CApiDevicesTest, TwoServersOneLostAndBack) {
  server_ = StartServer(1);
  second_ = StartServer(2);
  Server* first = server_.get();
  const std::string second_address = second_->address();
  Init(absl::StrCat(first->address(), ",", second_address));
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS) << LastError();
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(aclrtSetDevice(3), ACL_ERROR_INVALID_DEVICE);

  const int64_t n = 256;
  std::vector<float> grad(n, 3), self(n);
  for (int64_t i = 0; i < n; ++i) self[i] = static_cast<float>(i % 3);
  struct OnDevice {
    void* g;
    void* s;
    void* o;
  };
  std::vector<OnDevice> on(3);
  for (int32_t d : {0, 2}) {
    ASSERT_EQ(aclrtSetDevice(d), ACL_SUCCESS) << LastError();
    on[d] = {Device(grad), Device(self), Device(std::vector<float>(n, -1))};
    ASSERT_EQ(Threshold(on[d].g, on[d].s, on[d].o, n, 0.5f, nullptr),
              ACL_SUCCESS)
        << LastError();
  }
  EXPECT_EQ(DeviceStatsOf(*first, 0).buffers(), 3u);
  EXPECT_EQ(DeviceStatsOf(*second_, 1).buffers(), 3u);
  EXPECT_EQ(DeviceStatsOf(*second_, 0).buffers(), 0u);

  // The second server goes away mid-step (this thread is on device 2).
  second_.reset();
  aclError error = ACL_SUCCESS;
  for (int i = 0; i < 3000 && error == ACL_SUCCESS; ++i) {
    error = aclrtSynchronizeDevice();
    if (error == ACL_SUCCESS) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_NE(error, ACL_SUCCESS);
  EXPECT_THAT(LastError(), HasSubstr(second_address));
  EXPECT_NE(Threshold(on[2].g, on[2].s, on[2].o, n, 0.5f, nullptr),
            ACL_SUCCESS);
  EXPECT_THAT(LastError(), HasSubstr(second_address));
  // While it is away, setting the device again fails, naming it.
  EXPECT_EQ(aclrtSetDevice(2), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr(second_address));

  // Device 0 carries on and checks out.
  ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS) << LastError();
  ASSERT_EQ(Threshold(on[0].g, on[0].s, on[0].o, n, 1.5f, nullptr), ACL_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
  std::vector<float> result = Host(on[0].o, n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(result[i], self[i] > 1.5f ? 3.0f : 0.0f) << i;
  }

  // The server is back (same address): aclrtSetDevice reconnects with a
  // new session; the old handles died with the old one.
  second_ = StartServer(2, second_address);
  ASSERT_NE(second_, nullptr);
  ASSERT_EQ(aclrtSetDevice(2), ACL_SUCCESS) << LastError();
  void* again = Device({4, 5, 6, 7});
  EXPECT_THAT(Host(again, 4), ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(DeviceStatsOf(*second_, 1).buffers(), 1u);
  float back[4];
  EXPECT_EQ(aclrtMemcpy(back, 16, on[2].o, 16, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_ERROR_INVALID_PARAM);
}

// One listed server is down when the program starts (the first-hour
// review, problem 7): runtimes count devices first, and the count must not
// fail every device. The dead server counts as one device whose
// aclrtSetDevice fails naming it and the cause; the live server's devices
// work. The long time-out is never waited out: a refused port fails at
// once, which is why the error can say "refused".
TEST_F(CApiDevicesTest, AServerDownAtStartUpCountsAsOneUnavailableDevice) {
  setenv("OPSERVER_TIMEOUT_MS", "600000", 1);
  server_ = StartServer(2);
  const std::string dead = ClosedPortAddress();
  Init(absl::StrCat(dead, ",", server_->address()));
  uint32_t count = 0;
  ASSERT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS) << LastError();
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(aclrtSetDevice(0), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr("cannot reach opserver at " + dead));
  EXPECT_THAT(LastError(), HasSubstr("connection refused"));
  const int64_t n = 4;
  for (int32_t d : {1, 2}) {
    ASSERT_EQ(aclrtSetDevice(d), ACL_SUCCESS) << LastError();
    void* g = Device({1, 2, 3, 4});
    void* s = Device({0, 1, 2, 3});
    void* o = Device({-1, -1, -1, -1});
    ASSERT_EQ(Threshold(g, s, o, n, 1.5f, nullptr), ACL_SUCCESS) << LastError();
    ASSERT_EQ(aclrtSynchronizeDevice(), ACL_SUCCESS) << LastError();
    EXPECT_THAT(Host(o, n), ElementsAre(0, 0, 3, 4));
  }
  // Still down: still its own error, the others unaffected.
  EXPECT_EQ(aclrtSetDevice(0), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr(dead));
}

// With every listed server down there is nothing to count on.
TEST_F(CApiDevicesTest, EveryServerDownFailsTheCountNamingTheFirst) {
  const std::string first = ClosedPortAddress();
  const std::string second = ClosedPortAddress();
  Init(absl::StrCat(first, ",", second));
  uint32_t count = 0;
  EXPECT_EQ(aclrtGetDeviceCount(&count), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr("cannot reach opserver at " + first));
  EXPECT_THAT(LastError(), HasSubstr("connection refused"));
}

}  // namespace
}  // namespace opserver
