// The C API's host callbacks over a device whose streams a test can hold
// (FakeDevice): aclrtSubscribeReport, aclrtUnSubscribeReport,
// aclrtProcessReport, aclrtLaunchCallback and aclrtLaunchHostFunc. Order
// is made certain by held streams and by gates inside the callbacks; a
// time-out a test expects waits on a stream that cannot finish in time
// whatever the machine's speed; none of the tests sleeps.

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "acl/acl.h"
#include "devices/testing/fake_device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/capi_held_streams.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

uint64_t ThisThread() { return static_cast<uint64_t>(pthread_self()); }

// What a callback saw, and gates a test opens from outside.
struct Probe {
  std::atomic<int> runs{0};
  std::atomic<uint64_t> thread{0};
  // Launches of `record` finished when the callback ran.
  std::shared_ptr<FakeStreamRecord> record;
  std::atomic<int> launches_seen{-1};
  absl::Notification entered;
  absl::Notification open;  // A gated callback waits for it.
  bool gated = false;

  static void Run(void* self) {
    Probe* probe = static_cast<Probe*>(self);
    probe->thread = ThisThread();
    if (probe->record != nullptr) {
      probe->launches_seen = probe->record->launches.load();
    }
    probe->entered.Notify();
    if (probe->gated) probe->open.WaitForNotification();
    ++probe->runs;
  }
};

class CApiCallbacksTest : public CApiHeldStreamsTest {
 protected:
  // A launch on `stream` that copies g into a fresh y; returns y.
  void* LaunchCopy(aclrtStream stream) {
    std::vector<float> g(kN);
    for (int64_t i = 0; i < kN; ++i) g[i] = static_cast<float>(i + 1);
    void* y = Floats(std::vector<float>(kN, -1));
    CopyByLaunch(Floats(g), Floats(std::vector<float>(kN, 10)), y, stream);
    return y;
  }
  void ExpectCopied(void* y) {
    std::vector<float> out(kN, 0);
    ASSERT_EQ(
        aclrtMemcpy(out.data(), kN * 4, y, kN * 4, ACL_MEMCPY_DEVICE_TO_HOST),
        ACL_SUCCESS)
        << LastError();
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[kN - 1], static_cast<float>(kN));
  }
  // Waits until `record` holds a launch (bounded).
  static void WaitHeld(FakeStreamRecord& record) {
    for (int i = 0; i < 60000 && record.WaitingLaunches() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(record.WaitingLaunches(), 1);
  }
};

// A thread that processes reports until told to stop; `results` gets each
// aclrtProcessReport's code other than the time-out.
class ReportThread {
 public:
  ReportThread() : thread_([this] { Loop(); }) {
    started_.WaitForNotification();
  }
  ~ReportThread() {
    stop_ = true;
    thread_.join();
  }
  uint64_t id() const { return id_; }

 private:
  void Loop() {
    id_ = ThisThread();
    started_.Notify();
    while (!stop_) {
      aclrtProcessReport(20);  // Time-outs too: stop_ is checked between.
    }
  }
  std::atomic<bool> stop_{false};
  uint64_t id_ = 0;
  absl::Notification started_;
  std::thread thread_;
};

TEST_F(CApiCallbacksTest, CallbackRunsOnlyAfterTheWorkBeforeItOnItsThread) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSubscribeReport(ThisThread(), stream), ACL_SUCCESS)
      << LastError();
  record->HoldLaunches();
  void* y = LaunchCopy(stream);
  WaitHeld(*record);
  Probe probe;
  probe.record = record;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_NO_BLOCK, stream),
      ACL_SUCCESS)
      << LastError();
  // The launch before it is held on the device: nothing can arrive.
  EXPECT_EQ(aclrtProcessReport(50), ACL_ERROR_RT_REPORT_TIMEOUT);
  EXPECT_THAT(LastError(), HasSubstr("no callback reached within"));
  EXPECT_EQ(probe.runs.load(), 0);
  record->ReleaseLaunches();
  ASSERT_EQ(aclrtProcessReport(60000), ACL_SUCCESS) << LastError();
  EXPECT_EQ(probe.runs.load(), 1);
  EXPECT_EQ(probe.thread.load(), ThisThread());
  EXPECT_EQ(probe.launches_seen.load(), 1);  // After the launch ran.
  // Exactly once.
  EXPECT_EQ(aclrtProcessReport(10), ACL_ERROR_RT_REPORT_TIMEOUT);
  EXPECT_EQ(probe.runs.load(), 1);
  ExpectCopied(y);
  EXPECT_EQ(aclrtUnSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
}

