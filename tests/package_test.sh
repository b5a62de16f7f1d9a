#!/usr/bin/env bash
# The release as a user gets it: scripts/make_debs.sh builds the three
# Debian packages from this build's files, they are unpacked into a scratch
# root (dpkg -x: the files a `dpkg -i` would install), and the server, opctl,
# a C program built with pkg-config and a Python call run from that root
# only. Then `pip install ./python` into a scratch directory, and the
# systemd unit's drain against its stop time-out.
#
#   package_test.sh   (Bazel runs it from the runfiles root)
set -euo pipefail
src=$PWD
tmp=${TEST_TMPDIR:-$(mktemp -d)}
root="$tmp/root"
rm -rf "$tmp/debs" "$root" "$tmp/pip"
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. The packages, their metadata and their files.
"$src/scripts/make_debs.sh" "$src" "$src" "$tmp/debs" > "$tmp/debs.txt"
mapfile -t debs < "$tmp/debs.txt"
((${#debs[@]} == 3)) || fail "expected 3 packages, got: ${debs[*]}"
version=$(sed -n 's/.*kRelease\[\] = "\(.*\)";/\1/p' common/version.h)
for name in opserver libaclnn-remote python3-opserver; do
  deb=$(grep "/${name}_" "$tmp/debs.txt") || fail "no $name package"
  [[ $(dpkg-deb -f "$deb" Package) == "$name" ]] || fail "$deb: Package"
  [[ $(dpkg-deb -f "$deb" Version) == "$version" ]] || fail "$deb: Version"
  grep -q "libc6" <<< "$(dpkg-deb -f "$deb" Depends)" ||
    fail "$deb: Depends lacks the shared libraries' packages"
  dpkg -x "$deb" "$root"
done
grep -q "libgrpc++" <<< "$(dpkg-deb -f "$tmp/debs/opserver_${version}_"*.deb Depends)" ||
  fail "opserver does not depend on gRPC's package"
for f in usr/bin/opserver usr/bin/opctl usr/lib/libaclnn_remote.so \
         usr/include/acl/acl.h usr/include/aclnnop/aclnn_threshold_backward.h \
         usr/lib/pkgconfig/aclnn_remote.pc \
         usr/lib/python3/dist-packages/opserver/__init__.py \
         usr/lib/python3/dist-packages/opserver/torch/nn.py \
         usr/lib/python3/dist-packages/opserver/_opserver.so \
         lib/systemd/system/opserver.service etc/opserver/opserver.conf; do
  [[ -f "$root/$f" ]] || fail "$f is not in any package"
done
grep -qx /etc/opserver/opserver.conf <<< \
  "$(dpkg-deb -I "$tmp/debs/opserver_${version}_"*.deb conffiles)" || fail "opserver.conf is no conffile"

# An --config=asan build links the sanitizer runtimes: programs built
# against the library need the same flags, and python3 preloads them.
asan_libs=$(ldd "$root/usr/lib/libaclnn_remote.so" |
  sed -n 's/.*=> \(\S*lib\(asan\|ubsan\)\.so\S*\).*/\1/p' | paste -sd' ')
sanitize=()
[[ -n $asan_libs ]] && sanitize=(-fsanitize=address,undefined)

# 2. The server from the root, on a free port.
"$root/usr/bin/opserver" --listen=127.0.0.1:0 > "$tmp/server.out" \
  2> "$tmp/server.err" &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
address=
for _ in $(seq 600); do
  address=$(sed -n 's/^listening on \(127\.0\.0\.1:[0-9]*\)$/\1/p' "$tmp/server.out")
  [[ -n $address ]] && break
  kill -0 $server 2>/dev/null || fail "opserver exited: $(cat "$tmp/server.err")"
  sleep 0.1
done
[[ -n $address ]] || fail "opserver printed no address"
grep -q "cpu" <<< "$("$root/usr/bin/opctl" --server="$address" info)" ||
  fail "opctl info from the package"

# 3. A C program built with the package's pkg-config file, run without
# LD_LIBRARY_PATH (the .pc file's rpath finds the library).
export PKG_CONFIG_PATH="$root/usr/lib/pkgconfig"
read -r -a flags <<< "$(pkg-config --cflags --libs aclnn_remote)"
g++ "${sanitize[@]}" examples/threshold_backward.cpp "${flags[@]}" \
  -o "$tmp/threshold_backward"
grep -qF "$root/usr/lib/pkgconfig/../../lib/libaclnn_remote.so" <<< \
  "$(ldd "$tmp/threshold_backward")" ||
  fail "the program does not load the packaged library: $(ldd "$tmp/threshold_backward")"
OPSERVER_ADDRESS=$address "$tmp/threshold_backward" > "$tmp/c.out"
grep -q "result\[1\] is: 4.400000" "$tmp/c.out" || fail "C sample: $(cat "$tmp/c.out")"

# 4. Python from the packaged directory alone.
py_check() {
  LD_PRELOAD="$asan_libs" PYTHONPATH="$1" /usr/bin/python3 -I -c '
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, opserver
assert opserver.__file__.startswith(sys.argv[1]), opserver.__file__
with opserver.connect(sys.argv[2]).session("package") as s:
    out = s.threshold_backward(np.array([4.5, 4.4], np.float32),
                               np.array([0.2, 1.2], np.float32), 1.0)
assert list(out) == [0.0, np.float32(4.4)], out
print("ok")' "$1" "$address"
}
[[ $(py_check "$root/usr/lib/python3/dist-packages") == ok ]] ||
  fail "python from the package"

# 5. pip install of the source tree's python/ (extension prebuilt: a test
# cannot run Bazel), with Debian's pip and setuptools, no index.
cp -rL python "$tmp/python-src"
rm -rf "$tmp/python-src/tests" "$tmp/python-src/opserver/_opserver.so"
OPSERVER_EXTENSION="$src/python/opserver/_opserver.so" \
OPSERVER_VERSION=$version \
  /usr/bin/python3 -m pip install --quiet --no-cache-dir --no-build-isolation --no-deps \
  --no-index --target "$tmp/pip" "$tmp/python-src" > "$tmp/pip.log" 2>&1 ||
  fail "pip install: $(cat "$tmp/pip.log")"
[[ $(py_check "$tmp/pip") == ok ]] || fail "python from pip install"
[[ -d "$tmp/pip/opserver-$version.dist-info" ]] ||
  fail "pip installed no opserver-$version metadata: $(ls "$tmp/pip")"

# 6. The unit: its drain and grace fit in TimeoutStopSec, and every flag
# it passes exists in this server.
unit="$root/lib/systemd/system/opserver.service"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
drain=$(grep -o -- '--drain_s=[0-9]*' <<< "$exec_start" | cut -d= -f2)
grace_ms=$(grep -o -- '--shutdown_grace_ms=[0-9]*' <<< "$exec_start" | cut -d= -f2)
stop=$(sed -n 's/^TimeoutStopSec=//p' "$unit")
[[ -n $drain && -n $grace_ms && -n $stop ]] || fail "unit: drain, grace or stop missing"
((stop >= drain + (grace_ms + 999) / 1000 + 5)) ||
  fail "TimeoutStopSec=$stop does not cover --drain_s=$drain + grace ${grace_ms}ms"
"$root/usr/bin/opserver" --help > "$tmp/help.txt" 2>&1 || true
for flag in $(grep -o -- '--[a-z_]*' <<< "$exec_start$(grep -v '^#' "$root/etc/opserver/opserver.conf")"); do
  grep -q -- "$flag" "$tmp/help.txt" || fail "the unit or conf passes $flag, which opserver lacks"
done
grep -q '^User=opserver$' "$unit" || fail "the unit runs as another user"
grep -q 'adduser --system' "$src/deploy/debian/postinst" || fail "postinst makes no user"
echo PASS
