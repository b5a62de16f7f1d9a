// The C API's events over a device whose streams a test can hold
// (FakeDevice): a wait holds the waiting stream on the server until the
// record before it completes, and every event call returns CANN's codes.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

class CApiEventsTest : public CApiHeldStreamsTest {
 protected:
  // The producer (y = g on stream A, held on the device) and the consumer
  // (z = y on stream B, copied back asynchronously), with or without a
  // record on A and a wait on B between them; the bytes B copied back.
  std::vector<float> ProduceAndConsume(bool wait) {
    std::vector<float> g(kN), host(kN, -2);
    for (int64_t i = 0; i < kN; ++i) g[i] = static_cast<float>(i + 1);
    void* dg = Floats(g);
    void* dx = Floats(std::vector<float>(kN, 10));
    void* dy = Floats(std::vector<float>(kN, -1));
    void* dz = Floats(std::vector<float>(kN, 0));
    auto [a, a_device] = NewStream();
    auto [b, b_device] = NewStream();
    aclrtEvent event = nullptr;
    EXPECT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS) << LastError();
    a_device->HoldLaunches();
    CopyByLaunch(dg, dx, dy, a);
    if (wait) {
      EXPECT_EQ(aclrtRecordEvent(event, a), ACL_SUCCESS) << LastError();
      EXPECT_EQ(aclrtStreamWaitEvent(b, event), ACL_SUCCESS) << LastError();
    }
    CopyByLaunch(dy, dx, dz, b);
    EXPECT_EQ(aclrtMemcpyAsync(host.data(), kN * 4, dz, kN * 4,
                               ACL_MEMCPY_DEVICE_TO_HOST, b),
              ACL_SUCCESS)
        << LastError();
    for (int i = 0; i < 60000 && a_device->WaitingLaunches() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(a_device->WaitingLaunches(), 1);
    if (wait) {
      aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
      EXPECT_EQ(aclrtQueryEventStatus(event, &status), ACL_SUCCESS);
      EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_NOT_READY);
      // Let the producer go only after B had every chance to run early.
      absl::SleepFor(absl::Milliseconds(50));
      EXPECT_EQ(b_device->launches.load(), 0);
      a_device->ReleaseLaunches();
    } else {
      // Without the wait B runs now, while A is still held.
      EXPECT_EQ(aclrtSynchronizeStream(b), ACL_SUCCESS) << LastError();
      a_device->ReleaseLaunches();
    }
    EXPECT_EQ(aclrtSynchronizeStream(b), ACL_SUCCESS) << LastError();
    EXPECT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS) << LastError();
    if (wait) {
      EXPECT_EQ(aclrtSynchronizeEvent(event), ACL_SUCCESS) << LastError();
      aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
      EXPECT_EQ(aclrtQueryEventStatus(event, &status), ACL_SUCCESS);
      EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_COMPLETE);
    }
    EXPECT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
    EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS);
    EXPECT_EQ(aclrtDestroyStream(b), ACL_SUCCESS);
    for (void* p : {dg, dx, dy, dz}) aclrtFree(p);
    return host;
  }

};

// The control: without the wait, the consumer reads the producer's output
// before it exists (what the next test would see if waits were ignored).
// A record its stream never reached (the stream was destroyed while a
// launch before the record held it) is cancelled, not complete: querying
// or synchronizing the event fails with the cancellation, with its code
// and message, rather than reporting COMPLETE.
TEST_F(CApiEventsTest, ACancelledRecordIsAnErrorNotACompletion) {
  void* dg = Floats(std::vector<float>(kN, 1));
  void* dx = Floats(std::vector<float>(kN, 1));
  void* dy = Floats(std::vector<float>(kN, 0));
  auto [a, a_device] = NewStream();
  aclrtEvent event = nullptr;
  ASSERT_EQ(aclrtCreateEvent(&event), ACL_SUCCESS) << LastError();
  a_device->HoldLaunches();
  CopyByLaunch(dg, dx, dy, a);
  ASSERT_EQ(aclrtRecordEvent(event, a), ACL_SUCCESS) << LastError();
  for (int i = 0; i < 60000 && a_device->WaitingLaunches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(a_device->WaitingLaunches(), 1);
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
  EXPECT_EQ(aclrtQueryEventStatus(event, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_NOT_READY);
  // Destroying the stream cancels what it holds: the held launch stops,
  // and the record queued behind it is dropped, never reached.
  EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS) << LastError();
  status = ACL_EVENT_RECORDED_STATUS_COMPLETE;
  const aclError query = aclrtQueryEventStatus(event, &status);
  const std::string query_error = LastError();
  EXPECT_EQ(query, ACL_ERROR_RT_FAILURE) << query_error;
  EXPECT_THAT(query_error,
              HasSubstr("QueryEvent: the event's record was cancelled before "
                        "its stream reached it (the stream was destroyed)"));
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_COMPLETE) << "left as it was";
  EXPECT_EQ(aclrtSynchronizeEvent(event), ACL_ERROR_RT_FAILURE);
  EXPECT_THAT(LastError(), HasSubstr("record was cancelled"));
  EXPECT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
  for (void* p : {dg, dx, dy}) aclrtFree(p);
}

TEST_F(CApiEventsTest, WithoutAWaitTheConsumerRunsFirst) {
  EXPECT_EQ(ProduceAndConsume(/*wait=*/false), std::vector<float>(kN, -1));
}

TEST_F(CApiEventsTest, AWaitOrdersTheConsumerAfterTheProducer) {
  std::vector<float> produced(kN);
  for (int64_t i = 0; i < kN; ++i) produced[i] = static_cast<float>(i + 1);
  EXPECT_EQ(ProduceAndConsume(/*wait=*/true), produced);
}

