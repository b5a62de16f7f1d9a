#!/usr/bin/env bash
# Prepares the arm64 sysroot that `bazel build --config=aarch64` compiles and
# links against and that qemu-user runs the tests in (QEMU_LD_PREFIX): the
# arm64 builds of the libraries the project links (gRPC, Protobuf, Abseil,
# Highway, prometheus-cpp, GoogleTest, Benchmark) and their runtime closure
# down to libc, from Debian's archive, unpacked and never installed.
#
# Installing the :arm64 -dev packages system-wide is not possible beside the
# amd64 ones (prometheus-cpp-dev:arm64 would remove prometheus-cpp-dev), so
# apt runs here with a private state directory and arm64 as its only
# architecture: the system's dpkg and apt configuration are left untouched.
#
#   scripts/arm64-sysroot.sh [DIR]   (default: $OPSERVER_ARM64_SYSROOT, else
#                                     ~/.cache/opserver-arm64-sysroot)
#
# Idempotent: when DIR already holds the sysroot for this script's package
# list, it prints nothing and does nothing.
set -euo pipefail

root="${1:-${OPSERVER_ARM64_SYSROOT:-$HOME/.cache/opserver-arm64-sysroot}}"

# What the build links (third_party/system.BUILD), and the C and C++
# runtimes the emulated programs load (the cross toolchain links against its
# own copies, which qemu-user cannot find at run time).
packages=(
  libgrpc++-dev libprotobuf-dev libabsl-dev libgtest-dev libgmock-dev
  libbenchmark-dev libhwy-dev prometheus-cpp-dev libssl-dev zlib1g-dev
  libc-ares-dev libre2-dev libstdc++6 libgcc-s1 libc6
)
# A stamp naming the list: a changed list rebuilds the sysroot.
stamp_text="opserver arm64 sysroot v1: ${packages[*]}"
if [[ -f "$root/.complete" ]] && [[ "$(cat "$root/.complete")" == "$stamp_text" ]]; then
  exit 0
fi

echo "arm64-sysroot: preparing $root" >&2
for tool in apt-get apt-cache dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "arm64-sysroot: $tool missing" >&2; exit 1; }
done
rm -rf "$root"
mkdir -p "$(dirname "$root")"
work="$root.tmp"
rm -rf "$work"
mkdir -p "$work/apt/state/lists/partial" "$work/apt/cache/archives/partial" \
  "$work/debs" "$work/root"
touch "$work/apt/state/status"
apt_opts=(
  -o "APT::Architecture=arm64"
  -o "APT::Architectures::=arm64"
  -o "Dir::State=$work/apt/state"
  -o "Dir::State::status=$work/apt/state/status"
  -o "Dir::Cache=$work/apt/cache"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
  -o "APT::Get::List-Cleanup=0"
)
# The system's package sources (Debian's mirrors serve every architecture).
apt-get "${apt_opts[@]}" -qq update >/dev/null

# The packages and everything they depend on (recommends excluded), less
# what cannot be an arm64 library (architecture-independent data is kept:
# headers of some -dev packages are Architecture: all).
mapfile -t closure < <(
  apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends \
    "${packages[@]}" | grep -v '^ ' | grep -v '^<' | sed 's/:arm64$//' |
    sort -u)
# Left out: tools the closure pulls in that nothing links (their maintainer
# scripts never run, so nothing is lost), and libc's development files: the
# cross toolchain has its own, and libc6-dev's linker scripts (libc.so,
# libm.so) name absolute paths that would lead the linker to the host's
# libraries.
skip='^(debconf|perl-base|dpkg|tar|coreutils|bash|debianutils|sed|grep|gzip|diffutils|findutils|base-files|base-passwd|init-system-helpers|sensible-utils|passwd|login|util-linux|mount|adduser|libpam.*|gcc-12-base|dash|install-info|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt-dev|libnsl-dev|libtirpc-dev|rpcsvc-proto|pkgconf|pkgconf-bin|libpkgconf3)$'
mapfile -t wanted < <(printf '%s\n' "${closure[@]}" | grep -Ev "$skip")
(cd "$work/debs" && apt-get "${apt_opts[@]}" -qq download "${wanted[@]/%/:arm64}" >/dev/null 2>&1 ||
  apt-get "${apt_opts[@]}" -qq download "${wanted[@]/%/:arm64}")
for deb in "$work"/debs/*.deb; do
  dpkg-deb -x "$deb" "$work/root"
done

# Absolute symlinks (libfoo.so -> /lib/aarch64-linux-gnu/libfoo.so.1) would
# point into the host's amd64 tree: make them relative to the sysroot.
while IFS= read -r link; do
  target=$(readlink "$link")
  [[ "$target" == /* ]] || continue
  rel=$(realpath -m --relative-to="$(dirname "$link")" "$work/root$target")
  ln -sfn "$rel" "$link"
done < <(find "$work/root" -type l)

mv "$work/root" "$root"
ls "$work/debs" > "$root/.packages"
rm -rf "$work"
printf '%s' "$stamp_text" > "$root/.complete"
echo "arm64-sysroot: $(wc -l < "$root/.packages") packages in $root" >&2
