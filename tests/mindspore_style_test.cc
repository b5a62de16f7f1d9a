// A program that loads the runtime the way MindSpore does: dlopen of
// <ascend>/lib64/libascendcl.so (here a symlink under $TEST_TMPDIR to
// libaclnn_remote.so), dlsym of each aclrt* name of its runtime symbol list
// (45 names), then calls through the pointers. It links nothing of the
// client: the headers give the types only. The server is a real opserver
// process (CPU device). The graph-capture names torch_npu's NPUGraph
// resolves are checked the same way.

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "acl/acl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/opserver_process.h"
#include "testing/test_main.h"

namespace opserver {
namespace {

std::string g_opserver;    // argv[1]
std::string g_remote_lib;  // argv[2]

// MindSpore's runtime symbol list (its acl_rt_symbol.cc), in its order.
const char* const kMindSporeRtSymbols[] = {
    "aclrtCreateContext",
    "aclrtCreateEvent",
    "aclrtCreateEventWithFlag",
    "aclrtCreateStreamWithConfig",
    "aclrtDestroyContext",
    "aclrtDestroyEvent",
    "aclrtDestroyStream",
    "aclrtEventElapsedTime",
    "aclrtFree",
    "aclrtFreeHost",
    "aclrtGetCurrentContext",
    "aclrtGetDevice",
    "aclrtGetDeviceCount",
    "aclrtGetDeviceIdFromExceptionInfo",
    "aclrtGetErrorCodeFromExceptionInfo",
    "aclrtGetMemInfo",
    "aclrtGetRunMode",
    "aclrtGetStreamIdFromExceptionInfo",
    "aclrtGetTaskIdFromExceptionInfo",
    "aclrtGetThreadIdFromExceptionInfo",
    "aclrtLaunchCallback",
    "aclrtMalloc",
    "aclrtMallocHost",
    "aclrtMemcpy",
    "aclrtMemcpyAsync",
    "aclrtMemset",
    "aclrtProcessReport",
    "aclrtQueryEventStatus",
    "aclrtRecordEvent",
    "aclrtResetDevice",
    "aclrtResetEvent",
    "aclrtSetCurrentContext",
    "aclrtSetDevice",
    "aclrtSetDeviceSatMode",
    "aclrtSetExceptionInfoCallback",
    "aclrtSetOpExecuteTimeOut",
    "aclrtSetOpWaitTimeout",
    "aclrtSetStreamFailureMode",
    "aclrtStreamQuery",
    "aclrtStreamWaitEvent",
    "aclrtSubscribeReport",
    "aclrtSynchronizeEvent",
    "aclrtSynchronizeStream",
    "aclrtSynchronizeStreamWithTimeout",
    "aclrtGetSocName",
};

class MindSporeStyleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    ASSERT_NE(tmp, nullptr);
    process::OpserverLaunch launch;
    launch.binary = g_opserver;
    launch.flags = {"--device=cpu"};
    launch.out_path = std::string(tmp) + "/opserver.out";
    absl::StatusOr<process::OpserverProcess> server =
        process::StartOpserver(launch);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *server;
    setenv("OPSERVER_ADDRESS", server_.address.c_str(), 1);
    // <ascend>/lib64/libascendcl.so, as MindSpore builds the path.
    const std::string ascend = std::string(tmp) + "/ascend/";
    ASSERT_EQ(system(("mkdir -p " + ascend + "lib64").c_str()), 0);
    const std::string path = ascend + "lib64/libascendcl.so";
    unlink(path.c_str());
    ASSERT_EQ(symlink(process::Absolute(g_remote_lib).c_str(), path.c_str()),
              0);
    handle_ = dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
  }
  void TearDown() override {
    if (server_.pid > 0) {
      kill(server_.pid, SIGTERM);
      waitpid(server_.pid, nullptr, 0);
    }
    // Not dlclosed: the library's threads may still be winding down.
  }

  template <typename F>
  F* Get(const char* name) {
    return reinterpret_cast<F*>(dlsym(handle_, name));
  }

  process::OpserverProcess server_;
  void* handle_ = nullptr;
};

