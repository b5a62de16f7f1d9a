#include "runtime/log.h"

#include <cstdio>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace opserver {

std::string Truncated(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return absl::StrCat(text.substr(0, max_bytes), "... (",
                      text.size() - max_bytes, " more bytes)");
}

void LogLine(absl::string_view message) {
  // One fwrite per line so concurrent lines do not interleave.
  std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                       absl::UTCTimeZone()),
      " opserver: ",
      absl::CHexEscape(Truncated(message, kMaxLogMessageBytes)), "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace opserver