TEST_F(CApiCallbacksTest, BlockingCallbackHoldsLaterWorkUntilItReturns) {
  auto [stream, record] = NewStream();
  ReportThread reports;
  ASSERT_EQ(aclrtSubscribeReport(reports.id(), stream), ACL_SUCCESS);
  Probe probe;
  probe.gated = true;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_BLOCK, stream),
      ACL_SUCCESS)
      << LastError();
  void* y = LaunchCopy(stream);
  ASSERT_TRUE(probe.entered.WaitForNotificationWithTimeout(absl::Minutes(1)));
  // The function has not returned: the launch after it cannot have run.
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream, 50),
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT);
  EXPECT_EQ(record->launches.load(), 0);
  aclrtStreamStatus status = ACL_STREAM_STATUS_COMPLETE;
  ASSERT_EQ(aclrtStreamQuery(stream, &status), ACL_SUCCESS);
  EXPECT_EQ(status, ACL_STREAM_STATUS_NOT_READY);
  probe.open.Notify();
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(probe.runs.load(), 1);
  EXPECT_EQ(probe.thread.load(), reports.id());
  EXPECT_EQ(record->launches.load(), 1);
  ExpectCopied(y);
  EXPECT_EQ(aclrtUnSubscribeReport(reports.id(), stream), ACL_SUCCESS);
}

TEST_F(CApiCallbacksTest, NonBlockingCallbackLetsLaterWorkRun) {
  auto [stream, record] = NewStream();
  ReportThread reports;
  ASSERT_EQ(aclrtSubscribeReport(reports.id(), stream), ACL_SUCCESS);
  Probe probe;
  probe.gated = true;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_NO_BLOCK, stream),
      ACL_SUCCESS)
      << LastError();
  void* y = LaunchCopy(stream);
  ASSERT_TRUE(probe.entered.WaitForNotificationWithTimeout(absl::Minutes(1)));
  // The function is still inside its gate, and the stream is done anyway.
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  EXPECT_EQ(record->launches.load(), 1);
  EXPECT_EQ(probe.runs.load(), 0);
  ExpectCopied(y);
  probe.open.Notify();
  EXPECT_EQ(aclrtUnSubscribeReport(reports.id(), stream), ACL_SUCCESS);
}

TEST_F(CApiCallbacksTest, HostFunctionsRunInStreamOrderOnTheLibrarysThread) {
  auto [stream, record] = NewStream();
  record->HoldLaunches();
  void* y = LaunchCopy(stream);
  WaitHeld(*record);
  struct Order {
    absl::Mutex mu;
    std::vector<int> seen;
    std::vector<uint64_t> threads;
  } order;
  struct Step {
    Order* order;
    int n;
    static void Run(void* self) {
      Step* step = static_cast<Step*>(self);
      absl::MutexLock lock(&step->order->mu);
      step->order->seen.push_back(step->n);
      step->order->threads.push_back(ThisThread());
    }
  } first{&order, 1}, second{&order, 2};
  ASSERT_EQ(aclrtLaunchHostFunc(stream, &Step::Run, &first), ACL_SUCCESS)
      << LastError();
  ASSERT_EQ(aclrtLaunchHostFunc(stream, &Step::Run, &second), ACL_SUCCESS);
  {
    absl::MutexLock lock(&order.mu);
    EXPECT_TRUE(order.seen.empty());  // Held behind the launch.
  }
  record->ReleaseLaunches();
  // Each holds the stream until it returned: done once the stream is.
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS) << LastError();
  absl::MutexLock lock(&order.mu);
  EXPECT_EQ(order.seen, (std::vector<int>{1, 2}));
  ASSERT_EQ(order.threads.size(), 2u);
  EXPECT_NE(order.threads[0], ThisThread());
  EXPECT_EQ(order.threads[0], order.threads[1]);
  ExpectCopied(y);
}

TEST_F(CApiCallbacksTest, ArgumentsAndSubscriptionsHaveCannsCodes) {
  auto [stream, record] = NewStream();
  Probe probe;
  // No subscribed thread.
  EXPECT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_NO_BLOCK, stream),
      ACL_ERROR_RT_STREAM_NO_CB_REG);
  EXPECT_THAT(LastError(), HasSubstr("has no subscribed thread"));
  EXPECT_EQ(aclrtProcessReport(10), ACL_ERROR_RT_THREAD_SUBSCRIBE);
  EXPECT_THAT(LastError(), HasSubstr("no stream is subscribed to thread"));
  EXPECT_EQ(aclrtUnSubscribeReport(ThisThread(), stream),
            ACL_ERROR_RT_STREAM_NO_CB_REG);
  // Bad arguments.
  EXPECT_EQ(aclrtLaunchCallback(nullptr, &probe, ACL_CALLBACK_BLOCK, stream),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(LastError(), "aclrtLaunchCallback: fn is NULL");
  EXPECT_EQ(aclrtLaunchCallback(&Probe::Run, &probe,
                                static_cast<aclrtCallbackBlockType>(7), stream),
            ACL_ERROR_INVALID_PARAM);
  EXPECT_THAT(LastError(), HasSubstr("unknown blockType 7"));
  EXPECT_EQ(aclrtLaunchHostFunc(stream, nullptr, nullptr),
            ACL_ERROR_INVALID_PARAM);
  for (int32_t timeout : {0, -2}) {
    EXPECT_EQ(aclrtProcessReport(timeout), ACL_ERROR_INVALID_PARAM) << timeout;
  }
  EXPECT_EQ(aclrtGetLastError(ACL_RT_THREAD_LEVEL), ACL_ERROR_INVALID_PARAM);
  aclrtStream bogus = reinterpret_cast<aclrtStream>(uintptr_t{0x1234});
  EXPECT_EQ(aclrtSubscribeReport(ThisThread(), bogus), ACL_ERROR_INVALID_PARAM);
  EXPECT_EQ(aclrtLaunchHostFunc(bogus, &Probe::Run, &probe),
            ACL_ERROR_INVALID_PARAM);
  // One thread per stream; only its own thread unsubscribes it.
  ASSERT_EQ(aclrtSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  EXPECT_EQ(aclrtSubscribeReport(ThisThread() + 1, stream),
            ACL_ERROR_RT_STREAM_SUBSCRIBE);
  EXPECT_THAT(LastError(), HasSubstr("already has a subscribed thread"));
  EXPECT_EQ(aclrtUnSubscribeReport(ThisThread() + 1, stream),
            ACL_ERROR_RT_THREAD_SUBSCRIBE);
  // Subscribed with nothing queued: the wait times out.
  EXPECT_EQ(aclrtProcessReport(10), ACL_ERROR_RT_REPORT_TIMEOUT);
  ASSERT_EQ(aclrtUnSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  // Unsubscribed: launching needs a thread again, and the thread has none.
  EXPECT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_NO_BLOCK, stream),
      ACL_ERROR_RT_STREAM_NO_CB_REG);
  EXPECT_EQ(aclrtProcessReport(10), ACL_ERROR_RT_THREAD_SUBSCRIBE);
  EXPECT_EQ(probe.runs.load(), 0);
}

