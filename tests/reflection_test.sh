#!/usr/bin/env bash
# What a person with only a reflection client sees: every service listed and
# fully describable (health included), the health check, device info.
# `buf curl` (npm @bufbuild/buf, installed by scripts/install-deps.sh) plays
# grpcurl's part on these machines.
set -uo pipefail
opserver="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
source tests/server_lib.sh

# buf gets a home and a cache of its own under $TEST_TMPDIR, empty at start;
# prove below that it really used that empty cache and nothing the real
# $HOME holds.
use_buf "$tmp" || exit 1
[[ -z "$(ls -A "$BUF_CACHE_DIR")" ]] || fail "buf's cache directory is not empty at start"

trap stop_opserver EXIT
start_opserver "$tmp/out" "$tmp/err" "$opserver" || exit 1
url="http://127.0.0.1:$port"
bufcurl() { "$buf" curl --protocol grpc --http2-prior-knowledge "$@"; }

services=$(bufcurl --list-services "$url" 2>&1) || fail "list-services: $services"
[[ -n "$(ls -A "$BUF_CACHE_DIR")" ]] ||
  fail "buf did not write to BUF_CACHE_DIR=$BUF_CACHE_DIR: it may be using a cache elsewhere"
for s in grpc.health.v1.Health grpc.reflection.v1alpha.ServerReflection opserver.v1.Runtime; do
  grep -qx "$s" <<<"$services" || fail "service $s not listed: $services"
done

# --list-methods resolves every listed service's descriptor through
# reflection: it fails if any service (health included) is not describable.
methods=$(bufcurl --list-methods "$url" 2>&1) || fail "list-methods: $methods"
for m in grpc.health.v1.Health/Check grpc.health.v1.Health/Watch opserver.v1.Runtime/GetDeviceInfo \
         opserver.v1.Runtime/CreateSession opserver.v1.Runtime/Upload opserver.v1.Runtime/Download \
         opserver.v1.Operators/GetWorkspaceSize opserver.v1.Operators/Execute opserver.v1.Operators/Evaluate; do
  grep -qx "$m" <<<"$methods" || fail "method $m not listed: $methods"
done

health=$(bufcurl -d '{}' "$url/grpc.health.v1.Health/Check" 2>&1) || fail "health: $health"
grep -q '"status": "SERVING"' <<<"$health" || fail "health not SERVING: $health"

info=$(bufcurl -d '{}' "$url/opserver.v1.Runtime/GetDeviceInfo" 2>&1) || fail "info: $info"
grep -q '"kind": "cpu"' <<<"$info" || fail "device info: $info"
grep -q '"apiVersion": "opserver.v1"' <<<"$info" || fail "device info: $info"

# The walk-through of docs/by-hand.md: an operator on literal numbers, by hand.
call() { bufcurl -d "$2" "$url/opserver.v1.$1" 2>&1; }
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
ops=$(call Operators/ListOperators '{}') || fail "ListOperators: $ops"
for op in ThresholdBackward SoftshrinkBackward HardswishBackward LeakyReluBackward DropoutBackward; do
  grep -q "\"name\": \"$op\"" <<<"$ops" || fail "ListOperators lacks $op"
done
# Parameter defaults, a zero one (ThresholdBackward's threshold) included.
got=$(json '["operators"][0]["params"][0]["defaultValue"]' <<<"$ops")
[[ "$got" == "0" ]] || fail "threshold defaultValue: '$got'"
got=$(json '["operators"][1]["params"][0]["defaultValue"]' <<<"$ops")
[[ "$got" == "0.5" ]] || fail "lambd defaultValue: '$got'"
session=$(call Runtime/CreateSession '{"clientName": "grpcurl"}' | json '["session"]') || fail "CreateSession"
s="\"session\": \"$session\""
for b in 1 2 3; do
  got=$(call Runtime/Malloc "{$s, \"size\": 16}" | json '["buffer"]')
  [[ "$got" == "$b" ]] || fail "Malloc returned buffer '$got', expected $b"
done
call Runtime/WriteValues "{$s, \"buffer\": 1, \"dtype\": \"FLOAT\", \"values\": [4.5, 4.4, 4.3, 4.2]}" >/dev/null || fail "WriteValues"
call Runtime/WriteValues "{$s, \"buffer\": 2, \"dtype\": \"FLOAT\", \"values\": [0.2, 1.2, 2.2, 3.2]}" >/dev/null || fail "WriteValues"
planned=$(call Operators/GetWorkspaceSize "{$s, \"op\": \"ThresholdBackward\", \"params\": {\"threshold\": 1.0},
  \"tensors\": {\"gradOutput\": {\"buffer\": 1, \"dtype\": \"FLOAT\", \"shape\": [4]},
              \"self\": {\"buffer\": 2, \"dtype\": \"FLOAT\", \"shape\": [4]},
              \"out\": {\"buffer\": 3, \"dtype\": \"FLOAT\", \"shape\": [4]}}}") || fail "GetWorkspaceSize: $planned"
