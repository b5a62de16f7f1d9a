#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test: once in
# the default configuration and once under ASan+UBSan (--config=asan; the
# tests tagged not_under_asan only in the first), then
# the fuzz smoke tests once more as libFuzzer binaries (--config=fuzz,
# clang-14, ASan+UBSan: a few seconds of fuzzing per target), and, for the
# whole tree, the arm64 sample under qemu-user (scripts/test-arm64.sh --ci:
# the cross-built kernels, C API and server on emulated NEON and SVE CPUs).
# Extra arguments go to the first two `bazel test` runs (e.g. a target
# pattern); the third runs those of them under //fuzz, if any.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
targets=("$@")
((${#targets[@]})) || targets=(//...)
fuzz_targets=()
arm64=0
for t in "${targets[@]}"; do
  case "$t" in
    //...) fuzz_targets+=(//fuzz/...) arm64=1 ;;
    //fuzz*) fuzz_targets+=("$t") ;;
  esac
done
# Every configuration runs even when one fails, so one run shows everything
# that is wrong; the exit status is non-zero if any failed.
status=0
bazel test "${targets[@]}" || status=1
# The sanitizer run builds what the tests run, not the benchmarks (the
# first run has already shown that they build), and leaves out the tests
# tagged not_under_asan: they check scripts, documents and configurations
# around binaries whose C++ the other tests run under the sanitizers. It
# keeps a cold CI run well inside its time.
bazel test --config=asan --build_tests_only \
  --test_tag_filters=-not_under_asan "${targets[@]}" || status=1
if ((${#fuzz_targets[@]})); then
  bazel test --config=fuzz "${fuzz_targets[@]}" || status=1
fi
if ((arm64)); then
  scripts/test-arm64.sh --ci || status=1
fi
exit "$status"
