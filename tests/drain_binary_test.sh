#!/usr/bin/env bash
# opserver --drain_s as a load balancer and an operator see it: after
# SIGTERM the server is NOT_SERVING and draining (opctl info/stats), refuses
# new sessions with "server draining", serves the open one, and exits 0 as
# soon as it closes; a second SIGTERM ends the drain; a session that does
# not close is cut off once the drain time and the grace are over.
# Sessions are made and closed with `buf curl`, which leaves them open
# between calls. buf reads the schema from proto/opserver.proto, so this
# test does not depend on reflection (reflection_test.sh covers that).
#
# Time limits are upper bounds far above what the behaviour needs.
set -uo pipefail
opserver="$1"
opctl="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

source tests/server_lib.sh
use_buf "$tmp" || exit 1
trap stop_opserver EXIT

call() {
  "$buf" curl --schema proto/opserver.proto --protocol grpc --http2-prior-knowledge -d "$2" \
    "http://127.0.0.1:$port/opserver.v1.$1" 2>&1
}
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

# Starts the server with FLAGS and opens one session: sets pid, port and
# session.
start_with_session() {
  start_opserver "$tmp/out" "$tmp/err" "$opserver" "$@" || {
    failures=$((failures + 1))
    return 1
  }
  local created
  created=$(call Runtime/CreateSession '{"clientName": "drain"}') || {
    fail "CreateSession before the drain: $created"
    return 1
  }
  session=$(json '["session"]' <<<"$created")
}

# Waits up to SECONDS for the server to exit; expects status 0 and the
# 'stopped' log line. Returns 1 if it is still running.
expect_exit() {
  local seconds=$1 what=$2
  for _ in $(seq $((seconds * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      local rc=$?
      pid=""
      [[ $rc -eq 0 ]] || fail "$what: exit status $rc"
      grep -q "stopped" "$tmp/err" || fail "$what: no 'stopped' log line: $(cat "$tmp/err")"
      return 0
    fi
    sleep 0.1
  done
  fail "$what: still running ${seconds} s later"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  pid=""
  return 1
}

# Waits up to 30 s for opctl stats to say the server drains.
await_draining() {
  for _ in $(seq 300); do
    "$opctl" --server="127.0.0.1:$port" stats 2>/dev/null | grep -q "^draining: *yes" && return 0
    sleep 0.1
  done
  fail "opctl stats never said draining: $(cat "$tmp/err")"
  return 1
}

# 1. The drain as a client sees it, ended early by the last session closing
# (long before the 600 s drain time).
if start_with_session --drain_s=600 --shutdown_grace_ms=500; then
  "$opctl" --server="127.0.0.1:$port" stats >"$tmp/stats" 2>&1
  grep -q "^draining: *no" "$tmp/stats" || fail "before SIGTERM: $(cat "$tmp/stats")"
  kill -TERM "$pid"
  if await_draining; then
    kill -0 "$pid" 2>/dev/null || fail "exited at SIGTERM with a session open"
    "$opctl" --server="127.0.0.1:$port" info >"$tmp/info" 2>&1 || fail "opctl info: $(cat "$tmp/info")"
    grep -q "^health: *NOT_SERVING" "$tmp/info" || fail "opctl info while draining: $(cat "$tmp/info")"
    grep -q "^draining: *yes" "$tmp/info" || fail "opctl info while draining: $(cat "$tmp/info")"
    refused=$(call Runtime/CreateSession '{"clientName": "late"}') && fail "CreateSession while draining succeeded: $refused"
    grep -qi "unavailable" <<<"$refused" || fail "refusal is not UNAVAILABLE: $refused"
    grep -q "server draining" <<<"$refused" || fail "refusal does not say 'server draining': $refused"
    # The open session is still served.
    malloced=$(call Runtime/Malloc "{\"session\": \"$session\", \"size\": \"8\"}") ||
      fail "Malloc in the open session while draining: $malloced"
    closed=$(call Runtime/CloseSession "{\"session\": \"$session\"}") || fail "CloseSession: $closed"
    expect_exit 30 "after the last session closed"
    grep -q "every session has closed" "$tmp/err" || fail "no 'every session has closed' log line: $(cat "$tmp/err")"
  fi
fi

# 2. A second SIGTERM ends the drain (sessions still open).
if start_with_session --drain_s=600 --shutdown_grace_ms=500; then
  kill -TERM "$pid"
  if await_draining; then
    kill -TERM "$pid"
    expect_exit 30 "after a second SIGTERM"
    grep -q "while draining: ending the drain" "$tmp/err" || fail "no log line for the second SIGTERM: $(cat "$tmp/err")"
  fi
fi

# 3. A session that does not close is cut off at drain time + grace.
if start_with_session --drain_s=2 --shutdown_grace_ms=500; then
  kill -TERM "$pid"
  expect_exit $((2 + 1 + 30)) "with a session open after the drain time"
  grep -q "drain time is over with 1 sessions open" "$tmp/err" || fail "no 'drain time is over' log line: $(cat "$tmp/err")"
fi

# 4. Without --drain_s, SIGTERM shuts down at once, open sessions or not.
if start_with_session --shutdown_grace_ms=500; then
  kill -TERM "$pid"
  expect_exit 30 "without --drain_s"
  grep -q "draining" "$tmp/err" && fail "drained without --drain_s: $(cat "$tmp/err")"
fi

# 5. SIGINT never drains.
if start_with_session --drain_s=600 --shutdown_grace_ms=500; then
  kill -INT "$pid"
  expect_exit 30 "after SIGINT with --drain_s"
fi

[[ $failures -eq 0 ]] || exit 1
echo PASS
