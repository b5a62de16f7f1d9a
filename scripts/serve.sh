#!/usr/bin/env bash
# Installs what is missing, builds the server optimized and runs it on
# loopback with the CPU device. Extra arguments are opserver flags, e.g.
# scripts/serve.sh --listen=127.0.0.1:0 --threads=2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
bazel build -c opt //server:opserver //client:opctl
exec bazel-bin/server/opserver --listen=127.0.0.1:50051 --device=cpu "$@"