TEST_F(CApiEventsTest, ElapsedTimeFollowsTheRecords) {
  auto [a, a_device] = NewStream();
  a_device->SetLaunchDelay(absl::Milliseconds(5));
  aclrtEvent start = nullptr, end = nullptr, never = nullptr;
  ASSERT_EQ(aclrtCreateEventWithFlag(&start, ACL_EVENT_TIME_LINE), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateEventWithFlag(&end, ACL_EVENT_TIME_LINE), ACL_SUCCESS);
  ASSERT_EQ(aclrtCreateEvent(&never), ACL_SUCCESS);
  void* x = Floats(std::vector<float>(kN, 1));
  void* y = Floats(std::vector<float>(kN, 0));
  ASSERT_EQ(aclrtRecordEvent(start, a), ACL_SUCCESS);
  CopyByLaunch(x, x, y, a);
  ASSERT_EQ(aclrtRecordEvent(end, a), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeEvent(end), ACL_SUCCESS) << LastError();
  float ms = 0;
  ASSERT_EQ(aclrtEventElapsedTime(&ms, start, end), ACL_SUCCESS) << LastError();
  EXPECT_GT(ms, 0.0f);
  float back = 0;
  ASSERT_EQ(aclrtEventElapsedTime(&back, end, start), ACL_SUCCESS);
  EXPECT_LT(back, 0.0f);
  // Never recorded: CANN's 107006.
  EXPECT_EQ(aclrtEventElapsedTime(&ms, start, never),
            ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID);
  // Reset (in order on A): unrecorded again.
  ASSERT_EQ(aclrtResetEvent(end, a), ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(a), ACL_SUCCESS);
  EXPECT_EQ(aclrtEventElapsedTime(&ms, start, end),
            ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID);
  for (aclrtEvent e : {start, end, never}) {
    EXPECT_EQ(aclrtDestroyEvent(e), ACL_SUCCESS);
  }
  EXPECT_EQ(aclrtDestroyStream(a), ACL_SUCCESS);
}

TEST_F(CApiEventsTest, BadArgumentsReturnCannCodes) {
  aclrtEvent event = nullptr;
  EXPECT_EQ(aclrtCreateEvent(nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCreateEventWithFlag(nullptr, ACL_EVENT_SYNC),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtCreateEventWithFlag(&event, 0x80), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("unknown flags 0x80"));
  ASSERT_EQ(
      aclrtCreateEventWithFlag(&event, ACL_EVENT_SYNC | ACL_EVENT_TIME_LINE),
      ACL_SUCCESS);

  // Unrecorded: complete, and a synchronize returns at once.
  aclrtEventRecordedStatus status = ACL_EVENT_RECORDED_STATUS_NOT_READY;
  EXPECT_EQ(aclrtQueryEventStatus(event, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_EVENT_RECORDED_STATUS_COMPLETE);
  EXPECT_EQ(aclrtSynchronizeEvent(event), ACL_SUCCESS);
  EXPECT_EQ(aclrtQueryEventStatus(event, nullptr), ACL_ERROR_INVALID_PARAM);

  const auto unknown = reinterpret_cast<aclrtEvent>(0x5000000000f0);
  const auto bad_stream = reinterpret_cast<aclrtStream>(0x1234);
  for (aclrtEvent e : {static_cast<aclrtEvent>(nullptr), unknown}) {
    EXPECT_EQ(aclrtRecordEvent(e, nullptr), ACL_ERROR_INVALID_PARAM);
    EXPECT_EQ(aclrtResetEvent(e, nullptr), ACL_ERROR_INVALID_PARAM);
    EXPECT_EQ(aclrtStreamWaitEvent(nullptr, e), ACL_ERROR_INVALID_PARAM);
    EXPECT_EQ(aclrtQueryEventStatus(e, &status), ACL_ERROR_INVALID_PARAM);
    EXPECT_EQ(aclrtSynchronizeEvent(e), ACL_ERROR_INVALID_PARAM);
    EXPECT_EQ(aclrtDestroyEvent(e), ACL_ERROR_INVALID_PARAM);
    float ms;
    EXPECT_EQ(aclrtEventElapsedTime(&ms, e, event), ACL_ERROR_INVALID_PARAM);
  }
  EXPECT_EQ(aclrtRecordEvent(event, bad_stream), ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("not a live aclrtCreateStream stream"));
  EXPECT_EQ(aclrtStreamWaitEvent(bad_stream, event), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtEventElapsedTime(nullptr, event, event),
            ACL_ERROR_INVALID_PARAM);

  // Destroyed: unknown from then on.
  ASSERT_EQ(aclrtDestroyEvent(event), ACL_SUCCESS);
  EXPECT_EQ(aclrtRecordEvent(event, nullptr), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtDestroyEvent(event), ACL_ERROR_INVALID_PARAM);

  // A thread with no context cannot make one; finalized, nothing works.
  aclrtEvent other = nullptr;
  std::thread([&] {
    EXPECT_EQ(aclrtCreateEvent(&other), ACL_ERROR_RT_CONTEXT_NULL);
  }).join();
  ASSERT_EQ(aclFinalize(), ACL_SUCCESS);
  EXPECT_EQ(aclrtCreateEvent(&other), ACL_ERROR_UNINITIALIZE);
  EXPECT_EQ(aclrtQueryEventStatus(event, &status), ACL_ERROR_UNINITIALIZE);
}

}  // namespace
}  // namespace opserver
