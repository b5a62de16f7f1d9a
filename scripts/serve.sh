#!/usr/bin/env bash
# Installs what is missing, builds and installs opserver into out/
# (scripts/install.sh) and runs the installed server on loopback with the
# CPU device. Extra arguments are opserver flags, e.g.
# scripts/serve.sh --listen=127.0.0.1:0 --threads=2
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh out
exec out/bin/opserver --listen=127.0.0.1:50051 --device=cpu "$@"
