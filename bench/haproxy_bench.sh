#!/usr/bin/env bash
# What Debian's HAProxy (deploy/haproxy/haproxy.cfg, on loopback) costs:
# the 250-operator pipelined step and a 256 MiB aclrtMemcpy each way, against
# an opserver directly and through the proxy in front of it and a second
# one, in the same run (step_bench --addresses), with the data path off
# (every byte through gRPC, so through the proxy) and on (the ticket goes
# through the proxy, the bytes to the server's data port: docs/pool.md).
#
#   bazel build -c opt //server:opserver //bench:step_bench
#   bench/haproxy_bench.sh [ROUNDS]
set -euo pipefail
rounds=${1:-3}
bin=bazel-bin
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# An opserver on a free port; sets `address` to its HOST:PORT. Not run in
# a command substitution: its pid must reach `pids` in this shell.
start_server() {
  local out=$tmp/server$1.out
  "$bin/server/opserver" --listen=127.0.0.1:0 --device_memory_bytes=2147483648 \
    >"$out" 2>"$tmp/server$1.err" &
  pids+=($!)
  for _ in $(seq 300); do
    address=$(sed -n 's/^listening on \(127\.0\.0\.1:[0-9]*\)$/\1/p' "$out")
    [[ -n $address ]] && return
    sleep 0.1
  done
  echo "opserver did not start: $(cat "$tmp/server$1.err")" >&2
  exit 1
}
start_server 1
s1=$address
start_server 2
s2=$address
front_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
OPSERVER_HAPROXY_BIND=127.0.0.1:$front_port OPSERVER_HAPROXY_ADMIN=$tmp/admin.sock \
OPSERVER_BACKEND_1=$s1 OPSERVER_BACKEND_2=$s2 \
  haproxy -db -f deploy/haproxy/haproxy.cfg >"$tmp/calls.log" 2>"$tmp/haproxy.err" &
pids+=($!)
for _ in $(seq 300); do
  [[ -S $tmp/admin.sock ]] && break
  sleep 0.1
done
[[ -S $tmp/admin.sock ]] || { echo "haproxy did not start: $(cat "$tmp/haproxy.err")" >&2; exit 1; }

echo "opservers $s1 $s2 ($(nproc) cores); HAProxy $(haproxy -v | head -1 | cut -d' ' -f3) on 127.0.0.1:$front_port"
for data_path in 0 1; do
  echo
  OPSERVER_DATA_PATH=$data_path "$bin/bench/step_bench" \
    --addresses="direct=$s1,haproxy=127.0.0.1:$front_port" --rounds="$rounds"
done
