#include "runtime/deadline_timer.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

TEST(DeadlineTimerTest, RunsInDeadlineOrder) {
  DeadlineTimer timer;
  absl::Mutex mu;
  std::vector<int> order;
  absl::Notification done;
  const absl::Time now = absl::Now();
  // Queued in reverse: the deadlines, not the calls, order them.
  timer.At(now + absl::Milliseconds(30), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(3);
    done.Notify();
  });
  timer.At(now + absl::Milliseconds(20), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(2);
  });
  timer.At(now - absl::Seconds(1), [&] {
    absl::MutexLock lock(&mu);
    order.push_back(1);
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Minutes(1)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(DeadlineTimerTest, CancelledFunctionNeverRuns) {
  DeadlineTimer timer;
  bool ran = false;
  const uint64_t key =
      timer.At(absl::Now() + absl::Hours(1), [&ran] { ran = true; });
  EXPECT_EQ(timer.pending(), 1u);
  EXPECT_TRUE(timer.Cancel(key));
  EXPECT_FALSE(timer.Cancel(key));
  EXPECT_EQ(timer.pending(), 0u);
  absl::Notification later;
  timer.At(absl::Now(), [&later] { later.Notify(); });
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(absl::Minutes(1)));
  EXPECT_FALSE(ran);
}

TEST(DeadlineTimerTest, DestructionDropsWhatHasNotRun) {
  bool ran = false;
  {
    DeadlineTimer timer;
    timer.At(absl::Now() + absl::Hours(1), [&ran] { ran = true; });
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace opserver
