#!/usr/bin/python3
"""The kernel benchmark's cases in PyTorch (Debian's python3-torch), for the
ratio in BENCHMARKS.md. Prints one line per case PyTorch runs:

  <op>/<dtype>/n:<n>/threads:<t> <GB/s>

with the same logical byte count as bench/kernels_bench (grad + self + out;
dropout's mask counted as n/8 bytes, though PyTorch reads a bool per
element). Cases PyTorch does not implement on CPU are printed as
"not implemented". Run:  /usr/bin/python3 bench/torch_kernels_bench.py
"""
import sys
import time

import torch

SIZES = [4 << 10, 256 << 10, 16 << 20, 64 << 20]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}


def median_seconds(fn, min_time=0.3, reps=5):
    fn()  # Warm up (and first-touch the outputs).
    times = []
    for _ in range(reps):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed > min_time / reps:
                break
        times.append(elapsed / n)
    times.sort()
    return times[len(times) // 2]


def cases(n, dtype):
    g = torch.rand(n, dtype=torch.float32).to(dtype) * 10 - 5
    s = torch.rand(n, dtype=torch.float32).to(dtype) * 8 - 4
    out = torch.empty_like(g)
    mask = torch.rand(n) > 0.3
    size = g.element_size()
    full = 3 * n * size
    return {
        # threshold_backward has an out= variant (no allocation per call).
        "Threshold": (lambda: torch.ops.aten.threshold_backward.grad_input(
            g, s, 0.0, grad_input=out), full),
        "Softshrink": (lambda: torch.ops.aten.softshrink_backward.grad_input(
            g, s, 0.5, grad_input=out), full),
        "Hardswish": (lambda: torch.ops.aten.hardswish_backward(g, s), full),
        "LeakyRelu": (lambda: torch.ops.aten.leaky_relu_backward.grad_input(
            g, s, 0.01, False, grad_input=out), full),
        "Dropout": (lambda: torch.ops.aten.native_dropout_backward(
            g, mask, 2.0), 2 * n * size + n // 8),
    }


def main():
    filters = sys.argv[1:]
    for threads in [1, 2]:
        torch.set_num_threads(threads)
        for dname, dtype in DTYPES.items():
            for n in SIZES:
                for op, (fn, nbytes) in cases(n, dtype).items():
                    name = f"{op}/{dname}/n:{n}/threads:{threads}"
                    if filters and not any(f in name for f in filters):
                        continue
                    try:
                        seconds = median_seconds(fn)
                    except RuntimeError:
                        print(f"{name} not implemented", flush=True)
                        continue
                    print(f"{name} {nbytes / seconds / 1e9:.2f}", flush=True)


if __name__ == "__main__":
    main()
