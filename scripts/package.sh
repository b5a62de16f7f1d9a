#!/usr/bin/env bash
# Builds the release (-c opt) and writes opserver's Debian packages into
# OUTDIR (default: out/debs): opserver, libaclnn-remote and
# python3-opserver (see scripts/make_debs.sh). Install them with
#   sudo apt-get install ./out/debs/*.deb
set -euo pipefail
cd "$(dirname "$0")/.."
outdir=${1:-out/debs}
scripts/install-deps.sh
targets=(//server:opserver //client:opctl //client:libaclnn_remote.so
         //python:opserver/_opserver.so)
bazel build -c opt "${targets[@]}"
scripts/make_debs.sh . "$(bazel info -c opt bazel-bin 2>/dev/null)" "$outdir"
