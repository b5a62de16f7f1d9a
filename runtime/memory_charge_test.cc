#include "runtime/memory_charge.h"

#include <atomic>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

TEST(MemoryChargeTest, ReservesUpToTheLimitAndRefundsOnRelease) {
  auto held = std::make_shared<std::atomic<uint64_t>>(0);
  ASSERT_TRUE(ReserveSessionBytes(*held, 100, 60, "a").ok());
  absl::Status refused = ReserveSessionBytes(*held, 100, 41, "a call's state");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("no room for a call's state (41 bytes): the session "
                        "holds 60 of its 100 bytes (--session_memory_bytes"));
  EXPECT_EQ(held->load(), 60u) << "a refusal takes nothing";
  ASSERT_TRUE(ReserveSessionBytes(*held, 100, 40, "a").ok());
  {
    MemoryCharge charge(held, 40);
    MemoryCharge moved = std::move(charge);  // Refunded once, by `moved`.
  }
  EXPECT_EQ(held->load(), 60u);
  // Already past the limit (a buffer charged before the limit was lowered):
  // nothing more fits, without wrapping around.
  held->store(150);
  EXPECT_FALSE(ReserveSessionBytes(*held, 100, 1, "a").ok());
}

}  // namespace
}  // namespace opserver
