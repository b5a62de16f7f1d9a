#ifndef OPSERVER_SERVER_LOG_H_
#define OPSERVER_SERVER_LOG_H_

#include "absl/strings/string_view.h"

namespace opserver {

// Writes one line "<UTC timestamp> opserver: <message>" to stderr.
// The server logs exactly one line per start, stop and error; absl/log does
// not exist in the Abseil version Debian 12 ships, hence this helper.
void LogLine(absl::string_view message);

}  // namespace opserver

#endif  // OPSERVER_SERVER_LOG_H_
