"""A file built with the sanitizer flags (--config=asan's) left out.

For a shared library a test loads with dlmopen into a link-map namespace of
its own (tests/ascend_chain_test.cc): dlmopen loads every dependency afresh
there, so an ASan-built library would start a second ASan runtime, which
aborts. Without sanitizer flags in the command line the file is the one
the normal build makes.
"""

def _is_sanitizer_flag(flag):
    return flag.startswith("-fsanitize") or flag.startswith("-fno-sanitize")

def _strip_sanitizers_impl(settings, attr):
    return {
        "//command_line_option:copt": [
            f
            for f in settings["//command_line_option:copt"]
            if not _is_sanitizer_flag(f)
        ],
        "//command_line_option:linkopt": [
            f
            for f in settings["//command_line_option:linkopt"]
            if not _is_sanitizer_flag(f)
        ],
    }

_strip_sanitizers = transition(
    implementation = _strip_sanitizers_impl,
    inputs = ["//command_line_option:copt", "//command_line_option:linkopt"],
    outputs = ["//command_line_option:copt", "//command_line_option:linkopt"],
)

def _without_sanitizers_impl(ctx):
    src = ctx.files.src[0]
    out = ctx.actions.declare_file(ctx.attr.name)
    ctx.actions.symlink(output = out, target_file = src)
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

without_sanitizers = rule(
    implementation = _without_sanitizers_impl,
    doc = "`src` (one file) built without -fsanitize/-fno-sanitize flags.",
    attrs = {
        "src": attr.label(
            allow_single_file = True,
            cfg = _strip_sanitizers,
            mandatory = True,
        ),
        "_allowlist_function_transition": attr.label(
            default = "@bazel_tools//tools/allowlists/function_transition_allowlist",
        ),
    },
)
