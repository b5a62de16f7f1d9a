#include "common/event_flags.h"

#include "acl/acl_rt.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::HasSubstr;

TEST(EventFlagsTest, AreCannsNumbers) {
  EXPECT_EQ(kEventSync, ACL_EVENT_SYNC);
  EXPECT_EQ(kEventCaptureStreamProgress, ACL_EVENT_CAPTURE_STREAM_PROGRESS);
  EXPECT_EQ(kEventTimeLine, ACL_EVENT_TIME_LINE);
  EXPECT_EQ(kEventExternal, ACL_EVENT_EXTERNAL);
  EXPECT_EQ(kEventIpc, ACL_EVENT_IPC);
}

TEST(EventFlagsTest, KnownBitsPassAndUnknownOnesAreNamed) {
  EXPECT_TRUE(CheckEventFlags(0).ok());
  EXPECT_TRUE(CheckEventFlags(kKnownEventFlags).ok());
  const absl::Status unknown = CheckEventFlags(kEventSync | 0x4 | 0x100);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(),
              HasSubstr("event flags 0x105 have unknown bits 0x104"));
}

}  // namespace
}  // namespace opserver
