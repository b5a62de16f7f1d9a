#!/usr/bin/env bash
# opserver --device=ascend as a person starts it: CANN's libraries that are
# missing, or lack a symbol the device needs, stop it with one error line
# naming them and exit status 2; a CANN it can load (the fake one the unit
# tests use) is served, and it exits cleanly on SIGTERM; --preflight checks
# it without serving.
set -uo pipefail
opserver="$1"
opctl="$2"
fake="$(pwd)/$3"
fake_no_sync="$(pwd)/$4"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

source tests/server_lib.sh

# Exit status 2 and exactly one line on stderr that contains $1.
expect_start_error() {
  local want=$1
  shift
  "$opserver" --listen=127.0.0.1:0 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq 2 ]] || fail "$*: exit status $rc, want 2"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "$*: want one line, got: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$*: message lacks '$want': $(cat "$tmp/err")"
}

# CANN's default libraries, with nothing set up to find them.
(
  unset ASCEND_HOME_PATH
  export LD_LIBRARY_PATH=
  expect_start_error "cannot load CANN library libascendcl.so" --device=ascend
  exit "$failures"
) || failures=$((failures + $?))
expect_start_error "cannot load CANN library /nonexistent/libopapi.so" \
  --device=ascend --cann_libraries="$fake,/nonexistent/libopapi.so"
expect_start_error "CANN symbol aclrtSynchronizeStream is in none of" \
  --device=ascend --cann_libraries="$fake_no_sync"
expect_start_error "ascend:x" --device=ascend:x --cann_libraries="$fake"
expect_start_error "NPU 1 twice" --device=ascend:1,1 --cann_libraries="$fake"
expect_start_error "--device: devices applies to cpu" --device=ascend \
  --devices=2 --cann_libraries="$fake"
# The fake has NPUs 0 to 3.
expect_start_error "aclrtSetDevice" --device=ascend:7 --cann_libraries="$fake"

if start_opserver "$tmp/out" "$tmp/err" "$opserver" --device=ascend:2 \
  --cann_libraries="$fake"; then
  "$opctl" --server="127.0.0.1:$port" info >"$tmp/info" 2>&1 || fail "opctl info: $(cat "$tmp/info")"
  grep -q "^device 0: ascend (FakeAscend910B (NPU 2))" "$tmp/info" || fail "opctl info: $(cat "$tmp/info")"
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [[ $rc -eq 0 ]] || fail "exit status $rc after SIGTERM: $(cat "$tmp/err")"
else
  failures=$((failures + 1))
fi

# Several NPUs: one device each, in the order named.
if start_opserver "$tmp/out" "$tmp/err" "$opserver" --device=ascend:3,1 \
  --cann_libraries="$fake"; then
  "$opctl" --server="127.0.0.1:$port" info >"$tmp/info" 2>&1 || fail "opctl info: $(cat "$tmp/info")"
  grep -q "^device 0: ascend (FakeAscend910B (NPU 3))" "$tmp/info" || fail "opctl info lacks NPU 3: $(cat "$tmp/info")"
  grep -q "^device 1: ascend (FakeAscend910B (NPU 1))" "$tmp/info" || fail "opctl info lacks NPU 1: $(cat "$tmp/info")"
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [[ $rc -eq 0 ]] || fail "ascend:3,1: exit status $rc after SIGTERM: $(cat "$tmp/err")"
else
  failures=$((failures + 1))
fi

# --preflight: the devices and every operator once on each, against the
# CPU device. The fake CANN computes nothing (its outputs stay zero), which
# the preflight must catch: exit status 1, each operator a mismatch. (The
# chain test runs it where it passes.)
"$opserver" --device=ascend:1,3 --cann_libraries="$fake" --preflight \
  >"$tmp/preflight" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "--preflight: exit status $rc, want 1: $(cat "$tmp/preflight")"
grep -q "^device 0: ascend (FakeAscend910B (NPU 1)), 1.0 GiB, " "$tmp/preflight" ||
  fail "--preflight lists no NPU 1: $(cat "$tmp/preflight")"
grep -q "^device 1 HardswishBackward: MISMATCH: element " "$tmp/preflight" ||
  fail "--preflight: $(cat "$tmp/preflight")"
grep -q "^preflight FAILED: 0 of 10 " "$tmp/preflight" ||
  fail "--preflight: $(cat "$tmp/preflight")"
# Devices that cannot be opened: exit status 2, as when serving.
"$opserver" --device=ascend --cann_libraries=/nonexistent/libascendcl.so \
  --preflight >"$tmp/preflight" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "--preflight without CANN: exit status $rc, want 2"
grep -qF "cannot load CANN library /nonexistent/libascendcl.so" "$tmp/preflight" ||
  fail "--preflight without CANN: $(cat "$tmp/preflight")"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo PASS
