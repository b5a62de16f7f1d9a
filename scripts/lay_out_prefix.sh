#!/usr/bin/env bash
# Lays out an opserver installation under PREFIX, the one layout that
# scripts/install.sh, the Debian packages (scripts/package.sh) and the tests
# share:
#
#   PREFIX/bin/opserver, PREFIX/bin/opctl
#   PREFIX/lib/libaclnn_remote.so          the C API
#   PREFIX/lib/pkgconfig/aclnn_remote.pc   relocatable (${pcfiledir})
#   PREFIX/include/{acl,aclnn,aclnnop}/    the CANN-compatible headers
#   PREFIX/lib/python3/dist-packages/opserver/   the Python package
#
# The Python directory is Debian's own for PREFIX=/usr, and what
# PYTHONPATH names for any other prefix.
#
#   scripts/lay_out_prefix.sh SRC BIN PREFIX
#
# SRC is the source tree, BIN where Bazel put the built files (a bazel-bin
# directory, or a test's runfiles, which hold both). Copies only: nothing is
# built here. Files already in PREFIX are replaced.
set -euo pipefail
if (($# != 3)); then
  echo "usage: $0 SRC BIN PREFIX" >&2
  exit 2
fi
src=$1 bin=$2 prefix=$3
python_dir="$prefix/lib/python3/dist-packages"

for f in server/opserver client/opctl client/libaclnn_remote.so \
         python/opserver/_opserver.so; do
  if [[ ! -f "$bin/$f" ]]; then
    echo "lay_out_prefix: $bin/$f is missing (build it first)" >&2
    exit 1
  fi
done

install -d "$prefix/bin" "$prefix/lib/pkgconfig" "$prefix/include" \
  "$python_dir/opserver"
install -m 755 "$bin/server/opserver" "$bin/client/opctl" "$prefix/bin/"
install -m 644 "$bin/client/libaclnn_remote.so" "$prefix/lib/"

(cd "$src/include" && find . -name '*.h' | sort) | while read -r h; do
  install -D -m 644 "$src/include/$h" "$prefix/include/$h"
done

(cd "$src/python" && find opserver -name '*.py' | sort) | while read -r p; do
  install -D -m 644 "$src/python/$p" "$python_dir/$p"
done
install -m 644 "$bin/python/opserver/_opserver.so" "$python_dir/opserver/"

version=$(sed -n 's/.*kRelease\[\] = "\(.*\)";/\1/p' "$src/common/version.h")
cat > "$prefix/lib/pkgconfig/aclnn_remote.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: aclnn_remote
Description: CANN-compatible aclnn and ACL runtime calls that run on a remote opserver
Version: $version
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -laclnn_remote
Cflags: -I\${includedir}
PC
