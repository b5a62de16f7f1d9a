// The C API's questions and bounded waits over a device whose streams a
// test can hold (FakeDevice): aclrtStreamQuery, the synchronize calls with a
// time-out, the thread's last error, the run and saturation modes. Every
// wait that must time out waits on a held stream, so it cannot finish in
// time whatever the machine's speed; none of the tests sleeps.

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_threshold_backward.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/capi_held_streams.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

using CApiSyncTest = CApiHeldStreamsTest;

TEST_F(CApiSyncTest, StreamQueryFollowsTheStreamsWork) {
  auto [a, a_device] = NewStream();
  aclrtStreamStatus status = ACL_STREAM_STATUS_NOT_READY;
  ASSERT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  const Held held = HoldOne(a, *a_device);
  ASSERT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);
  // Asking again asks the server again (nothing says it is done).
  ASSERT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);
  // The default stream is idle meanwhile (once the uploads' tails there are
  // done: the server answers an upload before its stream lets go of it).
  ASSERT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtStreamQuery(nullptr, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  a_device->ReleaseLaunches();
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  ASSERT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  ExpectRan(held);
  EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS);
}

// A stream found idle by a synchronize, with nothing queued on it since, is
// answered without the server: with the server gone, the query of that
// stream still succeeds, while the query of a stream that had work queued
// since fails (it has to ask).
TEST_F(CApiSyncTest, AKnownIdleStreamIsAnsweredWithoutARoundTrip) {
  auto [a, a_device] = NewStream();
  auto [b, b_device] = NewStream();
  void* x = Floats(std::vector<float>(kN, 1));
  void* y = Floats(std::vector<float>(kN, 0));
  CopyByLaunch(x, x, y, a);
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  // Work on another stream does not make `a` unknown.
  CopyByLaunch(x, x, y, b);
  ASSERT_EQ(aclrtSynchronizeStream(b), ACL_SUCCESS) << LastError();
  CopyByLaunch(x, x, y, b);
  server_.reset();
  aclrtStreamStatus status = ACL_STREAM_STATUS_NOT_READY;
  EXPECT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(status, ACL_STREAM_STATUS_COMPLETE);
  EXPECT_NE(aclrtStreamQuery(b, &status), ACL_SUCCESS);
  EXPECT_THAT(LastError(), HasSubstr("aclrtStreamQuery"));
}

TEST_F(CApiSyncTest, AStreamTimeOutLeavesTheWorkAndItsErrorForLater) {
  auto [a, a_device] = NewStream();
  const Held held = HoldOne(a, *a_device);
  // The held launch's synchronize on the device fails once it runs.
  device_->FailNextSynchronize(absl::InternalError("kernel fault"));
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(a, 1),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_THAT(LastError(), HasSubstr("not done within 1ms"));
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(a, 0),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(1),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(0),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  a_device->ReleaseLaunches();
  // The deferred error was not lost to the time-outs.
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(a, -1), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr("kernel fault"));
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(a, 60000), ACL_SUCCESS)
      << LastError();
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(60000), ACL_SUCCESS)
      << LastError();
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(a, 0), ACL_SUCCESS)
      << LastError();
  ExpectRan(held);
  EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS);
}

TEST_F(CApiSyncTest, AnEventTimeOutLeavesTheRecordInForce) {
  auto [a, a_device] = NewStream();
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  const Held held = HoldOne(a, *a_device);
  ASSERT_EQ(aclrtRecordEvent(event, a), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 1),
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT);
  EXPECT_THAT(LastError(), HasSubstr("did not complete within 1ms"));
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 0),
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT);
  EXPECT_THAT(LastError(), HasSubstr("timeout 0 only checks"));
  a_device->ReleaseLaunches();
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 60000), ACL_SUCCESS)
      << LastError();
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 0), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, -1), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
  ExpectRan(held);
  EXPECT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS);
}

// One row per bad argument: the call, the code, the message it leaves.
struct BadCall {
  const char* name;
  std::function<aclError()> call;
  aclError code;
  const char* message;
};

