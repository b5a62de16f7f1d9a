#!/usr/bin/env bash
# opctl against a live opserver on a free port: info, ops, run (values and
# .npy in and out, every operator, broadcast, dtypes, parameter defaults from
# ListOperators), bench, and a one-line error for each bad input. The server
# owns two devices (--devices=2), so info, stats and --device are checked
# per device.
set -uo pipefail
opserver="$1"
opctl="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

source tests/server_lib.sh
trap stop_opserver EXIT
# 64 MiB split in two: 32 MiB (33554432 bytes) per device.
start_opserver "$tmp/server.out" "$tmp/server.err" "$opserver" --threads=2 \
  --devices=2 --device_memory_bytes=67108864 || exit 1
ctl() { "$opctl" --server="127.0.0.1:$port" "$@"; }

# Runs opctl and expects success with `want` somewhere in stdout.
expect_out() {
  local want=$1
  shift
  ctl "$@" >"$tmp/out" 2>"$tmp/err" || { fail "opctl $*: $(cat "$tmp/err")"; return; }
  grep -qF -- "$want" "$tmp/out" || fail "opctl $*: want '$want', got: $(cat "$tmp/out")"
}
# Runs opctl and expects exit 1 with exactly one stderr line containing `want`.
expect_err() {
  local want=$1
  shift
  ctl "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq 1 ]] || fail "opctl $*: exit $rc, want 1"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "opctl $*: want one line, got: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "opctl $*: want '$want', got: $(cat "$tmp/err")"
}

expect_out "health:   SERVING" info
expect_out "ThresholdBackward (aclnnThresholdBackward)" ops
expect_out "tensor mask" ops
expect_out "negativeSlope" ops
expect_out "BFLOAT16" ops
expect_out "sessions:" stats

# Per device: info lists both with their share of the memory; stats shows
# each device with nothing on it; --device picks one for run and bench.
expect_out "device 0: cpu (" info
expect_out "device 1: cpu (" info
expect_out "), 33554432 bytes, 2 threads" info
ctl info >"$tmp/out" 2>&1
[[ $(grep -c "^device [0-9]*: cpu" "$tmp/out") -eq 2 ]] || fail "info should list 2 devices: $(cat "$tmp/out")"
expect_out "device 0:     0 sessions, 0 buffers, 0 buffer bytes, 33554432 of 33554432 bytes free" stats
expect_out "device 1:     0 sessions, 0 buffers, 0 buffer bytes, 33554432 of 33554432 bytes free" stats
expect_out "out = [0, 4.4, 4.3, 4.2]" \
  run ThresholdBackward --device=1 --threshold=1 --gradOutput=4.5,4.4,4.3,4.2 --self=0.2,1.2,2.2,3.2
expect_out "DropoutBackward" bench --device=1 --bytes=65536 --iterations=1 --elements=16
expect_err "device 2 does not exist: the server has 2 devices (0 to 1)" \
  run ThresholdBackward --device=2 --gradOutput=1 --self=1
expect_err "run: --device=x must be a device index" \
  run ThresholdBackward --device=x --gradOutput=1 --self=1
expect_err "device 7 does not exist: the server has 2 devices" bench --device=7

# The spec's worked examples and each operator.
expect_out "out = [0, 4.4, 4.3, 4.2]" \
  run ThresholdBackward --threshold=1 --gradOutput=4.5,4.4,4.3,4.2 --self=0.2,1.2,2.2,3.2 --dtype=FLOAT
expect_out "out = [0, 2, 0, 6, 0, 10, 0, 0]  (FLOAT, shape [4,2])" \
  run DropoutBackward --scale=2 --gradOutput=0,1,2,3,4,5,6,7 --gradOutput_shape=4,2 \
  --mask=42,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0
expect_out "gradInput = [0, 2, 0, 4]" \
  run SoftshrinkBackward --lambd=0.5 --gradOutput=1,2,3,4 --self=0.5,-0.6,0.1,-2
expect_out "out = [0, -1, 1, 3]  (FLOAT16" \
  run HardswishBackward --dtype=FLOAT16 --gradOutput=2,2,2,2 --self=-4,-3,0,3
expect_out "out = [0.01, 0.02, 3, 4]" \
  run aclnnLeakyReluBackward --negativeSlope=0.01 --selfIsResult --gradOutput=1,2,3,4 --self=-1,0,1,2
# Broadcast: self [2,1] against gradOutput [2,2]; integer and mixed dtypes.
expect_out "out = [0, 0, 3, 4]  (INT32, shape [2,2])" \
  run ThresholdBackward --dtype=INT32 --threshold=0.5 --gradOutput=1,2,3,4 --gradOutput_shape=2,2 \
  --self=0,1 --self_shape=2,1
