// The transfer watchdog on a clock the test moves: a call is cancelled
// once it has moved nothing for longer than the idle time, not before, and
// each message moved starts the count again. (The calls it ends for real,
// a part a server never sends or never reads, are in
// tests/client_fake_server_test.cc.)

#include "client/transfer_watchdog.h"

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/aclnn_status.h"

namespace opserver {
namespace remote {
namespace {

class FakeClock {
 public:
  absl::Time now() const { return now_; }
  void Advance(absl::Duration d) { now_ += d; }
  TransferWatchdog::Clock clock() {
    return [this] { return now_; };
  }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST(TransferWatchdogTest, ACallIdleLongerThanTheLimitIsCancelled) {
  FakeClock clock;
  TransferWatchdog watchdog(absl::Seconds(60), clock.clock(),
                            /*run_thread=*/false);
  grpc::ClientContext context;
  TransferWatchdog::Watch watch(&watchdog, &context);
  clock.Advance(absl::Seconds(60));
  watchdog.Check();
  EXPECT_FALSE(watch.expired()) << "exactly the limit is not past it";
  clock.Advance(absl::Nanoseconds(1));
  watchdog.Check();
  EXPECT_TRUE(watch.expired());
}

TEST(TransferWatchdogTest, EachMessageMovedStartsTheCountAgain) {
  FakeClock clock;
  TransferWatchdog watchdog(absl::Seconds(60), clock.clock(),
                            /*run_thread=*/false);
  grpc::ClientContext context;
  TransferWatchdog::Watch watch(&watchdog, &context);
  for (int i = 0; i < 5; ++i) {
    clock.Advance(absl::Seconds(50));
    watch.Progress();
    watchdog.Check();
  }
  EXPECT_FALSE(watch.expired());
  clock.Advance(absl::Seconds(61));
  watchdog.Check();
  EXPECT_TRUE(watch.expired());
}

TEST(TransferWatchdogTest, OnlyTheIdleCallIsCancelled) {
  FakeClock clock;
  TransferWatchdog watchdog(absl::Seconds(10), clock.clock(),
                            /*run_thread=*/false);
  grpc::ClientContext stuck_context;
  grpc::ClientContext moving_context;
  TransferWatchdog::Watch stuck(&watchdog, &stuck_context);
  TransferWatchdog::Watch moving(&watchdog, &moving_context);
  clock.Advance(absl::Seconds(11));
  moving.Progress();
  watchdog.Check();
  EXPECT_TRUE(stuck.expired());
  EXPECT_FALSE(moving.expired());
}

TEST(TransferWatchdogTest, AnInfiniteLimitNeverCancels) {
  FakeClock clock;
  TransferWatchdog watchdog(absl::InfiniteDuration(), clock.clock(),
                            /*run_thread=*/false);
  grpc::ClientContext context;
  TransferWatchdog::Watch watch(&watchdog, &context);
  clock.Advance(absl::Hours(24 * 365));
  watchdog.Check();
  EXPECT_FALSE(watch.expired());
}

TEST(TransferWatchdogTest, ItsThreadCancelsAnIdleCall) {
  TransferWatchdog watchdog(absl::Milliseconds(20));
  grpc::ClientContext context;
  TransferWatchdog::Watch watch(&watchdog, &context);
  // Nothing ever moves: the thread's tick must cancel it (bounded wait).
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!watch.expired() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(watch.expired());
}

TEST(TransferWatchdogTest, TheErrorNamesTheCallTheLimitAndTheOption) {
  TransferWatchdog watchdog(absl::Seconds(90), &absl::Now,
                            /*run_thread=*/false);
  const absl::Status error = watchdog.IdleError("Download");
  EXPECT_EQ(error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(kernels::GetAclnnStatus(error), kernels::kAclnnErrRuntimeError);
  EXPECT_EQ(error.message(),
            "Download: no data moved for 1m30s "
            "(ConnectOptions::transfer_idle_timeout), so the call was "
            "cancelled: the server, or a proxy between, stopped forwarding "
            "it");
}

}  // namespace
}  // namespace remote
}  // namespace opserver
