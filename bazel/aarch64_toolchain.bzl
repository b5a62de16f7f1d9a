"""aarch64_toolchain: Bazel's autoconfigured C++ toolchain, cross-compiling
for aarch64 with Debian's g++-aarch64-linux-gnu.

`bazel build --config=aarch64` selects it with --crosstool_top, like the
clang toolchain of --config=fuzz, so the default toolchain never changes;
tools run during the build (protoc, grpc_cpp_plugin) stay the host's.

The arm64 builds of the libraries the project links come from a sysroot of
the project's own that scripts/arm64-sysroot.sh unpacks from Debian's
arm64 packages (never installed: the :arm64 -dev packages conflict with the
amd64 ones). This rule runs that script (it does nothing when the sysroot is
ready), then wraps the cross compiler so that it searches the sysroot's
headers before /usr/include (Debian's cross compiler also searches the
host's architecture-independent headers there, which are the amd64
packages') and links against the sysroot's libraries. The sysroot holds no
libc or libstdc++ headers: the cross toolchain's own are used. The autoconfiguration
runs the wrapper, so the sysroot's include directories become builtin ones.
Fetched only when a build uses it.
"""

load("@bazel_tools//tools/cpp:cc_configure.bzl", "cc_autoconf_impl")

_TRIPLE = "aarch64-linux-gnu"

# Each of the toolchain's tools, the cross binutils' one.
_TOOLS = ["ar", "cpp", "gcov", "ld", "nm", "objcopy", "objdump", "strip"]

def _aarch64_toolchain_impl(repository_ctx):
    compiler = repository_ctx.which(_TRIPLE + "-gcc")
    if compiler == None:
        fail("%s-gcc not found: scripts/install-deps.sh installs it" % _TRIPLE)
    workspace = repository_ctx.path(Label("@//:WORKSPACE")).dirname
    env = repository_ctx.os.environ
    sysroot = env.get("OPSERVER_ARM64_SYSROOT") or (
        env.get("HOME", "/root") + "/.cache/opserver-arm64-sysroot"
    )
    result = repository_ctx.execute(
        [str(workspace) + "/scripts/arm64-sysroot.sh", sysroot],
        timeout = 1800,
        quiet = False,
    )
    if result.return_code != 0:
        fail("scripts/arm64-sysroot.sh %s failed:\n%s" % (sysroot, result.stderr))
    lib = sysroot + "/usr/lib/" + _TRIPLE
    repository_ctx.file(
        "bin/" + _TRIPLE + "-gcc",
        "\n".join([
            "#!/bin/sh",
            "# The cross compiler with the arm64 sysroot of arm64-sysroot.sh.",
            "exec %s -isystem %s/usr/include/%s -isystem %s/usr/include \\" %
            (compiler, sysroot, _TRIPLE, sysroot),
            "  -L%s -Wl,-rpath-link,%s \"$@\"" % (lib, lib),
            "",
        ]),
        executable = True,
    )
    tools = {"gcc": str(repository_ctx.path("bin/" + _TRIPLE + "-gcc"))}
    for tool in _TOOLS:
        path = repository_ctx.which(_TRIPLE + "-" + tool)
        if path == None:
            fail("%s-%s not found: scripts/install-deps.sh installs it" % (_TRIPLE, tool))
        tools[tool] = str(path)
    cc_autoconf_impl(repository_ctx, overriden_tools = tools)

aarch64_toolchain = repository_rule(
    implementation = _aarch64_toolchain_impl,
    environ = ["OPSERVER_ARM64_SYSROOT", "HOME"],
    configure = True,
    local = True,
)
