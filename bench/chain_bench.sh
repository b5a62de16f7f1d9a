#!/bin/sh
# The Ascend device over its verification chain, measured against its CPU
# backend in the same run (BENCHMARKS.md, "The Ascend device over the
# chain"): builds the opserver binary, libaclnn_remote.so and both
# benchmarks with -c opt, then runs
#   step_bench --chain   (the 250-operator pipelined step, per operator)
#   remote_bench --chain (256 MiB transfers, unpipelined operators)
#   remote_bench --chain with the fake CANN as the front's CANN (its copies
#     are a memcpy): the 256 MiB transfers through the front's staging
#     alone, without libaclnn_remote.so's cost per copy
# Each starts its own backend (--device=cpu) and front (--device=ascend
# with libaclnn_remote.so as its CANN) on free loopback ports and stops
# them at the end. ROUNDS (default 2) and PAIRED (default 5) set the
# rounds of each.
set -eu
cd "$(dirname "$0")/.."
bazel build -c opt --jobs=2 //server:opserver //client:libaclnn_remote.so \
  //bench:step_bench //bench:remote_bench //devices/ascend:libfake_cann.so
chain="bazel-bin/server/opserver,bazel-bin/client/libaclnn_remote.so"
bazel-bin/bench/step_bench --chain="$chain" --rounds="${ROUNDS:-2}"
bazel-bin/bench/remote_bench --chain="$chain" --paired="${PAIRED:-5}"
bazel-bin/bench/remote_bench \
  --chain=bazel-bin/server/opserver,bazel-bin/devices/ascend/libfake_cann.so \
  --chain_transfers_only --paired="${PAIRED:-5}"
