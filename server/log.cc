#include "server/log.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace opserver {

void LogLine(absl::string_view message) {
  // One fwrite per line so concurrent lines do not interleave.
  std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                    absl::UTCTimeZone()),
                   " opserver: ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace opserver
