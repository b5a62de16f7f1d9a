#!/usr/bin/python3
"""Writes devices/cpu/testdata/torch_reference.txt: PyTorch's outputs for the
backward operators, as independent reference data for the kernel tests.

Run with Debian's python3-torch (scripts/install-deps.sh installs
it):  /usr/bin/python3 scripts/gen_torch_refs.py

Only cases where PyTorch implements the op with the spec's semantics are
written (see docs/operators.md):
- threshold_backward, leaky_relu_backward: same semantics, NaN handling
  included; float32 and whichever 16-bit dtypes
  PyTorch 1.13 implements on CPU (tried, skipped if not implemented).
- softshrink_backward: same except NaN self, where PyTorch's vectorized
  kernel gives 0 and the spec (Ascend's kernel) passes the gradient; NaN is
  left out of its inputs (kernels/ops_spec_test checks the spec there).
- hardswish_backward: same except at x = +-3, where PyTorch 1.13 uses the
  open interval (d(-3) = 0, d(3) = 1) and the spec the closed one from the
  seed formula (d(-3) = -0.5, d(3) = 1.5), and NaN self, which PyTorch turns
  into NaN and the spec into gradOutput; those inputs are left out.
- native_dropout_backward: PyTorch multiplies (grad * mask * scale), so a
  dropped NaN/Inf gradient gives NaN where the spec (a select) gives 0; only
  finite gradients are written, and its bool mask is packed LSB-first into
  the spec's align(numel, 128) / 8 bytes. For FLOAT16/BF16 PyTorch rounds
  the scale to the tensor's dtype before multiplying, while the spec computes
  in fp32 with the scale as given, so 16-bit cases use scales exact in every
  dtype (2 and 0).
Every value is printed with repr() of a Python float, which is exact for
the float32/bfloat16/float16 values involved.

Format, one case per block:
  case <op> <dtype> <param> <n>
  grad <n values>
  self <n values>          (dropout: mask <bytes>)
  out <n values>
"""
import math
import os

import torch

OUT = os.path.join(os.path.dirname(__file__), "..", "devices", "cpu", "testdata",
                   "torch_reference.txt")
SIZES = [1, 15, 16, 17, 33, 257]
DTYPES = {"FLOAT": torch.float32, "FLOAT16": torch.float16,
          "BFLOAT16": torch.bfloat16}


def values(t):
    return " ".join(repr(float(v)) for v in t.to(torch.float64).tolist())


def inputs(n, dtype, seed, specials):
    g = torch.Generator().manual_seed(seed)
    grad = (torch.rand(n, generator=g, dtype=torch.float64) * 10 - 5)
    self = (torch.rand(n, generator=g, dtype=torch.float64) * 8 - 4)
    for i in range(0, n, 5):
        self[i] = specials[(i // 5) % len(specials)]
    return grad.to(dtype), self.to(dtype)


def main():
    blocks = []
    nan, inf = math.nan, math.inf
    ops = [
        ("ThresholdBackward", [0.5, -1.0],
         lambda g, s, p: torch.ops.aten.threshold_backward(g, s, p),
         [0.5, -1.0, 0.0, nan, inf, -inf]),
        ("SoftshrinkBackward", [0.5, 0.0],
         lambda g, s, p: torch.ops.aten.softshrink_backward(g, s, p),
         [0.5, -0.5, 0.0, inf, -inf]),  # No NaN: see the docstring.
        ("HardswishBackward", [0.0],
         lambda g, s, p: torch.ops.aten.hardswish_backward(g, s),
         # Near +-3 but not on it, in every dtype (bf16 rounds 2.999 to 3).
         [-2.96875, 2.96875, 0.0, inf, -inf, 3.03125, -3.03125]),
        ("LeakyReluBackward", [0.01, 0.2],
         lambda g, s, p: torch.ops.aten.leaky_relu_backward(g, s, p, False),
         [0.0, -0.0, nan, inf, -inf]),
    ]
    seed = 0
    for name, params, fn, specials in ops:
        for dname, dtype in DTYPES.items():
            for p in params:
                for n in SIZES:
                    seed += 1
                    grad, self = inputs(n, dtype, seed, specials)
                    if name == "HardswishBackward":
                        # Random values can round onto +-3 in 16 bits.
                        self = torch.where(self.abs() == 3, self * 0.98958333,
                                           self).to(dtype)
                    try:
                        out = fn(grad, self, p)
                    except RuntimeError:
                        continue  # Not implemented on CPU for this dtype.
                    blocks.append(f"case {name} {dname} {p!r} {n}\n"
                                  f"grad {values(grad)}\n"
                                  f"self {values(self)}\n"
                                  f"out {values(out)}\n")
    for dname, dtype in DTYPES.items():
        scales = [2.0, 1.0 / (1.0 - 0.3), 0.0] if dname == "FLOAT" else [2.0, 0.0]
        for scale in scales:
            for n in SIZES + [129]:
                seed += 1
                g = torch.Generator().manual_seed(seed)
                grad = (torch.rand(n, generator=g) * 10 - 5).to(dtype)
                mask = torch.rand(n, generator=g) > 0.4
                try:
                    out = torch.ops.aten.native_dropout_backward(
                        grad, mask, scale)
                except RuntimeError:
                    continue
                packed = [0] * ((n + 127) // 128 * 16)
                for i, kept in enumerate(mask.tolist()):
                    if kept:
                        packed[i // 8] |= 1 << (i % 8)
                blocks.append(f"case DropoutBackward {dname} {scale!r} {n}\n"
                              f"grad {values(grad)}\n"
                              f"mask {' '.join(map(str, packed))}\n"
                              f"out {values(out)}\n")
    with open(OUT, "w") as f:
        f.write(f"# Generated by scripts/gen_torch_refs.py with PyTorch "
                f"{torch.__version__}; do not edit.\n")
        f.writelines(blocks)
    print(f"wrote {len(blocks)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
