// What a build of opserver is: the release (written once, here), the
// compilation mode it was built in and the commit it was built from. The
// server reports the release in GetDeviceInfo; every binary's --version
// prints all three (common/cli_flags.h).
#ifndef OPSERVER_COMMON_VERSION_H_
#define OPSERVER_COMMON_VERSION_H_

#include <string>

#include "absl/strings/string_view.h"

namespace opserver {

// The release of this source tree.
inline constexpr char kRelease[] = "0.1.0";

// Bazel's compilation mode this file was compiled in: "opt", "fastbuild" or
// "dbg" (decided by the build, not guessed from NDEBUG), with "+asan" when
// built with AddressSanitizer.
absl::string_view BuildMode();

}  // namespace opserver

#endif  // OPSERVER_COMMON_VERSION_H_
