#include "server/rejection_log.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace opserver {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kExecute[] = "/opserver.v1.Operators/Execute";
constexpr char kMalloc[] = "/opserver.v1.Runtime/Malloc";

// A RejectionLog on a clock the test moves, writing into `lines`.
struct Fixture {
  absl::Time now = absl::UnixEpoch();
  std::vector<std::string> lines;
  RejectionLog log{
      {kExecute, kMalloc},
      absl::Seconds(10),
      [this] { return now; },
      [this](absl::string_view line) { lines.emplace_back(line); }};
  size_t bytes() const {
    size_t n = 0;
    for (const std::string& line : lines) n += line.size();
    return n;
  }
};

TEST(RejectionLogTest, AFloodOfRefusalsLogsBoundedBytesAndNoCallerText) {
  Fixture f;
  const std::string attacker =
      "/evil.Service/" + std::string(900, 'A') + "\nforged line";
  // 10,000 refusals over 20 seconds, from paths of the caller's choosing.
  for (int i = 0; i < 10000; ++i) {
    f.log.Record(i % 3 == 0   ? kExecute
                 : i % 3 == 1 ? attacker
                              : absl::StrCat("/x/", i),
                 "unknown bearer token");
    f.now += absl::Milliseconds(2);
  }
  f.log.Flush();
  // The first line, then a summary per 10 s: a handful of lines.
  EXPECT_LE(f.lines.size(), 4u);
  EXPECT_LE(f.bytes(), 1200u);
  for (const std::string& line : f.lines) {
    EXPECT_THAT(line, AllOf(Not(HasSubstr("evil")), Not(HasSubstr("/x/")),
                            Not(HasSubstr("AAAA"))));
  }
}

TEST(RejectionLogTest, SummariesCountEveryRefusalByKnownMethod) {
  Fixture f;
  f.log.Record(kMalloc, "missing 'authorization: Bearer TOKEN' metadata");
  ASSERT_EQ(f.lines.size(), 1u);
  EXPECT_THAT(f.lines[0], AllOf(HasSubstr(kMalloc), HasSubstr("missing")));
  for (int i = 0; i < 5; ++i) f.log.Record(kExecute, "unknown bearer token");
  for (int i = 0; i < 2; ++i) f.log.Record("/no.Such/Method", "unknown");
  f.log.Record(kMalloc, "unknown bearer token");
  EXPECT_EQ(f.lines.size(), 1u);  // Counted, not logged yet.
  // The first refusal past the interval logs the summary and is counted
  // in the next one.
  f.now += absl::Seconds(10);
  f.log.Record(kMalloc, "unknown bearer token");
  ASSERT_EQ(f.lines.size(), 2u);
  EXPECT_THAT(f.lines[1],
              AllOf(HasSubstr("rejected 8 unauthenticated calls in the last "
                              "10s"),
                    HasSubstr("5 to /opserver.v1.Operators/Execute"),
                    HasSubstr("1 to /opserver.v1.Runtime/Malloc"),
                    HasSubstr("2 to unknown methods")));
  f.now += absl::Seconds(30);
  f.log.Flush();
  ASSERT_EQ(f.lines.size(), 3u);
  EXPECT_THAT(f.lines[2],
              AllOf(HasSubstr("rejected 1 unauthenticated calls in the last "
                              "30s: 1 to /opserver.v1.Runtime/Malloc")));
  // A quiet interval later, the next refusal is logged on its own again.
  f.now += absl::Seconds(30);
  f.log.Record(kExecute, "unknown bearer token");
  ASSERT_EQ(f.lines.size(), 4u);
  EXPECT_THAT(f.lines[3],
              HasSubstr("rejected call to " + std::string(kExecute)));
  f.log.Flush();
  EXPECT_EQ(f.lines.size(), 4u);  // Nothing left to report.
}

TEST(RejectionLogTest, ASummaryNamesABoundedNumberOfMethods) {
  std::vector<std::string> known;
  for (int i = 0; i < 12; ++i) known.push_back(absl::StrCat("/s.S/M", i));
  absl::Time now = absl::UnixEpoch();
  std::vector<std::string> lines;
  RejectionLog log(
      known, absl::Seconds(10), [&] { return now; },
      [&](absl::string_view line) { lines.emplace_back(line); });
  log.Record(known[0], "unknown bearer token");
  // M0 most often, then M1, ...: the summary names the 8 most refused.
  for (int i = 0; i < 12; ++i) {
    for (int n = 0; n < 20 - i; ++n) log.Record(known[i], "x");
  }
  log.Flush();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[1], AllOf(HasSubstr("20 to /s.S/M0, 19 to /s.S/M1"),
                              HasSubstr("13 to /s.S/M7, 42 to other methods"),
                              Not(HasSubstr("/s.S/M8"))));
}

}  // namespace
}  // namespace opserver
