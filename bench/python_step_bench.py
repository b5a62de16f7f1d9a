"""Per-operator cost from Python against the C++ client, and one training
step with remote and local backward passes.

    bazel run -c opt //bench:python_step_bench

Starts the opserver binary (CPU device) on a free loopback port. Then, in
alternating rounds against that one server:

* the C++ client (bench/client_step): step_bench's 250 dependent operators
  on 4096-element fp32 tensors, the five in turn, one Synchronize;
* the same step from Python (opserver.Session's methods on resident
  DeviceTensors, results checked against numpy at the end).

Per round: the median step / 250 and the mean idle synchronize (the round
trip). Reported: the medians over rounds, the ratio Python / C++ (target
<= 1.5) and Python's round trips per operator (target <= 0.2).

Then the same 250 operators as opserver.torch modules in one autograd
graph (4096 fp32 elements): forward and backward per operator, and how
many times a backward waited (once: every gradient but the last stays on
the device).

Last, one SGD step of the 784-256-128-10 MLP of python/tests/testing.py
(batch 32), median of --steps, with opserver.torch.nn's modules (backward
on the server) issued eagerly and replayed from an opserver.torch.Graph,
and with torch.nn's, one step of each in turn: wall time and this
process's CPU time. On loopback with a CPU device remote cannot win. Its extra cost is one wait per remote gradient
torch needs (here two a step), not a round trip per transfer.
`--mlp_only` runs only this part:

    bazel run -c opt //bench:python_step_bench -- --mlp_only --steps=200
"""

import argparse
import contextlib
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import opserver
import opserver.torch as ot
import testing  # python/tests/testing.py

OPS = 250
N = 4096


