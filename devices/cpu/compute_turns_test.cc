#include "devices/cpu/compute_turns.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace opserver::cpu {
namespace {

// Polls (bounded) until `turns` has `n` slices waiting.
void AwaitWaiting(const ComputeTurns& turns, int n) {
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (turns.waiting() != n && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(turns.waiting(), n);
}

TEST(ComputeTurnsTest, FreeSlotsAreTakenAtOnce) {
  ComputeTurns turns(2);
  {
    ComputeTurns::Turn a(&turns, 0);
    ComputeTurns::Turn b(&turns, 0);
    EXPECT_EQ(turns.waiting(), 0);
  }
  EXPECT_EQ(turns.taken(), 2u);
}

TEST(ComputeTurnsTest, AFreedSlotGoesToTheNextDeviceNotTheBusiestOne) {
  ComputeTurns turns(1);
  absl::Mutex mu;
  std::vector<int> order;
  auto held = std::make_unique<ComputeTurns::Turn>(&turns, 0);
  std::vector<std::thread> threads;
  auto slice = [&](int party, int tag) {
    threads.emplace_back([&, party, tag] {
      ComputeTurns::Turn turn(&turns, party);
      absl::MutexLock lock(&mu);
      order.push_back(tag);
    });
  };
  // Device 0 queues three slices before device 1 queues one, and device 2
  // one after that.
  slice(0, 1);
  AwaitWaiting(turns, 1);
  slice(0, 2);
  AwaitWaiting(turns, 2);
  slice(0, 3);
  AwaitWaiting(turns, 3);
  slice(1, 10);
  AwaitWaiting(turns, 4);
  slice(2, 20);
  AwaitWaiting(turns, 5);
  held.reset();  // Device 0 was served last.
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{10, 20, 1, 2, 3}));
  EXPECT_EQ(turns.taken(), 6u);
  EXPECT_EQ(turns.waiting(), 0);
}

}  // namespace
}  // namespace opserver::cpu
