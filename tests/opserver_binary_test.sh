#!/usr/bin/env bash
# The opserver and opctl binaries as a person runs them: flags, the
# "listening on" line, `opctl info`, and graceful exit on SIGTERM/SIGINT.
set -uo pipefail
opserver="$1"
opctl="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

source tests/server_lib.sh

# Starts the server on a free port; sets pid and port.
start_server() {
  start_opserver "$tmp/out" "$tmp/err" "$opserver" "$@" && return 0
  failures=$((failures + 1))
  return 1
}

# Sends a signal and expects exit 0 within 30 s (a bounded wait: an
# ASan build on a loaded machine stops slowly).
stop_server() {
  local signal=$1
  kill "-$signal" "$pid"
  for _ in $(seq 300); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      local rc=$?
      [[ $rc -eq 0 ]] || fail "exit status $rc after SIG$signal"
      grep -q "stopped" "$tmp/err" || fail "no 'stopped' log line after SIG$signal"
      return
    fi
    sleep 0.1
  done
  fail "still running 30 s after SIG$signal"
  kill -KILL "$pid"
}

# A bad flag: non-zero exit, exactly one line naming the flag.
expect_flag_error() {
  local flag=$1
  shift
  "$opserver" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -ne 0 ]] || fail "$*: exit status 0"
  [[ $rc -lt 128 ]] || fail "$*: died of a signal ($rc)"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "$*: want one line, got: $(cat "$tmp/err")"
  grep -q -- "$flag" "$tmp/err" || fail "$*: message does not name $flag: $(cat "$tmp/err")"
}

expect_flag_error --listen --listen=nonsense
expect_flag_error --listen --listen=127.0.0.1:70000
expect_flag_error --device --listen=127.0.0.1:0 --device=quantum
expect_flag_error --threads --listen=127.0.0.1:0 --threads=-4
expect_flag_error --data_advertise --listen=127.0.0.1:0 --data_advertise=gpu-host-1:0
grep -q "port must be 1..65535" "$tmp/err" || fail "--data_advertise port 0: $(cat "$tmp/err")"

# The advertised data address (behind a proxy, docs/pool.md) in opctl stats.
if start_server --data_advertise=gpu-host-1:50052; then
  "$opctl" --server="127.0.0.1:$port" stats >"$tmp/stats" 2>&1 || fail "opctl stats: $(cat "$tmp/stats")"
  grep -q "^data_address: gpu-host-1:50052$" "$tmp/stats" || fail "opctl stats lacks the data address: $(cat "$tmp/stats")"
  stop_server TERM
fi

if start_server; then
  # opctl against it.
  "$opctl" --server="127.0.0.1:$port" info >"$tmp/info" 2>&1 || fail "opctl info: $(cat "$tmp/info")"
  grep -q "^device 0: cpu" "$tmp/info" || fail "opctl info lacks the device: $(cat "$tmp/info")"
  grep -q "^health: *SERVING" "$tmp/info" || fail "opctl info lacks health: $(cat "$tmp/info")"
  # A second server on the same port: one-line error naming --listen.
  expect_flag_error --listen --listen="127.0.0.1:$port"
  grep -q "Address already in use" "$tmp/err" || fail "port in use: $(cat "$tmp/err")"
  stop_server TERM
fi
if start_server --threads=1; then
  stop_server INT
fi

# Secure by default: a non-loopback address without TLS and authentication
# is refused (one line naming the flags) unless --allow_insecure says so.
expect_flag_error --allow_insecure --listen=0.0.0.0:0
grep -q -- "--tls_cert_file" "$tmp/err" || fail "insecure refusal does not name --tls_cert_file: $(cat "$tmp/err")"
grep -q -- "--auth_token_file" "$tmp/err" || fail "insecure refusal does not name --auth_token_file: $(cat "$tmp/err")"
"$opserver" --listen=0.0.0.0:0 --allow_insecure >"$tmp/out" 2>"$tmp/err" &
pid=$!
for _ in $(seq 300); do
  grep -q "^listening on 0\.0\.0\.0:[0-9]" "$tmp/out" && break
  sleep 0.1
done
if grep -q "^listening on 0\.0\.0\.0:[0-9]" "$tmp/out"; then
  [[ $(grep -c "warning: --allow_insecure" "$tmp/err") -eq 1 ]] ||
    fail "--allow_insecure: want one warning line, got: $(cat "$tmp/err")"
  stop_server TERM
else
  fail "--allow_insecure did not start: $(cat "$tmp/err")"
  kill -KILL "$pid" 2>/dev/null
fi

# opctl's own errors are one line and non-zero.
"$opctl" --server=127.0.0.1:1 --timeout_ms=300 info >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 0 ]] || fail "opctl info against nothing exited 0"
grep -q "cannot reach opserver at 127.0.0.1:1" "$tmp/err" || fail "opctl unreachable: $(cat "$tmp/err")"
"$opctl" frobnicate >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 0 ]] || fail "opctl unknown command exited 0"
grep -q "unknown command 'frobnicate'" "$tmp/err" || fail "opctl unknown command: $(cat "$tmp/err")"

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all opserver binary checks passed"
