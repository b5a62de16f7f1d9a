#!/usr/bin/env bash
# What a person with only a reflection client sees: every service listed and
# fully describable (health included), the health check, device info.
# `buf curl` (npm @bufbuild/buf, installed by scripts/install-deps.sh) plays
# grpcurl's part on these machines.
set -uo pipefail
opserver="$1"
buf="${OPSERVER_TOOLS:-$HOME/.cache/opserver/tools}/node_modules/.bin/buf"
if [[ ! -x "$buf" ]]; then
  echo "FAIL: buf not found at $buf; run scripts/install-deps.sh" >&2
  exit 1
fi
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

"$opserver" --listen=127.0.0.1:0 >"$tmp/out" 2>"$tmp/err" &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$tmp/out")
  [[ -n "$port" ]] && break
  sleep 0.1
done
[[ -n "$port" ]] || { echo "FAIL: server did not start: $(cat "$tmp/err")" >&2; exit 1; }
url="http://127.0.0.1:$port"
bufcurl() { "$buf" curl --protocol grpc --http2-prior-knowledge "$@"; }

services=$(bufcurl --list-services "$url" 2>&1) || fail "list-services: $services"
for s in grpc.health.v1.Health grpc.reflection.v1alpha.ServerReflection opserver.v1.Runtime; do
  grep -qx "$s" <<<"$services" || fail "service $s not listed: $services"
done

# --list-methods resolves every listed service's descriptor through
# reflection: it fails if any service (health included) is not describable.
methods=$(bufcurl --list-methods "$url" 2>&1) || fail "list-methods: $methods"
for m in grpc.health.v1.Health/Check grpc.health.v1.Health/Watch opserver.v1.Runtime/GetDeviceInfo; do
  grep -qx "$m" <<<"$methods" || fail "method $m not listed: $methods"
done

health=$(bufcurl -d '{}' "$url/grpc.health.v1.Health/Check" 2>&1) || fail "health: $health"
grep -q '"status": "SERVING"' <<<"$health" || fail "health not SERVING: $health"

info=$(bufcurl -d '{}' "$url/opserver.v1.Runtime/GetDeviceInfo" 2>&1) || fail "info: $info"
grep -q '"kind": "cpu"' <<<"$info" || fail "device info: $info"
grep -q '"apiVersion": "opserver.v1"' <<<"$info" || fail "device info: $info"

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all reflection checks passed"