expect_out "out = [4, 1, 1]  (DOUBLE" \
  run LeakyReluBackward --gradOutput=4,4,4 --self=1,0,-1 --gradOutput_dtype=BF16 --self_dtype=BF16 \
  --out_dtype=DOUBLE --negativeSlope=0.25

# Every operator in every dtype it supports (values exact in FLOAT16/BF16).
for dtype in FLOAT FLOAT16 BF16 INT32 INT8 UINT8; do
  expect_out "out = [0, 0, 3, 4]" \
    run ThresholdBackward --dtype=$dtype --threshold=1.5 --gradOutput=1,2,3,4 --self=0,1,2,3
done
for dtype in FLOAT FLOAT16 BF16; do
  expect_out "gradInput = [1, 0, 0, 4]" \
    run SoftshrinkBackward --dtype=$dtype --lambd=0.5 --gradOutput=1,2,3,4 --self=-4,-0.5,0.5,4
  expect_out "out = [0, -1, 4.5, 4]" \
    run HardswishBackward --dtype=$dtype --gradOutput=1,2,3,4 --self=-4,-3,3,4
  expect_out "out = [0, 4, 0, 8]" \
    run DropoutBackward --dtype=$dtype --scale=2 --gradOutput=1,2,3,4 --mask=10,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0
done
for dtype in FLOAT FLOAT16 BF16 DOUBLE; do
  expect_out "out = [0.5, 1, 3, 4]" \
    run LeakyReluBackward --dtype=$dtype --negativeSlope=0.5 --gradOutput=1,2,3,4 --self=-4,-0.5,0.5,4
done

# .npy out, then in again.
expect_out "written to $tmp/t.npy" \
  run ThresholdBackward --threshold=1 --gradOutput=4.5,4.4,4.3,4.2 --gradOutput_shape=2,2 \
  --self=0.2,1.2,2.2,3.2 --self_shape=2,2 --output="$tmp/t.npy"
expect_out "out = [0, 4.4, 4.3, 4.2]  (FLOAT, shape [2,2])" \
  run ThresholdBackward --threshold=-1 --gradOutput=@"$tmp/t.npy" --self=1 --self_shape=1,1
if python3 -c "import numpy" 2>/dev/null; then
  python3 -c "
import numpy as np
a = np.load('$tmp/t.npy')
assert a.dtype == np.float32 and a.shape == (2, 2), (a.dtype, a.shape)
assert np.allclose(a.ravel(), [0, 4.4, 4.3, 4.2]), a
np.save('$tmp/g.npy', np.arange(6, dtype=np.int32).reshape(2, 3))
" || fail "numpy cannot read opctl's .npy"
  # numpy's own file in a dtype other than float32 (ThresholdBackward has
  # no DOUBLE: the spec's dtype list).
  expect_out "out = [0, 0, 0, 3, 4, 5]  (INT32, shape [2,3])" \
    run ThresholdBackward --threshold=2 --gradOutput=@"$tmp/g.npy" --self=@"$tmp/g.npy" --dtype=INT32
fi

expect_out "upload:" bench --bytes=1048576 --iterations=3 --elements=256
expect_out "of raw TCP" bench --bytes=1048576 --iterations=1 --elements=16
expect_out "DropoutBackward" bench --bytes=1048576 --iterations=3 --elements=256
expect_out "Usage: opctl [--server=..] run OP" run --help
# What run takes comes from the server's ListOperators, defaults included.
expect_out "SoftshrinkBackward --gradOutput --self [--lambd=0.5] -> gradInput" run --help
expect_out "param  lambd       float  default 0.5" ops
expect_out "gradInput = [0, 2, 0, 4]" \
  run SoftshrinkBackward --gradOutput=1,2,3,4 --self=0.5,-0.6,0.1,-2
expect_out "out = [0, 2, 0, 6, 0, 10, 0, 0]" \
  run DropoutBackward --gradOutput=0,1,2,3,4,5,6,7 --mask=42,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0
expect_out "--iterations" bench --help