// Callbacks handed to a thread before it was unsubscribed still run there.
TEST_F(CApiCallbacksTest, ReachedCallbacksOutliveTheSubscription) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  Probe probe;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_NO_BLOCK, stream),
      ACL_SUCCESS);
  ASSERT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
  ASSERT_EQ(aclrtUnSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  // The notice may still be on its way: wait for it (bounded).
  aclError ran = aclrtProcessReport(60000);
  EXPECT_EQ(ran, ACL_SUCCESS) << LastError();
  EXPECT_EQ(probe.runs.load(), 1);
}

// A destroyed stream's pending callbacks wake their thread with an error,
// and their functions never run.
TEST_F(CApiCallbacksTest, DestroyedStreamEndsPendingCallbacks) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  record->HoldLaunches();
  LaunchCopy(stream);
  WaitHeld(*record);
  Probe probe;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_BLOCK, stream),
      ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyStream(stream), ACL_SUCCESS) << LastError();
  const aclError woken = aclrtProcessReport(60000);
  EXPECT_NE(woken, ACL_SUCCESS);
  EXPECT_NE(woken, ACL_ERROR_RT_REPORT_TIMEOUT);
  EXPECT_THAT(LastError(), HasSubstr("was cancelled"));
  EXPECT_EQ(probe.runs.load(), 0);
}

// The same when the server ends the session's work and its channel (a
// closed session, a server shutting down): nothing hangs.
TEST_F(CApiCallbacksTest, EndedSessionEndsPendingCallbacks) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  record->HoldLaunches();
  LaunchCopy(stream);
  WaitHeld(*record);
  Probe probe;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_NO_BLOCK, stream),
      ACL_SUCCESS);
  server_->sessions().CancelAllWork();
  const aclError woken = aclrtProcessReport(60000);
  EXPECT_NE(woken, ACL_SUCCESS);
  EXPECT_NE(woken, ACL_ERROR_RT_REPORT_TIMEOUT);
  EXPECT_EQ(probe.runs.load(), 0);
}

// A client that never processes its reports: the server's time-out lets
// the stream go on, and its next synchronize says why.
class CApiCallbackTimeoutTest : public CApiCallbacksTest {
 protected:
  void Configure(Options& options) override {
    options.session_limits.callback_block_timeout = absl::Milliseconds(100);
  }
};

TEST_F(CApiCallbackTimeoutTest, UnprocessedBlockingCallbackTimesOut) {
  auto [stream, record] = NewStream();
  ASSERT_EQ(aclrtSubscribeReport(ThisThread(), stream), ACL_SUCCESS);
  Probe probe;
  ASSERT_EQ(
      aclrtLaunchCallback(&Probe::Run, &probe, ACL_CALLBACK_BLOCK, stream),
      ACL_SUCCESS);
  void* y = LaunchCopy(stream);
  // Nobody runs the callback; the stream is freed by the server alone.
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_ERROR_RT_REPORT_TIMEOUT);
  EXPECT_THAT(LastError(), HasSubstr("was not released within"));
  EXPECT_EQ(record->launches.load(), 1);  // The later work ran.
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);  // Reported once.
  ExpectCopied(y);
  // Its report is still there; running it late releases nothing.
  EXPECT_EQ(aclrtProcessReport(60000), ACL_SUCCESS) << LastError();
  EXPECT_EQ(probe.runs.load(), 1);
  EXPECT_EQ(aclrtSynchronizeStream(stream), ACL_SUCCESS);
}

}  // namespace
}  // namespace opserver
