#!/usr/bin/env bash
# The API passes `buf lint` (STANDARD rules) with only the exceptions
# proto/buf.yaml documents, so a new message, field or enum that breaks the
# style guide fails here. buf runs on a copy of the module under
# $TEST_TMPDIR, with a home and cache of its own.
set -u
source tests/server_lib.sh
proto="$1"
config="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
use_buf "$tmp" || exit 1
module="$tmp/module"
rm -rf "$module"
mkdir -p "$module"
cp "$proto" "$config" "$module/"
cd "$module" || exit 1
if ! out=$("$buf" lint 2>&1); then
  echo "FAIL: buf lint reports:" >&2
  echo "$out" >&2
  exit 1
fi
echo "PASS: buf lint"