# Bad input: one line each, exit 1 (opctl's own usage errors, exit 2, are
# tests/cli_binary_test.sh's).
expect_err "run: missing OP" run
expect_err "run: unknown operator 'Relu'" run Relu --gradOutput=1
expect_err "run: ThresholdBackward needs --self" run ThresholdBackward --gradOutput=1
expect_err "run: --self: 'x' is not a number" run ThresholdBackward --gradOutput=1 --self=x
expect_err "unknown dtype 'FLOAT128'" run ThresholdBackward --gradOutput=1 --self=1 --dtype=FLOAT128
expect_err "has 3 values but shape [2,2] holds 4" run ThresholdBackward --gradOutput=1,2,3 --gradOutput_shape=2,2 --self=1
expect_err "cannot be broadcast" run ThresholdBackward --gradOutput=1,2,3 --self=1,2
expect_err "--threshold=abc is not a number" run ThresholdBackward --gradOutput=1 --self=1 --threshold=abc
expect_err "unknown argument --lamda for SoftshrinkBackward, which takes --gradOutput, --self, --lambd" \
  run SoftshrinkBackward --gradOutput=1 --self=1 --lamda=1
expect_err "the server offers ThresholdBackward, SoftshrinkBackward" run Relu
expect_err "run: --selfIsResult=yes must be true or false" \
  run LeakyReluBackward --gradOutput=1 --self=1 --selfIsResult=yes
expect_err "not representable as INT8" run ThresholdBackward --gradOutput=1.5 --self=1 --dtype=INT8
expect_err "cannot open '$tmp/none.npy'" run ThresholdBackward --gradOutput=@"$tmp/none.npy" --self=1
echo "not numpy" >"$tmp/bad.npy"
expect_err "is not a usable .npy file" run ThresholdBackward --gradOutput=@"$tmp/bad.npy" --self=1
# The server's verdicts, with the aclnn status.
expect_err "lambd must be >= 0, got -1 (aclnn 161002)" \
  run SoftshrinkBackward --lambd=-1 --gradOutput=1 --self=1
expect_err "(aclnn 161002)" run ThresholdBackward --gradOutput=1,2 --self=1,2 --self_dtype=INT8
expect_err "bench: --bytes=0 must be a positive integer" bench --bytes=0
expect_err "bench: unknown argument --size" bench --size=1
"$opctl" --server=127.0.0.1:1 --timeout_ms=300 run ThresholdBackward --gradOutput=1 --self=1 \
  >"$tmp/out" 2>"$tmp/err"
grep -q "cannot reach opserver at 127.0.0.1:1" "$tmp/err" || fail "unreachable run: $(cat "$tmp/err")"

# Refused and malformed addresses: the cause, at once (a 10-minute time-out
# is never waited out).
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print("127.0.0.1:%d" % s.getsockname()[1])')
"$opctl" --server="$closed" --timeout_ms=600000 info >"$tmp/out" 2>"$tmp/err"
grep -qF "cannot reach opserver at $closed: connection refused" "$tmp/err" ||
  fail "refused info: $(cat "$tmp/err")"
"$opctl" --server="http://127.0.0.1:$port" --timeout_ms=600000 info >"$tmp/out" 2>"$tmp/err"
grep -qF "cannot dial 'http://127.0.0.1:$port': it is a URL (http://)" "$tmp/err" ||
  fail "URL address: $(cat "$tmp/err")"

# A server SIGKILLed under opctl: one line, "server at ... went away". The
# gate is a FIFO as the .npy input: opctl opens it after connecting and
# fetching the operator list, so opening its other end returns only then.
main_pid=$pid
main_port=$port
start_opserver "$tmp/lost.out" "$tmp/lost.err" "$opserver" --threads=1 || exit 1
lost_pid=$pid
lost_port=$port
pid=$main_pid
port=$main_port
mkfifo "$tmp/gate.npy"
"$opctl" --server="127.0.0.1:$lost_port" --timeout_ms=600000 run ThresholdBackward \
  --threshold=-1 --gradOutput=@"$tmp/gate.npy" --self=1 --self_shape=1,1 \
  >"$tmp/out" 2>"$tmp/err" &
ctl_pid=$!
# Should opctl end without opening the FIFO, this opens it (read-write
# never blocks) so that the open below returns and the test fails, not hangs.
( while kill -0 $ctl_pid 2>/dev/null; do sleep 0.2; done; exec 4<>"$tmp/gate.npy" ) &
unblock_pid=$!
exec 3>"$tmp/gate.npy"
kill -KILL $lost_pid
wait $lost_pid 2>/dev/null
cat "$tmp/t.npy" >&3
exec 3>&-
wait $ctl_pid
rc=$?
wait $unblock_pid
[[ $rc -eq 1 ]] || fail "opctl on a lost server: exit $rc, want 1"
[[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "opctl on a lost server: want one line, got: $(cat "$tmp/err")"
grep -qF "server at 127.0.0.1:$lost_port went away" "$tmp/err" ||
  fail "opctl on a lost server: $(cat "$tmp/err")"

kill -0 $pid 2>/dev/null || fail "server died: $(cat "$tmp/server.err")"
[[ $failures -eq 0 ]] || exit 1
echo PASS
