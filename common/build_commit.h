// The commit a binary was built from, read from git by Bazel's workspace
// status (scripts/workspace_status.sh, run for every build by .bazelrc) and
// compiled into one small generated file, so that a new commit recompiles
// that file and relinks the binaries that show it (opserver, opctl) and
// nothing else. Libraries and tests do not depend on it.
#ifndef OPSERVER_COMMON_BUILD_COMMIT_H_
#define OPSERVER_COMMON_BUILD_COMMIT_H_

#include "absl/strings/string_view.h"

namespace opserver {

// The git commit (40 hex digits, "-dirty" appended when the tree had
// uncommitted changes), or "unknown" when the source was not a git checkout
// (a source tarball) or git was missing.
absl::string_view BuildCommit();

}  // namespace opserver

#endif  // OPSERVER_COMMON_BUILD_COMMIT_H_
