#!/usr/bin/env bash
# Builds what a user runs, optimized, and installs it under PREFIX
# (default: out/ in this checkout), in the layout scripts/lay_out_prefix.sh
# describes:
#
#   scripts/install.sh [PREFIX]         e.g. sudo scripts/install.sh /usr/local
#
# Every user-facing document runs the installed files, never bazel-bin:
# bazel-bin follows the last build's configuration (a test run, --config=asan
# or a benchmark repoint it), the installed files stay put until the next
# install. The build is always -c opt, the one configuration for everything
# a user runs, so installing after a benchmark build reuses its outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-out}
scripts/install-deps.sh
targets=(//server:opserver //client:opctl //client:libaclnn_remote.so
         //python:opserver/_opserver.so)
bazel build -c opt "${targets[@]}"
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
scripts/lay_out_prefix.sh . "$bin" "$prefix"
echo "install: opserver installed under $prefix" >&2
