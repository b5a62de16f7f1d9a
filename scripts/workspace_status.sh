#!/usr/bin/env bash
# Bazel's --workspace_status_command (see .bazelrc): the commit the build
# is made from, for `--version` (common/build_commit.h). Prints nothing
# outside a git checkout (a source tarball), and the binaries then say
# "unknown". Only //common:build_commit_cc reads it (a stamped genrule), so
# a new commit reruns that rule and relinks opserver and opctl, nothing else.
commit=$(git rev-parse HEAD 2>/dev/null) || exit 0
if ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
echo "STABLE_OPSERVER_COMMIT $commit"
