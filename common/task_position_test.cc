#include "common/task_position.h"

#include "gtest/gtest.h"

namespace opserver {
namespace {

TEST(TaskPositionTest, TheFirstPositionStandsAndOkCarriesNone) {
  EXPECT_EQ(TaskPositionOf(absl::InternalError("x")), 0u);
  absl::Status failed = WithTaskPosition(absl::InternalError("x"), 7);
  EXPECT_EQ(TaskPositionOf(failed), 7u);
  EXPECT_EQ(TaskPositionOf(WithTaskPosition(failed, 9)), 7u);
  EXPECT_EQ(TaskPositionOf(WithTaskPosition(absl::InternalError("y"), 0)), 0u);
  EXPECT_TRUE(WithTaskPosition(absl::OkStatus(), 3).ok());
  EXPECT_EQ(failed.message(), "x");
}

TEST(TaskPositionTest, TheDeferredStreamIsPresentOrNot) {
  uint64_t stream = 99;
  EXPECT_FALSE(DeferredStreamOf(absl::InternalError("x"), &stream));
  EXPECT_TRUE(DeferredStreamOf(WithDeferredStream(absl::InternalError("x"), 0),
                               &stream));
  EXPECT_EQ(stream, 0u);
  EXPECT_FALSE(
      DeferredStreamOf(WithDeferredStream(absl::OkStatus(), 4), &stream));
  absl::Status garbage = absl::InternalError("x");
  garbage.SetPayload("opserver-task-position", absl::Cord("twelve"));
  EXPECT_EQ(TaskPositionOf(garbage), 0u);
}

}  // namespace
}  // namespace opserver
