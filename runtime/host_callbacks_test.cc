#include "runtime/host_callbacks.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

// Records notices; Wait blocks until `n` came (bounded).
class Notices {
 public:
  HostCallbacks::Notify For(uint64_t id) {
    return [this, id](absl::Status status) {
      absl::MutexLock lock(&mu_);
      got_.push_back({id, std::move(status)});
    };
  }
  bool Wait(size_t n) {
    absl::MutexLock lock(&mu_);
    want_ = n;
    return mu_.AwaitWithTimeout(absl::Condition(this, &Notices::Enough),
                                absl::Minutes(1));
  }
  struct Got {
    uint64_t id;
    absl::Status status;
  };
  std::vector<Got> got() {
    absl::MutexLock lock(&mu_);
    return got_;
  }

 private:
  bool Enough() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return got_.size() >= want_;
  }
  absl::Mutex mu_;
  std::vector<Got> got_;
  size_t want_ = 0;
};

// A task that holds `stream` until `open` is notified.
void HoldUntil(Stream& stream, absl::Notification& open,
               absl::Notification* started = nullptr) {
  ASSERT_TRUE(stream
                  .Enqueue([&open, started] {
                    if (started != nullptr) started->Notify();
                    open.WaitForNotification();
                    return absl::OkStatus();
                  })
                  .ok());
}

class HostCallbacksTest : public ::testing::Test {
 protected:
  std::shared_ptr<std::atomic<uint64_t>> held_ =
      std::make_shared<std::atomic<uint64_t>>(0);
};

TEST_F(HostCallbacksTest, NoticeComesOnlyAfterTheWorkBeforeIt) {
  HostCallbacks callbacks(absl::Minutes(1), held_, 1 << 20);
  Stream stream;
  absl::Notification open;
  HoldUntil(stream, open);
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 7, false, notices.For(7)).ok());
  ASSERT_TRUE(callbacks.Queue(stream, 8, true, notices.For(8)).ok());
  EXPECT_TRUE(notices.got().empty());  // The stream is held before them.
  open.Notify();
  ASSERT_TRUE(notices.Wait(2));
  EXPECT_EQ(notices.got()[0].id, 7u);
  EXPECT_EQ(notices.got()[1].id, 8u);
  EXPECT_TRUE(notices.got()[1].status.ok());
  EXPECT_TRUE(callbacks.Release(8));
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
}

TEST_F(HostCallbacksTest, BlockingCallbackHoldsLaterWorkUntilReleased) {
  HostCallbacks callbacks(absl::Minutes(1), held_, 1 << 20);
  Stream stream;
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 1, true, notices.For(1)).ok());
  ASSERT_TRUE(notices.Wait(1));  // Reached at once (the stream was idle).
  EXPECT_EQ(held_->load(), kBlockedCallbackBytes);
  std::atomic<bool> ran{false};
  ASSERT_TRUE(stream
                  .Enqueue([&ran] {
                    ran = true;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_TRUE(stream.busy());
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(callbacks.blocked(), 1u);
  ASSERT_TRUE(callbacks.Release(1));
  EXPECT_FALSE(callbacks.Release(1));  // Once.
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(held_->load(), 0u);
}

TEST_F(HostCallbacksTest, NonBlockingCallbackDoesNotHoldTheStream) {
  HostCallbacks callbacks(absl::Minutes(1), held_, 1 << 20);
  Stream stream;
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 1, false, notices.For(1)).ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(stream
                  .Enqueue([&ran] {
                    ran = true;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(callbacks.blocked(), 0u);
}

TEST_F(HostCallbacksTest, UnreleasedCallbackTimesOutIntoTheStreamsError) {
  HostCallbacks callbacks(absl::Milliseconds(50), held_, 1 << 20);
  Stream stream;
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 3, true, notices.For(3)).ok());
  std::atomic<bool> ran{false};
  ASSERT_TRUE(stream
                  .Enqueue([&ran] {
                    ran = true;
                    return absl::OkStatus();
                  })
                  .ok());
  // Nobody releases it: the time-out lets the stream go on.
  absl::Status status = stream.SynchronizeAndWait();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(kernels::GetAclnnStatus(status), 507012);
  EXPECT_THAT(status.message(), HasSubstr("blocking callback 3 was not "
                                          "released"));
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(callbacks.blocked(), 0u);
  EXPECT_EQ(held_->load(), 0u);
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());  // Reported once.
}

TEST_F(HostCallbacksTest, CancelledStreamCancelsWaitingCallbacks) {
  HostCallbacks callbacks(absl::Minutes(1), held_, 1 << 20);
  Stream stream;
  absl::Notification open, started;
  HoldUntil(stream, open, &started);
  started.WaitForNotification();
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 1, false, notices.For(1)).ok());
  ASSERT_TRUE(callbacks.Queue(stream, 2, true, notices.For(2)).ok());
  stream.Cancel("closing");
  open.Notify();
  ASSERT_TRUE(notices.Wait(2));
  for (const Notices::Got& got : notices.got()) {
    EXPECT_EQ(got.status.code(), absl::StatusCode::kCancelled) << got.id;
  }
  EXPECT_EQ(callbacks.blocked(), 0u);
  EXPECT_EQ(held_->load(), 0u);
  EXPECT_TRUE(
      absl::IsCancelled(callbacks.Queue(stream, 3, false, notices.For(3))));
}

TEST_F(HostCallbacksTest, CancelOpensAReachedBlockingCallback) {
  HostCallbacks callbacks(absl::Minutes(1), held_, 1 << 20);
  Stream stream;
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 1, true, notices.For(1)).ok());
  ASSERT_TRUE(notices.Wait(1));
  stream.Cancel("closing");
  EXPECT_EQ(callbacks.blocked(), 0u);
  EXPECT_EQ(notices.got().size(), 1u);  // No second notice.
  // Does not hang; what it returns is the cancel's status.
  stream.SynchronizeAndWait().IgnoreError();
}

TEST_F(HostCallbacksTest, PendingIdsMustDifferAndStateIsCharged) {
  HostCallbacks callbacks(absl::Minutes(1), held_, 2 * kBlockedCallbackBytes);
  Stream stream;
  absl::Notification open;
  HoldUntil(stream, open);
  Notices notices;
  ASSERT_TRUE(callbacks.Queue(stream, 5, true, notices.For(5)).ok());
  absl::Status again = callbacks.Queue(stream, 5, true, notices.For(5));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  // The session's memory holds two and no more.
  ASSERT_TRUE(callbacks.Queue(stream, 6, true, notices.For(6)).ok());
  absl::Status over = callbacks.Queue(stream, 7, true, notices.For(7));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(held_->load(), 2 * kBlockedCallbackBytes);
  // Released before they were reached: skipped, never notified.
  EXPECT_TRUE(callbacks.Release(5));
  EXPECT_TRUE(callbacks.Release(6));
  open.Notify();
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_TRUE(notices.got().empty());
  EXPECT_EQ(held_->load(), 0u);
}

TEST_F(HostCallbacksTest, DestroyingTheTableOpensItsStreams) {
  Stream stream;
  Notices notices;
  {
    HostCallbacks callbacks(absl::Minutes(1), held_, 1 << 20);
    ASSERT_TRUE(callbacks.Queue(stream, 1, true, notices.For(1)).ok());
    ASSERT_TRUE(notices.Wait(1));
  }
  EXPECT_TRUE(stream.SynchronizeAndWait().ok());
  EXPECT_EQ(held_->load(), 0u);
}

}  // namespace
}  // namespace opserver
