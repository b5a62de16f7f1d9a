#include "runtime/work_pool.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;

// One thread held by a first task while the others queue, so the order in
// which they then run is the pool's choice alone.
TEST(WorkPoolTest, OwnersTakeTurnsAndKeepTheirOrder) {
  auto pool = std::make_unique<WorkPool>(
      WorkPool::Options{.threads = 1, .max_queued_per_owner = 100});
  absl::Notification release;
  absl::Mutex mu;
  std::vector<std::string> ran;
  ASSERT_TRUE(pool->Submit("hog", [&] { release.WaitForNotification(); }).ok());
  auto record = [&](std::string what) {
    return [&mu, &ran, what] {
      absl::MutexLock lock(&mu);
      ran.push_back(what);
    };
  };
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(pool->Submit("hog", record("hog" + std::to_string(i))).ok());
  }
  ASSERT_TRUE(pool->Submit("victim", record("victim0")).ok());
  ASSERT_TRUE(pool->Submit("victim", record("victim1")).ok());
  release.Notify();
  pool.reset();  // Runs everything queued.
  // The hog's queue does not delay the victim by more than one turn.
  EXPECT_THAT(
      ran, ElementsAre("victim0", "hog0", "victim1", "hog1", "hog2", "hog3"));
}

TEST(WorkPoolTest, AnOwnersQueueIsBounded) {
  WorkPool pool({.threads = 1, .max_queued_per_owner = 2});
  absl::Notification started;
  absl::Notification release;
  ASSERT_TRUE(pool.Submit("a",
                          [&] {
                            started.Notify();
                            release.WaitForNotification();
                          })
                  .ok());
  started.WaitForNotification();  // Running: no longer waiting.
  EXPECT_TRUE(pool.Submit("a", [] {}).ok());
  EXPECT_TRUE(pool.Submit("a", [] {}).ok());
  absl::Status refused = pool.Submit("a", [] {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool.Submit("b", [] {}).ok()) << "another owner is not refused";
  release.Notify();
}

TEST(WorkPoolTest, AnOwnersTasksNeverOverlap) {
  WorkPool pool({.threads = 4, .max_queued_per_owner = 1000});
  absl::Mutex mu;
  int inside = 0;
  int most = 0;
  int done = 0;
  for (int i = 0; i < 200; ++i) {
    ASSERT_TRUE(pool.Submit("one",
                            [&] {
                              {
                                absl::MutexLock lock(&mu);
                                most = std::max(most, ++inside);
                              }
                              absl::MutexLock lock(&mu);
                              --inside;
                              ++done;
                            })
                    .ok());
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* d) { return *d == 200; }, &done));
  EXPECT_EQ(most, 1);
}

// The destructor runs what is queued, including work submitted by running
// tasks (a sliced batch submits its next slice).
TEST(WorkPoolTest, DestructionRunsQueuedAndChainedWork) {
  int slices = 0;
  std::function<void()> slice;  // Outlives the pool that runs it.
  {
    WorkPool pool({.threads = 2});
    slice = [&] {
      if (++slices < 50) {
        ASSERT_TRUE(pool.Submit("chain", slice).ok());
      }
    };
    ASSERT_TRUE(pool.Submit("chain", slice).ok());
  }
  EXPECT_EQ(slices, 50);
}

}  // namespace
}  // namespace opserver
