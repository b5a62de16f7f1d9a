"""clang_toolchain: Bazel's autoconfigured C++ toolchain, with clang-14.

`bazel build --config=fuzz` compiles with Debian's clang-14 (libFuzzer and
its sanitizers are clang's). Setting CC=clang-14 through --repo_env would
re-run the autoconfiguration of @local_config_cc on every switch between
configurations; this second repository holds the clang toolchain instead, so
the default toolchain (gcc) never changes and the fuzz configuration only
selects this one with --crosstool_top. Fetched only when a build uses it.
"""

load("@bazel_tools//tools/cpp:cc_configure.bzl", "cc_autoconf_impl")

def _clang_toolchain_impl(repository_ctx):
    cc = repository_ctx.which(repository_ctx.attr.compiler)
    if cc == None:
        fail("%s not found: scripts/install-deps.sh installs it" %
             repository_ctx.attr.compiler)
    cc_autoconf_impl(repository_ctx, overriden_tools = {"gcc": str(cc)})

clang_toolchain = repository_rule(
    implementation = _clang_toolchain_impl,
    attrs = {"compiler": attr.string(default = "clang-14")},
    configure = True,
    local = True,
)
