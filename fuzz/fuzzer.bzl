"""opserver_fuzzer: one fuzz target, its seed corpus and its smoke test.

    opserver_fuzzer(name = "values_fuzzer", srcs = [...], deps = [...])

makes
  :values_fuzzer             the binary: libFuzzer's main under
                             --config=fuzz (clang-14, ASan+UBSan), otherwise
                             fuzz/standalone_main.cc, which replays the files
                             it is given once each (gcc, --config=asan);
  :values_fuzzer_smoke_test  runs the binary over corpus/values_fuzzer/:
                             a few seconds of fuzzing under --config=fuzz,
                             a replay of the seeds otherwise.
"""

def opserver_fuzzer(name, srcs, deps = [], smoke_seconds = 5):
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:standalone_main"],
        }),
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    corpus = "corpus/" + name
    native.sh_test(
        name = name + "_smoke_test",
        size = "small",
        srcs = ["fuzz_smoke_test.sh"],
        args = [
            "$(rootpath :" + name + ")",
            native.package_name() + "/" + corpus,
            str(smoke_seconds),
        ],
        data = [":" + name] + native.glob([corpus + "/*"]),
    )