def python_step_round(session, steps):
    rng = np.random.default_rng(0)
    self_host = rng.uniform(-4, 4, N).astype(np.float32)
    x = session.to_device(self_host)
    mask = session.to_device(np.full(N // 8, 0xFF, np.uint8))
    bufs = [session.empty([N], opserver.DType.FLOAT) for _ in range(2)]
    session.upload(bufs[0].buffer, np.ones(N, np.float32))
    calls = [
        lambda g, o: session.threshold_backward(g, x, -3.875, out=o),
        lambda g, o: session.softshrink_backward(g, x, 0.0625, out=o),
        lambda g, o: session.hardswish_backward(g, x, out=o),
        lambda g, o: session.leaky_relu_backward(g, x, 0.5, False, out=o),
        lambda g, o: session.dropout_backward(g, mask, 1.0, out=o),
    ]

    def step():
        for i in range(OPS):
            calls[i % 5](bufs[i % 2], bufs[(i + 1) % 2])
        session.synchronize()

    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    rtts = []
    for _ in range(200):
        start = time.perf_counter()
        session.synchronize()
        rtts.append(time.perf_counter() - start)
    # One more step from a known gradient, checked bit for bit.
    session.upload(bufs[0].buffer, np.ones(N, np.float32))
    step()
    return statistics.median(times) / OPS * 1e6, statistics.mean(rtts) * 1e6, \
        np.array_equal(bufs[0].numpy(), host_chain(self_host))


def host_chain(x):
    """The step's 250 operators in numpy, fp32, from a gradient of ones
    (250 is even: the step ends in the buffer it started from)."""
    f = np.float32
    g = np.ones(N, f)
    for i in range(OPS):
        k = i % 5
        if k == 0:
            g = np.where(x <= f(-3.875), f(0), g)
        elif k == 1:
            g = np.where(np.abs(x) <= f(0.0625), f(0), g)
        elif k == 2:
            g = g * np.where(x < -3, f(0), np.where(x <= 3, x / f(3) + f(0.5),
                                                    f(1)))
        elif k == 3:
            g = np.where(x > 0, g, g * f(0.5))
    return g


def autograd_chain_us(session, steps):
    """250 opserver.torch modules in a row on 4096 fp32 elements: the
    median backward (and forward) per operator, and waits per backward."""
    modules = [ot.nn.LeakyReLU(0.5, session=session),
               ot.nn.Hardswish(session=session),
               ot.nn.Softshrink(0.0625, session=session),
               ot.nn.Threshold(-3.875, 0.0, session=session)]
    chain = [modules[i % 4] for i in range(OPS)]
    x0 = torch.rand(N, generator=torch.Generator().manual_seed(0)) * 8 - 4
    grad = torch.ones(N)
    forward, backward, waits = [], [], []
    for i in range(steps + 3):
        x = x0.clone().requires_grad_()
        start = time.perf_counter()
        y = x * 1
        for module in chain:
            y = module(y)
        middle = time.perf_counter()
        before = ot.stats()["waits"]
        y.backward(grad)
        end = time.perf_counter()
        if i >= 3:
            forward.append(middle - start)
            backward.append(end - middle)
            waits.append(ot.stats()["waits"] - before)
    return (statistics.median(forward) / OPS * 1e6,
            statistics.median(backward) / OPS * 1e6, max(waits))


class MlpSteps:
    """The MLP's SGD steps in one mode: "local" (torch.nn), "eager"
    (opserver.torch modules) or "replay" (the same, inside an
    opserver.torch.Graph whose first step captured the remote backward).
    Each step's wall and CPU time (this process, all threads), and the
    waits and replays it made, are kept."""

    def __init__(self, mode):
        self.model = testing.mlp(mode != "local")
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.x, self.label = torch.randn(32, 784), torch.randint(0, 10, (32,))
        self.graph = ot.Graph() if mode == "replay" else None
        self.wall, self.cpu, self.counts = [], [], None

    def step(self, record):
        before = ot.stats()
        wall, cpu = time.perf_counter(), time.process_time()
        self.optimizer.zero_grad()
        with self.graph.step() if self.graph else contextlib.nullcontext():
            torch.nn.functional.cross_entropy(
                self.model(self.x), self.label).backward()
        self.optimizer.step()
        if record:
            self.wall.append(time.perf_counter() - wall)
            self.cpu.append(time.process_time() - cpu)
            after = ot.stats()
            self.counts = (after["waits"] - before["waits"],
                           after["replays"] - before["replays"])

    def ms(self):
        return (statistics.median(self.wall) * 1e3,
                statistics.median(self.cpu) * 1e3)


def mlp_steps(session, steps):
    """The MLP step with remote backward, eager and replayed, and local:
    one step of each in turn (the order rotating), so that the load of a
    shared machine falls on all three alike; medians of `steps`."""
    modes = ("eager", "replay", "local")
    with ot.remote(session):
        runs = {mode: MlpSteps(mode) for mode in modes}
        for i in range(steps + 3):
            for k in range(3):
                runs[modes[(i + k) % 3]].step(record=i >= 3)
        runs["replay"].graph.destroy()
    (eager, eager_cpu), (replay, replay_cpu), (local, local_cpu) = (
        runs[mode].ms() for mode in modes)
    print("MLP 784-256-128-10, batch 32, one SGD step (median of %d; wall, "
          "and this process's CPU)" % steps)
    for name, mode, wall, cpu in (("eager", "eager", eager, eager_cpu),
                                  ("replayed", "replay", replay, replay_cpu)):
        waits, replays = runs[mode].counts
        print("  remote backward, %-8s %7.3f ms  cpu %7.3f ms   %d waits, "
              "%d replays a step" % (name, wall, cpu, waits, replays))
    print("  local                     %7.3f ms  cpu %7.3f ms" %
          (local, local_cpu))
    print("  replayed / eager: wall %.2fx, cpu %.2fx; remote cost over local: "
          "eager %.3f ms, replayed %.3f ms" %
          (replay / eager, replay_cpu / eager_cpu, eager - local,
           replay - local))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("opserver")
    parser.add_argument("client_step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--mlp_only", action="store_true",
                        help="only the MLP step, eager and replayed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with testing.Server(args.opserver) as server:
        client = opserver.connect(server.address)
        if args.mlp_only:
            with client.session("python_step_bench") as session:
                mlp_steps(session, args.steps)
            return
        cpp, py, rtts = [], [], []
        with client.session("python_step_bench") as session:
            for _ in range(args.rounds):
                line = subprocess.run(
                    [args.client_step, "--address=" + server.address,
                     "--steps=%d" % args.steps],
                    check=True, capture_output=True, text=True).stdout
                fields = dict(f.split("=") for f in line.split()[1:])
                cpp.append(float(fields["us_per_op"]))
                us, rtt, ok = python_step_round(session, args.steps)
                if not ok:
                    sys.exit("the step's result differs from the host's")
                py.append(us)
                rtts.append(rtt)
            cpp_us, py_us, rtt_us = (statistics.median(cpp),
                                     statistics.median(py),
                                     statistics.median(rtts))
            print("250-operator step, loopback, %d rounds x %d steps" %
                  (args.rounds, args.steps))
            print("  C++ client   %7.2f us/op" % cpp_us)
            print("  Python       %7.2f us/op   %.2fx C++ (target <= 1.5)" %
                  (py_us, py_us / cpp_us))
            print("  round trip   %7.1f us      Python: %.3f round trips/op "
                  "(target <= 0.2)" % (rtt_us, py_us / rtt_us))
            fwd_us, bwd_us, waits = autograd_chain_us(session, args.steps)
            print("250 opserver.torch modules in a row (autograd)")
            print("  forward  %7.2f us/op   backward %7.2f us/op = %.3f round "
                  "trips/op, %d wait per backward" %
                  (fwd_us, bwd_us, bwd_us / rtt_us, waits))
            mlp_steps(session, args.steps)


if __name__ == "__main__":
    testing.prepare(timeout_s=1800)
    main()
