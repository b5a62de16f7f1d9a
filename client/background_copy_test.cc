#include "client/background_copy.h"

#include <atomic>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "common/thread_start.h"
#include "gtest/gtest.h"

namespace opserver::remote {
namespace {

TEST(BackgroundCopyTest, WaitGivesWhatTheCopyReturned) {
  absl::Notification release;
  auto copy = BackgroundCopy::Start(
      [&] {
        release.WaitForNotification();
        return absl::DataLossError("torn");
      },
      [] {});
  ASSERT_TRUE(copy.ok()) << copy.status();
  release.Notify();
  EXPECT_EQ((*copy)->Wait(), absl::DataLossError("torn"));
  // Again: the same answer, no second run.
  EXPECT_EQ((*copy)->Wait(), absl::DataLossError("torn"));
}

TEST(BackgroundCopyTest, DroppedWhileRunningCancelsAndWaitsForTheCopy) {
  absl::Notification started, cancelled;
  std::atomic<bool> returned{false};
  {
    auto copy = BackgroundCopy::Start(
        [&] {
          started.Notify();
          // Only the cancel lets it end.
          cancelled.WaitForNotification();
          returned = true;
          return absl::CancelledError("cancelled");
        },
        [&] {
          if (!cancelled.HasBeenNotified()) cancelled.Notify();
        });
    ASSERT_TRUE(copy.ok()) << copy.status();
    started.WaitForNotification();
  }
  // The destructor cancelled it and returned only once it had ended.
  EXPECT_TRUE(returned);
}

TEST(BackgroundCopyTest, NoCancelOnceTheCopyEnded) {
  int cancels = 0;
  {
    auto copy = BackgroundCopy::Start([] { return absl::OkStatus(); },
                                      [&] { ++cancels; });
    ASSERT_TRUE(copy.ok()) << copy.status();
    EXPECT_TRUE((*copy)->Wait().ok());
  }
  EXPECT_EQ(cancels, 0);
}

// Nor is it cancelled: the caller may then run the copy itself.
TEST(BackgroundCopyTest, NoThreadIsAnErrorAndTheCopyNeverRunsNorIsCancelled) {
  bool ran = false;
  int cancels = 0;
  FailThreadStartsForTesting(true);
  auto copy = BackgroundCopy::Start(
      [&] {
        ran = true;
        return absl::OkStatus();
      },
      [&] { ++cancels; });
  FailThreadStartsForTesting(false);
  EXPECT_EQ(copy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(ran);
  EXPECT_EQ(cancels, 0);
}

}  // namespace
}  // namespace opserver::remote
