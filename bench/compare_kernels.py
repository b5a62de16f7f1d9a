#!/usr/bin/python3
"""Prints the kernel ratios for BENCHMARKS.md from one run of each side:

  bazel run -c opt //bench:kernels_bench -- --benchmark_repetitions=3 \\
      --benchmark_report_aggregates_only=true > /tmp/ours.txt
  /usr/bin/python3 bench/torch_kernels_bench.py > /tmp/torch.txt
  /usr/bin/python3 bench/compare_kernels.py /tmp/ours.txt /tmp/torch.txt

For every operator x dtype x size x threads: our GB/s, the streaming-store
limit of the same size and thread count measured in the same kernels_bench
run, our/limit, PyTorch's GB/s and our/PyTorch (where PyTorch runs the op).
"""
import re
import sys


def parse_ours(path):
    rates = {}
    for line in open(path):
        m = re.match(r"BM_(\S+?)/real_time_median\s.*bytes_per_second=([\d.]+)([GMk])/s",
                     line)
        if m:
            scale = {"G": 1, "M": 1e-3, "k": 1e-6}[m.group(3)]
            rates[m.group(1)] = float(m.group(2)) * scale
    return rates


def parse_torch(path):
    rates = {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 2:
            rates[parts[0]] = float(parts[1])
    return rates


def main(ours_path, torch_path):
    ours, torch = parse_ours(ours_path), parse_torch(torch_path)
    print("| case | ours GB/s | limit GB/s | ours/limit | PyTorch GB/s | ours/PyTorch |")
    print("|---|---|---|---|---|---|")
    for name, rate in ours.items():
        if name.startswith("StreamLimit"):
            continue
        m = re.match(r"(\w+)/(\w+)/n:(\d+)/threads:(\d+)", name)
        if not m:
            continue
        op, dtype, n, threads = m.groups()
        limit = ours.get(f"StreamLimit/n:{n}/threads:{threads}")
        peer = torch.get(name)
        print(f"| {name} | {rate:.1f} | {limit:.1f} | {rate / limit:.2f} | "
              + (f"{peer:.2f} | {rate / peer:.1f}x |" if peer else "not implemented | |"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
