#include "common/version.h"

// common/BUILD.bazel defines it from `--compilation_mode`; a build outside
// Bazel has no mode to report.
#ifndef OPSERVER_COMPILATION_MODE
#define OPSERVER_COMPILATION_MODE "unknown"
#endif

namespace opserver {

absl::string_view BuildMode() {
#if defined(__SANITIZE_ADDRESS__)
  return OPSERVER_COMPILATION_MODE "+asan";
#else
  return OPSERVER_COMPILATION_MODE;
#endif
}

}  // namespace opserver
