#!/usr/bin/env bash
# The example programs against a live opserver: each prints the numbers the
# spec's worked examples give. Then the same sources are compiled outside
# Bazel with the flags aclnn_remote.pc gives in README.md and docs/c-api.md,
# spelled out (g++ prog.cpp -I<include> -L<dir> -laclnn_remote), and must
# print the same.
set -uo pipefail
opserver="$1"
library="$2"
acl_h="$3"
cpp_client="$4"
shift 4
examples=("$@")
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

source tests/server_lib.sh
trap stop_opserver EXIT
start_opserver "$tmp/server.out" "$tmp/server.err" "$opserver" --threads=2 || exit 1
export OPSERVER_ADDRESS="127.0.0.1:$port"

expected() {
  case "$1" in
    threshold_backward) echo "0.000000 4.400000 4.300000 4.200000" ;;
    softshrink_backward) echo "0.000000 2.000000 0.000000 4.000000" ;;
    hardswish_backward) echo "0.000000 -1.000000 1.000000 3.000000" ;;
    leaky_relu_backward) echo "0.010000 0.020000 3.000000 4.000000" ;;
    dropout_backward) echo "0.000000 2.000000 0.000000 6.000000 0.000000 10.000000 0.000000 0.000000" ;;
  esac
}

# Runs one program; checks exit status and the result lines.
check() {
  local name=$1 program=$2
  "$program" >"$tmp/$name.out" 2>&1
  local rc=$?
  [[ $rc -eq 0 ]] || { fail "$program exited $rc: $(cat "$tmp/$name.out")"; return; }
  local got
  got=$(sed -n 's/^result\[[0-9]*\] is: \(.*\)$/\1/p' "$tmp/$name.out" | tr '\n' ' ' | sed 's/ $//')
  [[ "$got" == "$(expected "$name")" ]] || fail "$name printed '$got', want '$(expected "$name")'"
}

for program in "${examples[@]}"; do
  check "$(basename "$program")" "$program"
done
# A failing call prints aclGetRecentErrMsg(), not only the code: here a
# port nothing listens on (bound to port 0, then closed).
closed=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print("127.0.0.1:%d" % s.getsockname()[1])')
OPSERVER_ADDRESS="$closed" "${examples[0]}" >"$tmp/refused.out" 2>&1
grep -qF "cannot reach opserver at $closed: connection refused" "$tmp/refused.out" ||
  fail "an example against $closed printed: $(cat "$tmp/refused.out")"

# The C++ client example takes the address as its argument.
"$cpp_client" "$OPSERVER_ADDRESS" >"$tmp/cpp.out" 2>&1 || fail "cpp_client: $(cat "$tmp/cpp.out")"
got=$(sed -n 's/^result\[[0-9]*\] is: \(.*\)$/\1/p' "$tmp/cpp.out" | tr '\n' ' ' | sed 's/ $//')
[[ "$got" == "$(expected threshold_backward)" ]] || fail "cpp_client printed '$got'"

# Outside Bazel: the command of docs/c-api.md. An ASan build of the library needs the
# program built with the same sanitizers.
include_dir=$(cd "$(dirname "$acl_h")/.." && pwd)
lib_dir=$(cd "$(dirname "$library")" && pwd)
sanitize=()
# (grep without -q reads all of readelf's output: with pipefail, -q could
# exit first and fail the pipeline through readelf's SIGPIPE.)
if readelf -d "$library" | grep libasan >/dev/null; then
  sanitize=(-fsanitize=address,undefined)
fi
# The compiler is the one for the library's architecture: in the arm64
# build (--config=aarch64, run under qemu-user by scripts/test-arm64.sh) the
# host's g++ cannot link the arm64 library, so Debian's cross g++ compiles,
# finding the library's own dependencies in the arm64 sysroot that qemu
# runs the programs in (QEMU_LD_PREFIX).
cxx=(g++)
machine=$(readelf -h "$library" | sed -n 's/^ *Machine: *//p')
if [[ "$machine" == AArch64 && "$(uname -m)" != aarch64 ]]; then
  if [[ -z "${QEMU_LD_PREFIX:-}" ]]; then
    fail "an arm64 library on $(uname -m) without QEMU_LD_PREFIX (the arm64 sysroot): run scripts/test-arm64.sh"
    exit 1
  fi
  cxx=(aarch64-linux-gnu-g++ "-Wl,-rpath-link,$QEMU_LD_PREFIX/usr/lib/aarch64-linux-gnu"
    "-Wl,-rpath-link,$QEMU_LD_PREFIX/lib/aarch64-linux-gnu")
fi
here=$(dirname "${examples[0]}")
for program in "${examples[@]}"; do
  name=$(basename "$program")
  "${cxx[@]}" "${sanitize[@]}" "$here/$name.cpp" -I"$include_dir" -L"$lib_dir" -laclnn_remote \
    -o "$tmp/$name" 2>"$tmp/$name.gcc" || { fail "${cxx[0]} $name.cpp: $(cat "$tmp/$name.gcc")"; continue; }
  LD_LIBRARY_PATH="$lib_dir" check "$name" "$tmp/$name"
done

# The server must still be healthy and every session closed by the programs.
kill -0 $pid 2>/dev/null || fail "server died: $(cat "$tmp/server.err")"
[[ $failures -eq 0 ]] || exit 1
echo PASS
