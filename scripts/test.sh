#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test: once in
# the default configuration and once under ASan+UBSan (--config=asan).
# Extra arguments go to both `bazel test` runs (e.g. a target pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
targets=("$@")
((${#targets[@]})) || targets=(//...)
# Both configurations run even when the first fails, so one run shows
# everything that is wrong; the exit status is non-zero if either failed.
status=0
bazel test "${targets[@]}" || status=1
bazel test --config=asan "${targets[@]}" || status=1
exit "$status"