executor=$(json '["executor"]' <<<"$planned")
call Operators/Execute "{$s, \"executor\": $executor}" >/dev/null || fail "Execute"
values=$(call Runtime/ReadValues "{$s, \"buffer\": 3, \"dtype\": \"FLOAT\", \"count\": 4}" | json '["values"]')
[[ "$values" == "[0, 4.400000095367432, 4.300000190734863, 4.199999809265137]" ]] || fail "ReadValues: $values"
again=$(call Operators/Execute "{$s, \"executor\": $executor}")
grep -q "already consumed" <<<"$again" || fail "second Execute of a single-use executor: $again"
# Device-side memory operations and an event (docs/by-hand.md).
call Runtime/Memset "{$s, \"buffer\": 3, \"size\": 16, \"value\": 0}" >/dev/null || fail "Memset"
call Runtime/CopyDeviceToDevice "{$s, \"dstBuffer\": 3, \"srcBuffer\": 1, \"size\": 8}" >/dev/null || fail "CopyDeviceToDevice"
event=$(call Runtime/CreateEvent "{$s, \"flags\": 8}" | json '["event"]') || fail "CreateEvent"
[[ "$event" == "5" ]] || fail "CreateEvent returned event '$event', expected 5"
call Runtime/RecordEvent "{$s, \"event\": 5, \"stream\": 0}" >/dev/null || fail "RecordEvent"
call Runtime/SynchronizeEvent "{$s, \"event\": 5}" >/dev/null || fail "SynchronizeEvent"
query=$(call Runtime/QueryEvent "{$s, \"event\": 5}") || fail "QueryEvent: $query"
grep -q '"complete": true' <<<"$query" || fail "QueryEvent: $query"
grep -q '"recorded": true' <<<"$query" || fail "QueryEvent: $query"
elapsed=$(call Runtime/EventElapsedTime "{$s, \"start\": 5, \"end\": 5}") || fail "EventElapsedTime: $elapsed"
values=$(call Runtime/ReadValues "{$s, \"buffer\": 3, \"dtype\": \"FLOAT\", \"count\": 4}" | json '["values"]')
[[ "$values" == "[4.5, 4.400000095367432, 0, 0]" ]] || fail "ReadValues after Memset and CopyDeviceToDevice: $values"
bad=$(call Runtime/Memset "{$s, \"buffer\": 3, \"offset\": 12, \"size\": 8}")
grep -qi "out.of.range\|outside" <<<"$bad" || fail "Memset out of range: $bad"

evaluated=$(call Operators/Evaluate '{"op": "DropoutBackward", "params": {"scale": 2},
  "inputs": {"gradOutput": {"dtype": "FLOAT", "shape": [4, 2], "values": [0, 1, 2, 3, 4, 5, 6, 7]},
             "mask": {"dtype": "UINT8", "shape": [16], "values": [42, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}},
  "output": {"dtype": "FLOAT", "shape": [4, 2]}}' | json '["output"]["values"]')
[[ "$evaluated" == "[0, 2, 0, 6, 0, 10, 0, 0]" ]] || fail "Evaluate: $evaluated"
call Runtime/CloseSession "{$s}" >/dev/null || fail "CloseSession"

# docs/by-hand.md's parameters and dtype names: both names of aclDataType 27
# are accepted, BFLOAT16 is the one printed, a ScalarValue parameter is a
# {dtype, value} object, and a parameter left out takes its advertised
# default (negativeSlope FLOAT 0.01, lambd 0.5, scale 2).
grep -q '"BFLOAT16"' <<<"$ops" || fail "ListOperators does not print BFLOAT16"
grep -q '"BF16"' <<<"$ops" && fail "ListOperators prints BF16"
leaky() {
  call Operators/Evaluate "{\"op\": \"LeakyReluBackward\"$1,
    \"inputs\": {\"gradOutput\": {\"dtype\": \"BF16\", \"shape\": [3], \"values\": [4, 4, 4]},
               \"self\": {\"dtype\": \"BFLOAT16\", \"shape\": [3], \"values\": [1, 0, -1]}},
    \"output\": {\"dtype\": \"$2\", \"shape\": [3]}}"
}
got=$(leaky ', "params": {"negativeSlope": {"dtype": "FLOAT", "value": 0.25}}' FLOAT)
[[ $(json '["output"]["values"]' <<<"$got") == "[4, 1, 1]" ]] || fail "LeakyRelu slope 0.25: $got"
got=$(leaky '' FLOAT)
[[ $(json '["output"]["values"]' <<<"$got") == "[4, 0.0400390625, 0.0400390625]" ]] ||
  fail "LeakyRelu without negativeSlope: $got"
got=$(leaky '' BF16)
[[ $(json '["output"]["dtype"]' <<<"$got") == "BFLOAT16" ]] || fail "output dtype name: $got"
got=$(call Operators/Evaluate '{"op": "SoftshrinkBackward",
  "inputs": {"gradOutput": {"dtype": "FLOAT", "shape": [3], "values": [1, 1, 1]},
             "self": {"dtype": "FLOAT", "shape": [3], "values": [0.25, 0.75, -1]}},
  "output": {"dtype": "FLOAT", "shape": [3]}}')
[[ $(json '["output"]["values"]' <<<"$got") == "[0, 1, 1]" ]] || fail "Softshrink without lambd: $got"
got=$(call Operators/Evaluate '{"op": "DropoutBackward",
  "inputs": {"gradOutput": {"dtype": "FLOAT", "shape": [2], "values": [1, 3]},
             "mask": {"dtype": "UINT8", "shape": [16], "values": [3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]}},
  "output": {"dtype": "FLOAT", "shape": [2]}}')
[[ $(json '["output"]["values"]' <<<"$got") == "[2, 6]" ]] || fail "Dropout without scale: $got"


if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "all reflection checks passed"
