#include "server/log_limiter.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::ElementsAre;

// A LogLimiter of 3 lines per 10 s on a clock the test moves, writing into
// `lines`.
struct Fixture {
  absl::Time now = absl::UnixEpoch();
  std::vector<std::string> lines;
  LogLimiter limiter{
      3, absl::Seconds(10), [this] { return now; },
      [this](absl::string_view line) { lines.emplace_back(line); }};
};

TEST(LogLimiterTest, WritesTheFirstLinesOfACauseThenSummarizesTheRest) {
  Fixture f;
  for (int i = 0; i < 10; ++i)
    f.limiter.Log("Malloc INVALID_ARGUMENT", absl::StrCat("line ", i));
  EXPECT_THAT(f.lines, ElementsAre("line 0", "line 1", "line 2"));
  // The summary waits for the interval to end; the next line of any cause
  // after it brings it out, before that line.
  f.now += absl::Seconds(10);
  f.limiter.Log("Malloc INVALID_ARGUMENT", "line 10");
  EXPECT_THAT(f.lines, ElementsAre("line 0", "line 1", "line 2",
                                   "suppressed 7 similar lines (Malloc "
                                   "INVALID_ARGUMENT) in the last 10s",
                                   "line 10"));
}

TEST(LogLimiterTest, CausesAreCountedApart) {
  Fixture f;
  for (int i = 0; i < 5; ++i) {
    f.limiter.Log("a", absl::StrCat("a", i));
    f.limiter.Log("b", absl::StrCat("b", i));
  }
  EXPECT_THAT(f.lines, ElementsAre("a0", "b0", "a1", "b1", "a2", "b2"));
  f.now += absl::Seconds(3);
  f.limiter.Flush();
  EXPECT_THAT(f.lines,
              ElementsAre("a0", "b0", "a1", "b1", "a2", "b2",
                          "suppressed 2 similar lines (a) in the last 3s",
                          "suppressed 2 similar lines (b) in the last 3s"));
}

TEST(LogLimiterTest, ACauseUnderTheLimitGetsNoSummary) {
  Fixture f;
  f.limiter.Log("a", "a0");
  f.now += absl::Seconds(11);
  f.limiter.Log("a", "a1");
  f.limiter.Flush();
  EXPECT_THAT(f.lines, ElementsAre("a0", "a1"));
}

TEST(LogLimiterTest, QuietCausesAreSummarizedWhenAnotherCauseLogs) {
  Fixture f;
  for (int i = 0; i < 4; ++i) f.limiter.Log("a", "a");
  f.now += absl::Seconds(12);
  f.limiter.Log("b", "b");
  EXPECT_THAT(
      f.lines,
      ElementsAre("a", "a", "a",
                  "suppressed 1 similar line (a) in the last 12s", "b"));
}

TEST(LogLimiterTest, AFloodOfDistinctCausesIsBounded) {
  Fixture f;
  // 100,000 causes: only kMaxCauses are tracked, the others share one.
  for (int i = 0; i < 100000; ++i) {
    f.limiter.Log(absl::StrCat("cause ", i), "x");
  }
  EXPECT_EQ(f.lines.size(), LogLimiter::kMaxCauses + 3);
  f.limiter.Flush();
  ASSERT_EQ(f.lines.size(), LogLimiter::kMaxCauses + 4);
  EXPECT_EQ(f.lines.back(),
            absl::StrCat("suppressed ", 100000 - LogLimiter::kMaxCauses - 3,
                         " similar lines (other causes) in the last 0s"));
}

}  // namespace
}  // namespace opserver
