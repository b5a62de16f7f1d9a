#include "server/stream.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

TEST(StreamTest, RunsInIssueOrder) {
  Stream stream;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    stream.Enqueue([&order, i] {
      order.push_back(i);
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(StreamTest, FirstErrorIsReportedOnceByTheNextSynchronize) {
  Stream stream;
  std::atomic<int> ran{0};
  stream.Enqueue([&] {
    ++ran;
    return absl::InvalidArgumentError("first");
  });
  stream.Enqueue([&] {
    ++ran;
    return absl::InternalError("second");
  });
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "first");
  EXPECT_EQ(ran.load(), 2);  // Work after a failure still runs.
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

TEST(StreamTest, WhenReachedDoesNotConsumeTheError) {
  Stream stream;
  stream.Enqueue([] { return absl::InternalError("boom"); });
  absl::Notification reached;
  stream.WhenReached([&] { reached.Notify(); });
  reached.WaitForNotification();
  EXPECT_EQ(stream.SynchronizeAndWait().message(), "boom");
}

TEST(StreamTest, DifferentStreamsRunConcurrently) {
  // Each stream's task waits for the other's: only concurrent streams finish.
  Stream a, b;
  absl::Notification a_started, b_started;
  a.Enqueue([&] {
    a_started.Notify();
    return b_started.WaitForNotificationWithTimeout(absl::Seconds(10))
               ? absl::OkStatus()
               : absl::DeadlineExceededError("b never ran");
  });
  b.Enqueue([&] {
    b_started.Notify();
    return a_started.WaitForNotificationWithTimeout(absl::Seconds(10))
               ? absl::OkStatus()
               : absl::DeadlineExceededError("a never ran");
  });
  EXPECT_TRUE(a.SynchronizeAndWait().ok());
  EXPECT_TRUE(b.SynchronizeAndWait().ok());
}

TEST(StreamTest, IdleStreamRunsInlineWorkOnTheCaller) {
  Stream stream;
  std::thread::id ran_on;
  stream.Enqueue(
      [&] {
        ran_on = std::this_thread::get_id();
        return absl::InternalError("inline failure");
      },
      /*inline_if_idle=*/true);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  // The inline failure is reported like any other.
  EXPECT_EQ(stream.SynchronizeAndWait().message(), "inline failure");
}

TEST(StreamTest, BusyStreamQueuesInlineWorkBehindEarlierWork) {
  Stream stream;
  absl::Notification release;
  std::vector<int> order;
  stream.Enqueue([&] {
    release.WaitForNotification();
    order.push_back(1);
    return absl::OkStatus();
  });
  std::thread::id ran_on;
  stream.Enqueue(
      [&] {
        ran_on = std::this_thread::get_id();
        order.push_back(2);
        return absl::OkStatus();
      },
      /*inline_if_idle=*/true);
  release.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(StreamTest, DestructorRunsQueuedWork) {
  std::atomic<int> ran{0};
  {
    Stream stream;
    for (int i = 0; i < 10; ++i) {
      stream.Enqueue([&] {
        absl::SleepFor(absl::Milliseconds(1));
        ++ran;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace opserver
