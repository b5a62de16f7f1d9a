"""Trains a small MLP whose activations' backward passes run on an
opserver: opserver.torch.nn's modules in place of torch.nn's.

    OPSERVER_ADDRESS=127.0.0.1:50051 bazel run //examples:train_mlp
    # or, with the package on PYTHONPATH:
    python3 examples/train_mlp.py --address=127.0.0.1:50051 --steps=200

The data are synthetic (ten Gaussian clusters in 784 dimensions), so the
script needs nothing but a server. It prints the loss every 10 steps and
exits non-zero if training did not lower it.
"""

import argparse
import os
import sys

import torch

import opserver
import opserver.torch as ot


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(784, 256), ot.nn.Hardswish(), ot.nn.Dropout(0.1),
        torch.nn.Linear(256, 128), ot.nn.LeakyReLU(0.05),
        torch.nn.Linear(128, 10))


def batches(steps, batch=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 784, generator=g) * 0.5
    for _ in range(steps):
        label = torch.randint(0, 10, (batch,), generator=g)
        yield centers[label] + torch.randn(batch, 784, generator=g), label


def train(address, steps, token=None, tls_ca_file=None):
    """Returns the first and the last loss."""
    client = opserver.connect(address, token=token, tls_ca_file=tls_ca_file)
    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    with client.session("train_mlp") as session, ot.remote(session):
        for step, (x, label) in enumerate(batches(steps)):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), label)
            loss.backward()  # Hardswish, Dropout, LeakyReLU: on the server
            optimizer.step()
            losses.append(loss.item())
            if step % 10 == 0 or step == steps - 1:
                print("step %4d  loss %.4f" % (step, loss.item()))
    return losses[0], losses[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address",
                        default=os.environ.get("OPSERVER_ADDRESS",
                                               "127.0.0.1:50051"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--token", default=None)
    parser.add_argument("--tls_ca_file", default=None)
    args = parser.parse_args()
    first, last = train(args.address, args.steps, args.token, args.tls_ca_file)
    if not last < first:
        sys.exit("the loss did not go down: %.4f -> %.4f" % (first, last))


if __name__ == "__main__":
    main()
