#!/usr/bin/env bash
# Builds one fuzz target with libFuzzer under ASan+UBSan (--config=fuzz,
# clang-14) and fuzzes it, starting from its committed seed corpus:
#
#   scripts/fuzz.sh values_fuzzer                  # until stopped (^C)
#   scripts/fuzz.sh values_fuzzer -runs=1000000    # any libFuzzer flags
#   scripts/fuzz.sh values_fuzzer crash-1234...    # reproduce one input
#
# Targets: workspace_fuzzer, evaluate_fuzzer, values_fuzzer, upload_fuzzer,
# tensor_view_fuzzer, pipeline_fuzzer, data_listener_fuzzer, op_catalog_fuzzer,
# server_replies_fuzzer (fuzz/BUILD.bazel).
# What libFuzzer finds goes to
# $FUZZ_OUT/<target>/ (default /tmp/opserver-fuzz): new corpus entries to
# corpus/, a crashing input to crash-<sha1>; never into fuzz/corpus/. Memory
# is capped as in the smoke tests (2 GiB RSS, 256 MiB per allocation): an
# allocation sized by the input past that is a finding.
set -euo pipefail
cd "$(dirname "$0")/.."
if (($# < 1)); then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
name=$1
shift
out="${FUZZ_OUT:-/tmp/opserver-fuzz}/$name"
mkdir -p "$out/corpus"
bazel build --config=fuzz "//fuzz:$name"
flags=(-rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=10
       -print_final_stats=1 "-artifact_prefix=$out/")
# Given an input file, run just that (libFuzzer reproduces it).
for arg in "$@"; do
  if [[ "$arg" != -* ]]; then
    exec "bazel-out/k8-fastbuild-fuzz/bin/fuzz/$name" "${flags[@]}" "$@"
  fi
done
exec "bazel-out/k8-fastbuild-fuzz/bin/fuzz/$name" "${flags[@]}" "$@" \
  "$out/corpus" "fuzz/corpus/$name"
