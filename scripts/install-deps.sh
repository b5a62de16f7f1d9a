#!/usr/bin/env bash
# Installs what opserver needs to build, test and benchmark, from Debian's
# archive and the npm registry only. Idempotent: prints nothing and changes
# nothing when everything is already present.
#
#   scripts/install-deps.sh          build + test dependencies
#   scripts/install-deps.sh --bench  the same (kept for older commands)
#   scripts/install-deps.sh PACKAGE...  also these Debian packages
set -euo pipefail

packages=(
  bazel-bootstrap        # Bazel 4.2.3, the build system
  g++                    # compiler
  libgrpc++-dev          # gRPC C++ (server, client, reflection)
  protobuf-compiler-grpc # grpc_cpp_plugin for the generated stubs
  libprotobuf-dev protobuf-compiler
  libabsl-dev            # Abseil: Status, flags, strings, synchronization
  libgtest-dev libgmock-dev  # GoogleTest / GoogleMock
  libbenchmark-dev       # Google Benchmark
  libhwy-dev             # Google Highway: SIMD kernels with runtime dispatch
  grpc-proto             # grpc/health/v1/health.proto, compiled for reflection
  python3-numpy          # .npy handling in tests/scripts; the Python package
  python3-dev pybind11-dev  # the Python package's C++ extension
  python3-torch          # opserver.torch, its tests, and the benchmarks' peer
  prometheus-cpp-dev     # the server's /metrics (--metrics_listen)
  python3-prometheus-client python3-grpcio  # metrics_test: parser, raw calls
  python3-yaml           # prometheus_config_test: parses docs/prometheus.yml
  openssl                # tests generate TLS certificates at run time
  clang-14               # the fuzz configuration's compiler (libFuzzer)
  libclang-rt-14-dev     # libFuzzer + ASan/UBSan runtimes for clang-14
  pkgconf                # the C API's aclnn_remote.pc (package_test)
  python3-pip python3-setuptools python3-wheel  # `pip install ./python`
  haproxy                # tests/haproxy_test: deploy/haproxy in front of two servers
  etcd-server etcd-client  # tests/etcd_pool_test, etcd_tls_test: the pool's etcd (docs/pool.md)
  yamllint               # tests/kubernetes_manifests_test: deploy/kubernetes/
)
# A script with needs of its own names them (scripts/test-arm64.sh: the
# cross compiler and qemu-user), so the README's commands do not install
# what only it uses.
for arg in "$@"; do
  [[ "$arg" == --bench ]] || packages+=("$arg")
done

missing=()
# Node.js + npm run buf (the reflection client the tests use). Some images
# ship Node.js from elsewhere with npm inside; only install Debian's when
# there is none.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# buf (npm @bufbuild/buf) is a reflection client like grpcurl; the tests use
# `buf curl` to list, describe and call the server the way a person would.
# It goes to a system path, like the packages above, not under $HOME: tests
# run with HOME=$TEST_TMPDIR and must find it all the same
# (tests/reflection_test.sh names the same path).
tools="${OPSERVER_TOOLS:-/opt/opserver/tools}"
buf_version="1.75.0"
if [[ ! -x "$tools/node_modules/.bin/buf" ]] ||
   ! "$tools/node_modules/.bin/buf" --version 2>/dev/null | grep -qx "$buf_version"; then
  echo "install-deps: installing @bufbuild/buf@$buf_version into $tools" >&2
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo mkdir -p "$tools"
  # npm's own cache goes to a throwaway directory: nothing of this install
  # is left under $HOME.
  npm_cache=$(mktemp -d)
  $sudo npm install --silent --no-audit --no-fund --cache "$npm_cache" \
    --prefix "$tools" "@bufbuild/buf@$buf_version" >/dev/null
  $sudo rm -rf "$npm_cache"
fi

# One directory to put on PATH for the docs' commands: `buf`, and `grpcurl`
# (scripts/grpcurl: grpcurl's command line over `buf curl`, since grpcurl
# is not packaged for Debian 12). Copied, not linked, so a moved checkout
# leaves it working; rewritten only when it differs.
wrapper="$(dirname "$(readlink -f "$0")")/grpcurl"
if [[ "$(readlink "$tools/bin/buf" 2>/dev/null)" != "../node_modules/.bin/buf" ]] ||
   ! cmp -s "$wrapper" "$tools/bin/grpcurl"; then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo mkdir -p "$tools/bin"
  $sudo ln -sfn ../node_modules/.bin/buf "$tools/bin/buf"
  $sudo install -m 755 "$wrapper" "$tools/bin/grpcurl"
fi
