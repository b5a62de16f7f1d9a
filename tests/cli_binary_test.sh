#!/usr/bin/env bash
# The command line of the binaries a user runs (opserver, opctl), before any
# server is needed: --help prints the usage and the program's own flags,
# --version the release, the commit and the build mode this test was built
# in, and a command line that cannot be used exits with status 2 (docs/
# server-flags.md, docs/opctl.md), one error line naming what is wrong.
set -uo pipefail
opserver="$1"
opctl="$2"
mode="$3"  # Bazel's compilation mode of this build: opt, fastbuild or dbg.
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# Runs a binary; sets rc, with its stdout in $tmp/out and stderr in $tmp/err.
# None of these command lines may serve: the bound only ends a binary that
# starts serving where it should have refused (status 124, a failure).
run() {
  timeout 120 "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
}

# --help: exit 0, the usage line and the program's own flags on stdout.
expect_help() {
  local binary=$1 usage=$2 flag=$3
  run "$binary" --help
  [[ $rc -eq 0 ]] || fail "$binary --help: exit $rc, want 0"
  grep -qF -- "$usage" "$tmp/out" || fail "$binary --help lacks '$usage': $(head -5 "$tmp/out")"
  grep -qF -- "$flag (" "$tmp/out" || fail "$binary --help does not list $flag: $(head -5 "$tmp/out")"
  grep -qF "No flags matched" "$tmp/out" && fail "$binary --help: No flags matched"
  # Abseil's and gRPC's flags only under --helpfull.
  grep -qF -- "--flagfile" "$tmp/out" && fail "$binary --help lists Abseil's flags"
  run "$binary" --helpfull
  [[ $rc -eq 0 ]] || fail "$binary --helpfull: exit $rc, want 0"
  grep -qF -- "--flagfile" "$tmp/out" || fail "$binary --helpfull lacks Abseil's flags"
}

# --version: exit 0 and exactly one line:
#   NAME RELEASE (commit <40 hex digits>[-dirty] | unknown, MODE[+asan] build)
expect_version() {
  local binary=$1 name=$2
  run "$binary" --version
  [[ $rc -eq 0 ]] || fail "$binary --version: exit $rc, want 0"
  local want="^$name [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{40}(-dirty)?|unknown), $mode(\+asan)? build\)\$"
  [[ $(wc -l <"$tmp/out") -eq 1 ]] || fail "$binary --version: want one line, got: $(cat "$tmp/out")"
  grep -qE "$want" "$tmp/out" || fail "$binary --version: got '$(cat "$tmp/out")', want /$want/"
}

# A usage error: exit 2 and one stderr line containing `want`.
expect_usage_error() {
  local want=$1
  shift
  run "$@"
  [[ $rc -eq 2 ]] || fail "$*: exit $rc, want 2"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "$*: want one line, got: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$*: want '$want', got: $(cat "$tmp/err")"
}

expect_help "$opserver" "Usage: opserver" --listen
expect_help "$opctl" "Usage: opctl" --server
expect_version "$opserver" opserver
expect_version "$opctl" opctl

expect_usage_error "Unknown command line flag 'frobnicate'" "$opserver" --frobnicate
expect_usage_error "Illegal value 'abc' specified for flag 'threads'" "$opserver" --threads=abc
expect_usage_error "unexpected argument 'serve'" "$opserver" --listen=127.0.0.1:0 serve
expect_usage_error "Unknown command line flag 'frobnicate'" "$opctl" --frobnicate info
expect_usage_error "Illegal value 'x' specified for flag 'timeout_ms'" "$opctl" --timeout_ms=x info
expect_usage_error "unknown command 'frobnicate'" "$opctl" frobnicate
expect_usage_error "missing COMMAND" "$opctl"
expect_usage_error "unexpected arguments after 'info'" "$opctl" info extra

[[ $failures -eq 0 ]] || exit 1
echo PASS
