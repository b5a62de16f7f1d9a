#ifndef OPSERVER_RUNTIME_LOG_H_
#define OPSERVER_RUNTIME_LOG_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace opserver {

// Writes one line "<UTC timestamp> opserver: <message>" to stderr.
// The server logs exactly one line per start, stop and error; absl/log does
// not exist in the Abseil version Debian 12 ships, hence this helper.
// Messages often quote what a client sent, so the line is made safe here:
// control and non-ASCII bytes are escaped (no forged lines) and the message
// is cut to kMaxLogMessageBytes (no log floods from 64 MiB strings).
void LogLine(absl::string_view message);

inline constexpr size_t kMaxLogMessageBytes = 1024;

// `text` cut to at most `max_bytes` bytes, with the number of bytes left out
// appended when it was cut. For messages that quote client strings.
std::string Truncated(absl::string_view text, size_t max_bytes);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_LOG_H_