TEST_F(CApiSyncTest, BadArgumentsReturnCannCodes) {
  auto [a, a_device] = NewStream();
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS);
  const auto unknown_stream = reinterpret_cast<aclrtStream>(0x1234);
  const auto unknown_event = reinterpret_cast<aclrtEvent>(0x5000000000f0);
  aclrtStreamStatus status;
  aclrtRunMode mode;
  const std::vector<BadCall> table = {
      {"query, status NULL", [&] { return aclrtStreamQuery(a, nullptr); },
       ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: status is NULL"},
      {"query, unknown stream",
       [&] { return aclrtStreamQuery(unknown_stream, &status); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtStreamQuery: stream 1234 is not a live aclrtCreateStream"},
      {"stream sync, -2",
       [&] { return aclrtSynchronizeStreamWithTimeout(a, -2); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeStreamWithTimeout: timeout -2 ms is negative"},
      {"stream sync, INT32_MIN",
       [&] { return aclrtSynchronizeStreamWithTimeout(a, INT32_MIN); },
       ACL_ERROR_INVALID_PARAM, "timeout -2147483648 ms is negative"},
      {"stream sync, unknown stream",
       [&] { return aclrtSynchronizeStreamWithTimeout(unknown_stream, 10); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeStreamWithTimeout: stream 1234 is not a live"},
      {"stream sync for ever, unknown stream",
       [&] { return aclrtSynchronizeStreamWithTimeout(unknown_stream, -1); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeStream: stream 1234 is not a live"},
      {"device sync, -2", [&] { return aclrtSynchronizeDeviceWithTimeout(-2); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeDeviceWithTimeout: timeout -2 ms is negative"},
      {"event sync, -3",
       [&] { return aclrtSynchronizeEventWithTimeout(event, -3); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeEventWithTimeout: timeout -3 ms is negative"},
      {"event sync, NULL event",
       [&] { return aclrtSynchronizeEventWithTimeout(nullptr, 10); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeEventWithTimeout: event 0 is not a live"},
      {"event sync, unknown event",
       [&] { return aclrtSynchronizeEventWithTimeout(unknown_event, 10); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeEventWithTimeout: event 5000000000f0 is not a live"},
      {"event sync 0, unknown event",
       [&] { return aclrtSynchronizeEventWithTimeout(unknown_event, 0); },
       ACL_ERROR_INVALID_PARAM,
       "aclrtSynchronizeEventWithTimeout: event 5000000000f0 is not a live"},
      {"peek, unknown level",
       [&] { return aclrtPeekAtLastError(static_cast<aclrtLastErrLevel>(1)); },
       ACL_ERROR_INVALID_PARAM, "aclrtPeekAtLastError: unknown level 1"},
      {"get, unknown level",
       [&] { return aclrtGetLastError(static_cast<aclrtLastErrLevel>(-1)); },
       ACL_ERROR_INVALID_PARAM, "aclrtGetLastError: unknown level -1"},
      {"run mode, NULL", [&] { return aclrtGetRunMode(nullptr); },
       ACL_ERROR_INVALID_PARAM, "aclrtGetRunMode: runMode is NULL"},
      {"set sat mode, UNDEF",
       [&] { return aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_UNDEF); },
       ACL_ERROR_INVALID_PARAM, "aclrtSetDeviceSatMode: unknown mode 2"},
      {"set sat mode, -1",
       [&] {
         return aclrtSetDeviceSatMode(static_cast<aclrtFloatOverflowMode>(-1));
       },
       ACL_ERROR_INVALID_PARAM, "aclrtSetDeviceSatMode: unknown mode -1"},
      {"get sat mode, NULL", [&] { return aclrtGetDeviceSatMode(nullptr); },
       ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceSatMode: mode is NULL"},
  };
  for (const BadCall& row : table) {
    EXPECT_EQ(row.call(), row.code) << row.name;
    EXPECT_THAT(LastError(), HasSubstr(row.message)) << row.name;
  }
  // The good arguments of the same calls.
  EXPECT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclrtStreamQuery(nullptr, &status), ACL_SUCCESS) << LastError();
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(a, 0), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(nullptr, 5000), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(0), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(-1), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 0), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 5000), ACL_SUCCESS);
  EXPECT_EQ(aclrtGetRunMode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_HOST);

  // A thread without a context: CANN's 107002 for the calls that need a
  // device (and the run mode, which does not).
  std::thread([&] {
    aclrtFloatOverflowMode sat;
    EXPECT_EQ(aclrtStreamQuery(nullptr, &status), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_THAT(LastError(), HasSubstr("aclrtStreamQuery: the calling thread "
                                       "has no context"));
    EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(nullptr, 10),
              ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_EQ(aclrtSynchronizeDeviceWithTimeout(10), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_EQ(aclrtGetDeviceSatMode(&sat), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_EQ(aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_SATURATION),
              ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_EQ(aclrtGetRunMode(&mode), ACL_SUCCESS);
    // A created stream works from any thread.
    EXPECT_EQ(aclrtStreamQuery(a, &status), ACL_SUCCESS) << LastError();
  }).join();

  EXPECT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
  EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS);
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  EXPECT_EQ(aclrtStreamQuery(nullptr, &status), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(nullptr, 10),
            ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtSynchronizeEventWithTimeout(event, 10),
            ACL_ERROR_UNINITIALIZE);
}

TEST_F(CApiSyncTest, TheLastErrorIsPerThreadAndGetClearsIt) {
  // An earlier test's TearDown may have left one on this thread.
  aclrtGetLastError(ACL_RT_THREAD_LEVEL);
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST),
            ACL_ERROR_INVALID_PARAM);
  // Another thread, started after the failure, has none.
  std::thread([] {
    EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS);
    EXPECT_EQ(aclrtGetDevice(nullptr), ACL_ERROR_INVALID_PARAM);
    EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
    aclrtContext context;
    EXPECT_EQ(aclrtGetCurrentContext(&context), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL),
              ACL_ERROR_RT_CONTEXT_NULL);
  }).join();
  // This thread's is still the failed malloc's: a later success keeps it,
  // peek keeps it, get returns and clears it.
  uint32_t count = 0;
  EXPECT_EQ(aclrtGetDeviceCount(&count), ACL_SUCCESS);
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS);
  EXPECT_EQ(aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL), ACL_SUCCESS);
  // An operator's failure counts too, with its aclnn status.
  EXPECT_EQ(aclnnThresholdBackwardGetWorkspaceSize(nullptr, nullptr, nullptr,
                                                   nullptr, nullptr, nullptr),
            ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACLNN_ERR_PARAM_NULLPTR);
}

TEST_F(CApiSyncTest, RunModeIsHostAndTheSaturationModeIsKeptPerDevice) {
  aclrtRunMode run = ACL_DEVICE;
  ASSERT_EQ(aclrtGetRunMode(&run), ACL_SUCCESS);
  EXPECT_EQ(run, ACL_HOST);
  aclrtFloatOverflowMode mode = ACL_RT_OVERFLOW_MODE_UNDEF;
  ASSERT_EQ(aclrtGetDeviceSatMode(&mode), ACL_SUCCESS) << LastError();
  EXPECT_EQ(mode, ACL_RT_OVERFLOW_MODE_INFNAN);
  ASSERT_EQ(aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_SATURATION),
            ACL_SUCCESS);
  ASSERT_EQ(aclrtGetDeviceSatMode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_RT_OVERFLOW_MODE_SATURATION);
  // The device's, not the thread's: another thread on it sees it.
  std::thread([] {
    ASSERT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
    aclrtFloatOverflowMode seen = ACL_RT_OVERFLOW_MODE_UNDEF;
    ASSERT_EQ(aclrtGetDeviceSatMode(&seen), ACL_SUCCESS);
    EXPECT_EQ(seen, ACL_RT_OVERFLOW_MODE_SATURATION);
    ASSERT_EQ(aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_INFNAN), ACL_SUCCESS);
  }).join();
  ASSERT_EQ(aclrtGetDeviceSatMode(&mode), ACL_SUCCESS);
  EXPECT_EQ(mode, ACL_RT_OVERFLOW_MODE_INFNAN);
}

}  // namespace
}  // namespace opserver
