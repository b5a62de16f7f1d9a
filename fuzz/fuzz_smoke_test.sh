#!/usr/bin/env bash
# Smoke test of one fuzz target (fuzz/fuzzer.bzl):
#   fuzz_smoke_test.sh FUZZER CORPUS_DIR SECONDS
# Under --config=fuzz FUZZER is a libFuzzer binary: it runs every seed, then
# fuzzes for SECONDS with the memory limits of the long runs. Otherwise it is
# the standalone driver, which ignores the flags and replays each seed once.
# Either way a crash, a sanitizer report or a broken invariant fails the
# test; libFuzzer leaves the input that caused it in the test's undeclared
# outputs (bazel-testlogs/fuzz/<name>/test.outputs/).
set -euo pipefail
fuzzer=$1
corpus=$2
seconds=$3

seeds=$(ls "$corpus" | wc -l)
if ((seeds == 0)); then
  echo "no seeds in $corpus" >&2
  exit 1
fi
# libFuzzer adds what it finds to the first corpus directory: a scratch one,
# so the committed seeds are only read.
new="$TEST_TMPDIR/new_corpus"
mkdir -p "$new"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}/"
log="$TEST_TMPDIR/fuzz.log"
status=0
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$artifacts" \
  "$new" "$corpus" >"$log" 2>&1 || status=$?
tail -n 25 "$log"
if ((status != 0)); then
  echo "FAIL: $fuzzer exited with status $status" >&2
  exit 1
fi
if grep -q "^standalone: ran" "$log"; then
  # The standalone driver must have run every seed.
  grep -q "^standalone: ran $seeds inputs$" "$log" || {
    echo "FAIL: expected $seeds seeds to run" >&2
    exit 1
  }
else
  # libFuzzer must have started from the seeds and fuzzed.
  grep -q "INITED" "$log" || { echo "FAIL: libFuzzer never started" >&2; exit 1; }
  grep -q "^stat::number_of_executed_units: " "$log" || {
    echo "FAIL: no final stats" >&2
    exit 1
  }
fi
echo "PASS"
