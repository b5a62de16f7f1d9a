#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test: once in
# the default configuration and once under ASan+UBSan (--config=asan).
# Extra arguments go to both `bazel test` runs (e.g. a target pattern).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
targets=("$@")
((${#targets[@]})) || targets=(//...)
bazel test "${targets[@]}"
bazel test --config=asan "${targets[@]}"
