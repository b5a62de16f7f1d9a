#include "common/thread_start.h"

#include <atomic>
#include <system_error>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

TEST(ThreadStartTest, StartsAThread) {
  std::atomic<bool> ran{false};
  absl::StatusOr<std::thread> thread =
      StartThread("a test thread", [&] { ran = true; });
  ASSERT_TRUE(thread.ok()) << thread.status();
  thread->join();
  EXPECT_TRUE(ran);
}

TEST(ThreadStartTest, NoThreadIsAnErrorNotAnException) {
  FailThreadStartsForTesting(true);
  bool ran = false;
  absl::StatusOr<std::thread> thread =
      StartThread("the test's thread", [&] { ran = true; });
  EXPECT_THROW(NewThread([&] { ran = true; }), std::system_error);
  FailThreadStartsForTesting(false);
  ASSERT_EQ(thread.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(thread.status().message(),
            "cannot start the test's thread: Resource temporarily "
            "unavailable");
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace opserver
