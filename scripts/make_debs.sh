#!/usr/bin/env bash
# Writes opserver's three Debian packages into OUTDIR from built files:
#
#   opserver          the server and opctl, a systemd unit (user opserver,
#                     a drain that TimeoutStopSec covers) and
#                     /etc/opserver/opserver.conf for flags and tokens
#   libaclnn-remote   the C API: libaclnn_remote.so, the CANN-compatible
#                     headers and aclnn_remote.pc
#   python3-opserver  the Python package, for Debian's python3
#
#   scripts/make_debs.sh SRC BIN OUTDIR
#
# SRC and BIN as for scripts/lay_out_prefix.sh. Builds nothing with Bazel:
# scripts/package.sh builds the release and calls this; the package test
# calls it on the files of the test's own build. Each package depends on the
# Debian packages that hold the shared libraries its binaries load.
set -euo pipefail
if (($# != 3)); then
  echo "usage: $0 SRC BIN OUTDIR" >&2
  exit 2
fi
src=$(readlink -f "$1") bin=$(readlink -f "$2") outdir=$3
mkdir -p "$outdir"
outdir=$(readlink -f "$outdir")
arch=${OPSERVER_DEB_ARCH:-$(dpkg --print-architecture)}
version=$(sed -n 's/.*kRelease\[\] = "\(.*\)";/\1/p' "$src/common/version.h")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$src/scripts/lay_out_prefix.sh" "$src" "$bin" "$work/all/usr"

# The Debian packages holding the shared libraries FILES load, as a
# Depends list ("libgrpc++1.51, libprotobuf32, ...").
shlib_depends() {
  local path candidates=()
  for path in $(ldd "$@" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p' |
                sort -u); do
    path=$(readlink -f "$path")
    # usrmerge: dpkg knows each file under /lib or under /usr/lib.
    candidates+=("$path" "/usr${path#/usr}" "${path#/usr}")
  done
  dpkg -S "${candidates[@]}" 2>/dev/null | sed 's/:.*//; s/, /\n/g' |
    sort -u | paste -sd, | sed 's/,/, /g'
}

# package NAME DEPENDS DESCRIPTION: builds $work/NAME into OUTDIR.
package() {
  local name=$1 depends=$2 description=$3 root="$work/$1"
  mkdir -p "$root/DEBIAN"
  cat > "$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: opserver developers <opserver@localhost>
Section: misc
Priority: optional
Depends: $depends
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Description: $description
CONTROL
  dpkg-deb --root-owner-group -Zgzip -z6 --build "$root" \
    "$outdir/${name}_${version}_${arch}.deb" >/dev/null
  echo "$outdir/${name}_${version}_${arch}.deb"
}

all="$work/all"
s="$work/opserver"
install -D -m 755 "$all/usr/bin/opserver" "$s/usr/bin/opserver"
install -D -m 755 "$all/usr/bin/opctl" "$s/usr/bin/opctl"
install -D -m 644 "$src/deploy/systemd/opserver.service" \
  "$s/lib/systemd/system/opserver.service"
install -D -m 640 "$src/deploy/systemd/opserver.conf" \
  "$s/etc/opserver/opserver.conf"
for doc in README.md docs/server-flags.md docs/operations.md; do
  install -D -m 644 "$src/$doc" "$s/usr/share/doc/opserver/$(basename "$doc")"
done
install -D -m 755 "$src/deploy/debian/postinst" "$s/DEBIAN/postinst"
install -D -m 755 "$src/deploy/debian/prerm" "$s/DEBIAN/prerm"
echo /etc/opserver/opserver.conf > "$s/DEBIAN/conffiles"
package opserver \
  "adduser, $(shlib_depends "$s/usr/bin/opserver" "$s/usr/bin/opctl")" \
  "aclnn backward operators served to remote training jobs
 opserver runs the backward passes of ThresholdBackward, SoftshrinkBackward,
 HardswishBackward, LeakyReluBackward and DropoutBackward on a device it
 owns, for training jobs on other machines, through a gRPC API shaped like
 Ascend's two-phase aclnn calls. Includes opctl, its command-line client."

c="$work/libaclnn-remote"
install -D -m 644 "$all/usr/lib/libaclnn_remote.so" "$c/usr/lib/libaclnn_remote.so"
cp -r "$all/usr/include" "$c/usr/include"
install -D -m 644 "$all/usr/lib/pkgconfig/aclnn_remote.pc" \
  "$c/usr/lib/pkgconfig/aclnn_remote.pc"
package libaclnn-remote "$(shlib_depends "$c/usr/lib/libaclnn_remote.so")" \
  "CANN-compatible aclnn and ACL runtime calls run on a remote opserver
 libaclnn_remote.so with the acl/, aclnn/ and aclnnop/ headers and a
 pkg-config file: a program written against CANN's aclnn API builds
 unchanged and runs its operators on the server OPSERVER_ADDRESS names."

p="$work/python3-opserver"
mkdir -p "$p/usr/lib/python3"
cp -r "$all/usr/lib/python3/dist-packages" "$p/usr/lib/python3/"
find "$p" -name __pycache__ -prune -exec rm -rf {} +
package python3-opserver "python3, python3-numpy, $(shlib_depends \
  "$p/usr/lib/python3/dist-packages/opserver/_opserver.so")" \
  "opserver's Python client, with numpy and torch conveniences
 Sessions, buffers and the five operators from Python; opserver.torch's
 modules run their backward passes on the server (python3-torch)."
