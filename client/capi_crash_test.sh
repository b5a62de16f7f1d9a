#!/usr/bin/env bash
# A program using the C API dies (SIGKILL) holding 8 MiB of device memory,
# once idle and once queueing launches as fast as it can (its pipelined
# command window full, its stream's queue long); its session is bound to
# an Attach call, so the server frees everything either way.
set -uo pipefail
opserver="$1"
opctl="$2"
helper="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

source tests/server_lib.sh
trap stop_opserver EXIT
start_opserver "$tmp/server.out" "$tmp/server.err" "$opserver" --threads=2 || exit 1
stats() { "$opctl" --server="127.0.0.1:$port" stats; }

for mode in idle busy; do
  OPSERVER_ADDRESS="127.0.0.1:$port" "$helper" "$mode" >"$tmp/helper.out" 2>&1 &
  helper_pid=$!
  for _ in $(seq 100); do
    grep -q allocated "$tmp/helper.out" && break
    sleep 0.1
  done
  grep -q allocated "$tmp/helper.out" || { echo "FAIL: helper: $(cat "$tmp/helper.out")" >&2; exit 1; }
  stats | grep -q "^buffer_bytes: 8388608$" || { echo "FAIL: before: $(stats)" >&2; exit 1; }
  if [[ $mode == busy ]]; then
    sleep 1.5  # Long enough to fill the window and the stream's queue.
    grep -q . "$tmp/helper.out" && grep -v allocated "$tmp/helper.out" >&2
    echo "server RSS while the busy client queues: $(grep VmRSS /proc/$pid/status 2>/dev/null)"
  fi
  kill -KILL $helper_pid
  wait $helper_pid 2>/dev/null
  for _ in $(seq 100); do
    if stats | grep -q "^sessions: *0$" && stats | grep -q "^buffer_bytes: 0$"; then
      echo "PASS ($mode)"
      continue 2
    fi
    sleep 0.1
  done
  echo "FAIL ($mode): the killed program's session or memory is still there: $(stats)" >&2
  exit 1
done
