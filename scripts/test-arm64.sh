#!/usr/bin/env bash
# Cross-builds opserver for aarch64 (bazel --config=aarch64) and runs its
# tests under qemu-user, as on a Kunpeng 920 host: NEON-only
# (QEMU_CPU=neoverse-n1). The SIMD kernel tests then run again on an
# emulated CPU with SVE and SVE2 at SVE's widest vectors (2048 bits), so
# every Highway target the arm64 build has runs at least once.
#
#   scripts/test-arm64.sh [--ci | --all] [BAZEL_FLAG...]
#
# Without an option: the kernel tests and the end-to-end tests that start
# the opserver binary (docs/install.md, "arm64", lists them). With --ci: a
# smaller sample sized for CI, whose build is mostly disk-cache hits once
# warm: the SIMD kernel and operator tests (on both CPUs), the C API
# against an in-process server, and the opserver binary started by a
# test. With --all: every test that builds for arm64, i.e. all but the
# Python ones (the host's amd64 python3 cannot load an arm64 extension) and
# the package test (it builds amd64 .deb files). Extra arguments go to each
# `bazel test` (e.g. --jobs=2).
#
# Needs root (or sudo) once per boot: qemu-aarch64 is registered with the
# kernel's binfmt_misc, so that Bazel, the sh_tests and opserver's own
# children start arm64 programs like native ones.
set -euo pipefail
cd "$(dirname "$0")/.."

set_name=default
if [[ "${1:-}" == --all || "${1:-}" == --ci ]]; then
  set_name=${1#--}
  shift
fi
# --config=aarch64's cross compiler; arm64 tests under qemu-user.
scripts/install-deps.sh g++-aarch64-linux-gnu qemu-user-static binfmt-support
sysroot="${OPSERVER_ARM64_SYSROOT:-$HOME/.cache/opserver-arm64-sysroot}"
scripts/arm64-sysroot.sh "$sysroot"

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
binfmt=/proc/sys/fs/binfmt_misc
if [[ ! -e "$binfmt/status" ]]; then
  $sudo mount -t binfmt_misc binfmt_misc "$binfmt"
fi
if ! head -n1 "$binfmt/qemu-aarch64" 2>/dev/null | grep -qx enabled; then
  # qemu-user-static's entry (/usr/share/binfmts/qemu-aarch64): flag F opens
  # the interpreter now, so it also works inside Bazel's sandbox.
  $sudo update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
  $sudo update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  head -n1 "$binfmt/qemu-aarch64" 2>/dev/null | grep -qx enabled || {
    echo "test-arm64: cannot register qemu-aarch64 with binfmt_misc" >&2
    exit 1
  }
fi

# The SIMD kernels and the operator definitions they implement.
kernel_tests=(
  //kernels:tensor_test
  //kernels:validate_test
  //devices/cpu:element_io_test
  //devices/cpu:op_loops_test
  //devices/cpu:elementwise_simd_test
  //devices/cpu:ops_spec_test
  //devices/cpu:torch_reference_test
  //devices/cpu:plan_test
  //devices/cpu:cpu_device_test
  //devices/cpu:memory_pool_test
)
# The opserver binary started by a test, and the C API, opctl and example
# programs against it.
e2e_tests=(
  //tests:opserver_binary_test
  //tests:cli_binary_test
  //tests:drain_binary_test
  //tests:log_binary_test
  //tests:security_binary_test
  //tests:reflection_test
  //client:opctl_test
  //client:capi_crash_test
  //examples:examples_test
)
# The SIMD kernels, which have a path per Highway target; they also run on
# the SVE CPU below.
sve_tests=(
  //devices/cpu:elementwise_simd_test
  //devices/cpu:ops_spec_test
)
# --ci: those, the mask repacking they use, the C API against an
# in-process server, and the opserver binary started by a test.
ci_tests=(
  //devices/cpu:element_io_test
  "${sve_tests[@]}"
  //tests:client_capi_test
  //tests:capi_runtime_test
  //tests:opserver_binary_test
)
# ops_spec_test's multi-million-element launches test the thread split and
# the streaming threshold, code with no per-target path that the amd64
# tests cover; under emulation they take most of its time (over 15 min on
# SVE, near that on NEON under load), so they run in the NEON pass only,
# and not at all with --ci.
big=-EveryDType.AboveTheParallelAndStreamingThresholds
neon_filter=()
case "$set_name" in
  all)
    mapfile -t tests < <(bazel query --noshow_progress \
      'tests(//...) except kind(py_test, tests(//...)) except //tests:package_test' 2>/dev/null)
    ;;
  ci)
    tests=("${ci_tests[@]}")
    neon_filter=("--test_filter=$big")
    ;;
  *) tests=("${kernel_tests[@]}" "${e2e_tests[@]}") ;;
esac

# Emulation is several times slower than the host: the test size's timeout
# is tripled (short 180 s ... eternal 3 h) rather than each test resized.
common=(
  --config=aarch64
  --test_timeout=180,900,2700,10800
  "--test_env=QEMU_LD_PREFIX=$sysroot"
)
status=0
bazel test "${common[@]}" --test_env=QEMU_CPU=neoverse-n1 \
  --test_env=OPSERVER_EXPECT_SIMD_TARGETS=NEON ${neon_filter[@]+"${neon_filter[@]}"} \
  "$@" "${tests[@]}" || status=1
bazel test "${common[@]}" --test_env=QEMU_CPU=max,sve-default-vector-length=256 \
  --test_env=OPSERVER_EXPECT_SIMD_TARGETS=SVE2,SVE,NEON "--test_filter=$big" \
  "$@" "${sve_tests[@]}" || status=1

# Tests that skipped a check here say so in their logs; list them, so that
# nothing is left out unseen (memory_pool_test's residency check: qemu-user
# ignores madvise).
testlogs=$(bazel info --config=aarch64 bazel-testlogs 2>/dev/null)
grep -rH -A1 ': Skipped$' --include=test.log "$testlogs" 2>/dev/null |
  sed "s|^$testlogs/||" >&2 || true
exit "$status"