TEST_F(MindSporeStyleTest, EveryNameResolves) {
  ASSERT_EQ(std::size(kMindSporeRtSymbols), 45u);
  std::vector<std::string> missing;
  for (const char* name : kMindSporeRtSymbols) {
    if (dlsym(handle_, name) == nullptr) missing.push_back(name);
  }
  EXPECT_THAT(missing, ::testing::IsEmpty());
}

// What MindSpore's runtime sets up at start around its exception handling:
// an exception callback, stop-on-failure streams, the operator time-outs;
// and the getters it calls in the callback, here on a NULL info.
TEST_F(MindSporeStyleTest, ExceptionHandlingAndTimeOutsAreSetUp) {
  ASSERT_EQ(Get<aclError(const char*)>("aclInit")(nullptr), ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(int32_t)>("aclrtSetDevice")(0), ACL_SUCCESS);
  static std::atomic<int> called{0};
  ASSERT_EQ(Get<aclError(aclrtExceptionInfoCallback)>(
                "aclrtSetExceptionInfoCallback")(
                +[](aclrtExceptionInfo*) { ++called; }),
            ACL_SUCCESS);
  aclrtStream stream = nullptr;
  ASSERT_EQ(Get<aclError(aclrtStream*)>("aclrtCreateStream")(&stream),
            ACL_SUCCESS);
  auto failure_mode =
      Get<aclError(aclrtStream, uint64_t)>("aclrtSetStreamFailureMode");
  EXPECT_EQ(failure_mode(stream, ACL_STOP_ON_FAILURE), ACL_SUCCESS);
  EXPECT_EQ(failure_mode(stream, 7), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(Get<aclError(uint32_t)>("aclrtSetOpExecuteTimeOut")(600),
            ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(uint32_t)>("aclrtSetOpWaitTimeout")(600), ACL_SUCCESS);
  for (const char* getter :
       {"aclrtGetDeviceIdFromExceptionInfo",
        "aclrtGetStreamIdFromExceptionInfo", "aclrtGetTaskIdFromExceptionInfo",
        "aclrtGetThreadIdFromExceptionInfo",
        "aclrtGetErrorCodeFromExceptionInfo"}) {
    EXPECT_EQ(Get<uint32_t(const aclrtExceptionInfo*)>(getter)(nullptr),
              0xFFFFFFFFu)
        << getter;
  }
  // Work on the stopped stream with the time-outs set runs as before.
  void* device = nullptr;
  ASSERT_EQ(Get<aclError(void**, size_t, aclrtMemMallocPolicy)>("aclrtMalloc")(
                &device, 64, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(void*, size_t, int32_t, size_t, aclrtStream)>(
                "aclrtMemsetAsync")(device, 64, 5, 64, stream),
            ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(aclrtStream)>("aclrtSynchronizeStream")(stream),
            ACL_SUCCESS);
  char out[64] = {};
  ASSERT_EQ(Get<aclError(void*, size_t, const void*, size_t, aclrtMemcpyKind)>(
                "aclrtMemcpy")(out, 64, device, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  for (char c : out) ASSERT_EQ(c, 5);
  EXPECT_EQ(called.load(), 0);  // Nothing failed.
  EXPECT_EQ(Get<aclError(uint32_t)>("aclrtSetOpExecuteTimeOut")(0),
            ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(uint32_t)>("aclrtSetOpWaitTimeout")(0), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(void*)>("aclrtFree")(device), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(int32_t)>("aclrtResetDevice")(0), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError()>("aclFinalize")(), ACL_SUCCESS);
}

// The graph-capture names torch_npu's NPUGraph resolves (aclmdlRI*),
// through dlsym as well: a capture of a memset and a device copy, which
// runs only when replayed, against the real server binary.
TEST_F(MindSporeStyleTest, GraphCaptureNamesResolveAndReplay) {
  for (const char* name :
       {"aclmdlRICaptureBegin", "aclmdlRICaptureGetInfo", "aclmdlRICaptureEnd",
        "aclmdlRICaptureThreadExchangeMode", "aclmdlRIExecuteAsync",
        "aclmdlRIExecute", "aclmdlRIDestroy", "aclmdlRIDebugJsonPrint"}) {
    ASSERT_NE(dlsym(handle_, name), nullptr) << name;
  }
  ASSERT_EQ(Get<aclError(const char*)>("aclInit")(nullptr), ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(int32_t)>("aclrtSetDevice")(0), ACL_SUCCESS);
  aclrtStream stream = nullptr;
  ASSERT_EQ(Get<aclError(aclrtStream*)>("aclrtCreateStream")(&stream),
            ACL_SUCCESS);
  auto malloc =
      Get<aclError(void**, size_t, aclrtMemMallocPolicy)>("aclrtMalloc");
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(malloc(&src, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  ASSERT_EQ(malloc(&dst, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  auto memcpy_sync =
      Get<aclError(void*, size_t, const void*, size_t, aclrtMemcpyKind)>(
          "aclrtMemcpy");
  const std::vector<char> poison(64, 7);
  ASSERT_EQ(memcpy_sync(dst, 64, poison.data(), 64, ACL_MEMCPY_HOST_TO_DEVICE),
            ACL_SUCCESS);
  ASSERT_EQ(
      Get<aclError(aclrtStream, aclmdlRICaptureMode)>("aclmdlRICaptureBegin")(
          stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL),
      ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(void*, size_t, int32_t, size_t, aclrtStream)>(
                "aclrtMemsetAsync")(src, 64, 3, 64, stream),
            ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(void*, size_t, const void*, size_t, aclrtMemcpyKind,
                         aclrtStream)>("aclrtMemcpyAsync")(
                dst, 64, src, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, stream),
            ACL_SUCCESS);
  aclmdlRICaptureStatus status = ACL_MODEL_RI_CAPTURE_STATUS_NONE;
  aclmdlRI during = nullptr;
  ASSERT_EQ(Get<aclError(aclrtStream, aclmdlRICaptureStatus*, aclmdlRI*)>(
                "aclmdlRICaptureGetInfo")(stream, &status, &during),
            ACL_SUCCESS);
  EXPECT_EQ(status, ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE);
  aclmdlRI model = nullptr;
  ASSERT_EQ(Get<aclError(aclrtStream, aclmdlRI*)>("aclmdlRICaptureEnd")(
                stream, &model),
            ACL_SUCCESS);
  EXPECT_EQ(model, during);
  std::vector<char> out(64, 0);
  ASSERT_EQ(memcpy_sync(out.data(), 64, dst, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  EXPECT_EQ(out, poison);  // Recorded, not run.
  ASSERT_EQ(Get<aclError(aclmdlRI, aclrtStream)>("aclmdlRIExecuteAsync")(
                model, stream),
            ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(aclrtStream)>("aclrtSynchronizeStream")(stream),
            ACL_SUCCESS);
  ASSERT_EQ(memcpy_sync(out.data(), 64, dst, 64, ACL_MEMCPY_DEVICE_TO_HOST),
            ACL_SUCCESS);
  EXPECT_EQ(out, std::vector<char>(64, 3));
  EXPECT_EQ(Get<aclError(aclmdlRI)>("aclmdlRIDestroy")(model), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError()>("aclFinalize")(), ACL_SUCCESS);
}

// The calls MindSpore's runtime makes at start and around a step, through
// the dlsym'd pointers.
TEST_F(MindSporeStyleTest, TheResolvedCallsDriveADevice) {
  // Every name called below, checked first so a missing one fails the test
  // instead of crashing it.
  for (const char* name : {"aclInit",
                           "aclFinalize",
                           "aclrtGetRunMode",
                           "aclrtGetDeviceCount",
                           "aclrtSetDevice",
                           "aclrtSetDeviceSatMode",
                           "aclrtCreateStreamWithConfig",
                           "aclrtMalloc",
                           "aclrtMemcpyAsync",
                           "aclrtCreateEvent",
                           "aclrtRecordEvent",
                           "aclrtSynchronizeStreamWithTimeout",
                           "aclrtStreamQuery",
                           "aclrtSynchronizeEvent",
                           "aclrtGetSocName",
                           "aclrtGetLastError",
                           "aclrtDestroyEvent",
                           "aclrtFree",
                           "aclrtDestroyStream",
                           "aclrtResetDevice"}) {
    ASSERT_NE(dlsym(handle_, name), nullptr) << name;
  }
  auto init = Get<aclError(const char*)>("aclInit");
  auto finalize = Get<aclError()>("aclFinalize");
  ASSERT_NE(init, nullptr);
  ASSERT_NE(finalize, nullptr);
  ASSERT_EQ(init(nullptr), ACL_SUCCESS);
  auto run_mode = Get<aclError(aclrtRunMode*)>("aclrtGetRunMode");
  aclrtRunMode mode = ACL_DEVICE;
  ASSERT_EQ(run_mode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_HOST);
  uint32_t count = 0;
  ASSERT_EQ(Get<aclError(uint32_t*)>("aclrtGetDeviceCount")(&count),
            ACL_SUCCESS);
  EXPECT_EQ(count, 1u);
  ASSERT_EQ(Get<aclError(int32_t)>("aclrtSetDevice")(0), ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(aclrtFloatOverflowMode)>("aclrtSetDeviceSatMode")(
                ACL_RT_OVERFLOW_MODE_SATURATION),
            ACL_SUCCESS);
  aclrtStream stream = nullptr;
  ASSERT_EQ(
      Get<aclError(aclrtStream*, uint32_t, uint32_t)>(
          "aclrtCreateStreamWithConfig")(&stream, 0, ACL_STREAM_FAST_LAUNCH),
      ACL_SUCCESS);
  void* device = nullptr;
  ASSERT_EQ(Get<aclError(void**, size_t, aclrtMemMallocPolicy)>("aclrtMalloc")(
                &device, 64, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  char in[64], out[64] = {};
  for (int i = 0; i < 64; ++i) in[i] = static_cast<char>(i);
  auto copy_async =
      Get<aclError(void*, size_t, const void*, size_t, aclrtMemcpyKind,
                   aclrtStream)>("aclrtMemcpyAsync");
  ASSERT_EQ(copy_async(device, 64, in, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS);
  ASSERT_EQ(copy_async(out, 64, device, 64, ACL_MEMCPY_DEVICE_TO_HOST, stream),
            ACL_SUCCESS);
  aclrtEvent event = nullptr;
  ASSERT_EQ(Get<aclError(aclrtEvent*)>("aclrtCreateEvent")(&event),
            ACL_SUCCESS);
  ASSERT_EQ(
      Get<aclError(aclrtEvent, aclrtStream)>("aclrtRecordEvent")(event, stream),
      ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(aclrtStream, int32_t)>(
                "aclrtSynchronizeStreamWithTimeout")(stream, 60000),
            ACL_SUCCESS);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(out[i], in[i]) << i;
  aclrtStreamStatus status = ACL_STREAM_STATUS_NOT_READY;
  ASSERT_EQ(Get<aclError(aclrtStream, aclrtStreamStatus*)>("aclrtStreamQuery")(
                stream, &status),
            ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  ASSERT_EQ(Get<aclError(aclrtEvent)>("aclrtSynchronizeEvent")(event),
            ACL_SUCCESS);
  EXPECT_NE(Get<const char*()>("aclrtGetSocName")(), nullptr);
  // A bad argument, seen the way frameworks read errors.
  EXPECT_EQ(Get<aclError(aclrtStream, int32_t)>(
                "aclrtSynchronizeStreamWithTimeout")(stream, -5),
            ACL_ERROR_INVALID_PARAM);
  auto get_last = Get<aclError(aclrtLastErrLevel)>("aclrtGetLastError");
  ASSERT_NE(get_last, nullptr);
  EXPECT_EQ(get_last(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(get_last(ACL_RT_THREAD_LEVEL), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(aclrtEvent)>("aclrtDestroyEvent")(event), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(void*)>("aclrtFree")(device), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(aclrtStream)>("aclrtDestroyStream")(stream),
            ACL_SUCCESS);
  EXPECT_EQ(Get<aclError(int32_t)>("aclrtResetDevice")(0), ACL_SUCCESS);
  EXPECT_EQ(finalize(), ACL_SUCCESS);
}

// MindSpore's callback thread: subscribed to a stream, it loops on
// aclrtProcessReport(100), taking the time-out as "nothing yet"; callbacks
// launched on the stream run there, after the stream's earlier work.
TEST_F(MindSporeStyleTest, TheCallbackThreadRunsCallbacksInStreamOrder) {
  ASSERT_EQ(Get<aclError(const char*)>("aclInit")(nullptr), ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(int32_t)>("aclrtSetDevice")(0), ACL_SUCCESS);
  auto process = Get<aclError(int32_t)>("aclrtProcessReport");
  auto subscribe = Get<aclError(uint64_t, aclrtStream)>("aclrtSubscribeReport");
  auto launch =
      Get<aclError(aclrtCallback, void*, aclrtCallbackBlockType, aclrtStream)>(
          "aclrtLaunchCallback");
  ASSERT_NE(process, nullptr);
  ASSERT_NE(subscribe, nullptr);
  ASSERT_NE(launch, nullptr);
  aclrtStream stream = nullptr;
  ASSERT_EQ(Get<aclError(aclrtStream*)>("aclrtCreateStream")(&stream),
            ACL_SUCCESS);
  std::atomic<bool> stop{false};
  std::atomic<int> other_errors{0};
  std::atomic<uint64_t> id{0};
  absl::Notification started;
  std::thread callbacks([&] {
    id = static_cast<uint64_t>(pthread_self());
    started.Notify();
    while (!stop) {
      const aclError ret = process(100);
      if (ret != ACL_SUCCESS && ret != ACL_ERROR_RT_REPORT_TIMEOUT &&
          ret != ACL_ERROR_RT_THREAD_SUBSCRIBE) {
        ++other_errors;
      }
    }
  });
  started.WaitForNotification();
  ASSERT_EQ(subscribe(id, stream), ACL_SUCCESS);
  // A copy queued before the callback has landed when it runs.
  char in[64], seen[64] = {};
  for (int i = 0; i < 64; ++i) in[i] = static_cast<char>(i + 1);
  void* device = nullptr;
  ASSERT_EQ(Get<aclError(void**, size_t, aclrtMemMallocPolicy)>("aclrtMalloc")(
                &device, 64, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_SUCCESS);
  auto copy_async =
      Get<aclError(void*, size_t, const void*, size_t, aclrtMemcpyKind,
                   aclrtStream)>("aclrtMemcpyAsync");
  ASSERT_EQ(copy_async(device, 64, in, 64, ACL_MEMCPY_HOST_TO_DEVICE, stream),
            ACL_SUCCESS);
  ASSERT_EQ(copy_async(seen, 64, device, 64, ACL_MEMCPY_DEVICE_TO_HOST, stream),
            ACL_SUCCESS);
  struct Done {
    absl::Notification ran;
    std::atomic<uint64_t> thread{0};
    static void Run(void* self) {
      Done* done = static_cast<Done*>(self);
      done->thread = static_cast<uint64_t>(pthread_self());
      done->ran.Notify();
    }
  } done;
  ASSERT_EQ(launch(&Done::Run, &done, ACL_CALLBACK_BLOCK, stream),
            ACL_SUCCESS);
  ASSERT_EQ(Get<aclError(aclrtStream)>("aclrtSynchronizeStream")(stream),
            ACL_SUCCESS);
  // A blocking callback: the synchronize after it waited for it.
  EXPECT_TRUE(done.ran.HasBeenNotified());
  EXPECT_EQ(done.thread.load(), id.load());
  for (int i = 0; i < 64; ++i) ASSERT_EQ(seen[i], in[i]) << i;
  EXPECT_EQ(Get<aclError(uint64_t, aclrtStream)>("aclrtUnSubscribeReport")(
                id, stream),
            ACL_SUCCESS);
  stop = true;
  callbacks.join();
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_EQ(Get<aclError(int32_t)>("aclrtResetDevice")(0), ACL_SUCCESS);
  EXPECT_EQ(Get<aclError()>("aclFinalize")(), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver

int main(int argc, char** argv) {
  return opserver::test_main::RunWithPaths(
      argc, argv,
      {{"OPSERVER", &opserver::g_opserver},
       {"LIBACLNN_REMOTE", &opserver::g_remote_lib}});
}
