"""The five activations as torch.autograd Functions whose backward runs on an
opserver.

Each forward runs locally in torch, exactly as torch computes it, and keeps
what the backward needs (the input, the result or the dropout mask) resident
on the remote device: it is uploaded once, during the forward. The backward
sends only ``grad_output`` and gets the gradient back, computed by the
remote backward operator with aclnn's semantics.

    import opserver, opserver.torch
    client = opserver.connect("127.0.0.1:50051")
    with client.session("train") as s, opserver.torch.remote(s):
        y = opserver.torch.hardswish(x)   # or opserver.torch.nn.Hardswish()
        y.sum().backward()                # x.grad computed remotely

The session is passed explicitly (``session=``) or taken from the innermost
``with opserver.torch.remote(session):`` of the calling thread.

Where aclnn and torch define different results (both are aclnn's here):
DropoutBackward gives exactly 0 for a dropped element, where torch's
``grad * mask`` gives NaN for a NaN or infinite gradient and -0.0 for a
negative one. Everywhere else, fp32 gradients are torch's bit for bit.
"""

import contextlib
import threading

import numpy as np
import torch

import opserver

__all__ = ["remote", "current_session", "threshold", "softshrink",
           "hardswish", "leaky_relu", "dropout", "nn"]

_state = threading.local()


@contextlib.contextmanager
def remote(session):
    """Within the block, this thread's opserver functions and modules run
    their backward in `session` (an ``opserver.Session``)."""
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(session)
    try:
        yield session
    finally:
        stack.pop()


def current_session(session=None):
    """`session` if given, else the innermost ``remote`` block's session."""
    if session is not None:
        return session
    stack = getattr(_state, "stack", None)
    if not stack:
        raise RuntimeError("no opserver session: pass session=, or call "
                           "inside `with opserver.torch.remote(session):`")
    return stack[-1]


def _resident(session, tensor):
    """`tensor` uploaded for a later backward."""
    return session.to_device(tensor.detach().contiguous())


def _backward(session, operator, grad_output, *args):
    """Runs `operator` (a Session method) on the uploaded gradient and
    `args` (resident tensors and scalars); the gradient as a torch tensor."""
    grad = session.to_device(grad_output.contiguous())
    return operator(session, grad, *args).torch()


class ThresholdFunction(torch.autograd.Function):
    """torch.nn.functional.threshold; backward: ThresholdBackward."""

    @staticmethod
    def forward(ctx, x, threshold, value, inplace, session):
        session = current_session(session)
        ctx.session, ctx.threshold = session, float(threshold)
        ctx.x = _resident(session, x) if ctx.needs_input_grad[0] else None
        if inplace:
            torch.nn.functional.threshold(x, threshold, value, inplace=True)
            ctx.mark_dirty(x)
            return x
        return torch.nn.functional.threshold(x, threshold, value)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx.session, opserver.Session.threshold_backward,
                         grad_output, ctx.x, ctx.threshold)
        return grad, None, None, None, None


class SoftshrinkFunction(torch.autograd.Function):
    """torch.nn.functional.softshrink; backward: SoftshrinkBackward."""

    @staticmethod
    def forward(ctx, x, lambd, session):
        session = current_session(session)
        ctx.session, ctx.lambd = session, float(lambd)
        ctx.x = _resident(session, x) if ctx.needs_input_grad[0] else None
        return torch.nn.functional.softshrink(x, lambd)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx.session, opserver.Session.softshrink_backward,
                         grad_output, ctx.x, ctx.lambd)
        return grad, None, None


class HardswishFunction(torch.autograd.Function):
    """torch.nn.functional.hardswish; backward: HardswishBackward."""

    @staticmethod
    def forward(ctx, x, inplace, session):
        session = current_session(session)
        ctx.session = session
        ctx.x = _resident(session, x) if ctx.needs_input_grad[0] else None
        if inplace:
            torch.nn.functional.hardswish(x, inplace=True)
            ctx.mark_dirty(x)
            return x
        return torch.nn.functional.hardswish(x)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx.session, opserver.Session.hardswish_backward,
                         grad_output, ctx.x)
        return grad, None, None


class LeakyReluFunction(torch.autograd.Function):
    """torch.nn.functional.leaky_relu; backward: LeakyReluBackward. In
    place, the result is what stays resident (selfIsResult, as torch's
    in-place form does; the slope must then be >= 0)."""

    @staticmethod
    def forward(ctx, x, negative_slope, inplace, session):
        session = current_session(session)
        ctx.session, ctx.slope = session, float(negative_slope)
        ctx.self_is_result = bool(inplace)
        if inplace:
            torch.nn.functional.leaky_relu(x, negative_slope, inplace=True)
            ctx.mark_dirty(x)
            ctx.x = _resident(session, x) if ctx.needs_input_grad[0] else None
            return x
        ctx.x = _resident(session, x) if ctx.needs_input_grad[0] else None
        return torch.nn.functional.leaky_relu(x, negative_slope)

    @staticmethod
    def backward(ctx, grad_output):
        # A DOUBLE slope, as torch's Scalar is: the kernel rounds it to the
        # compute dtype.
        slope = opserver.Scalar(ctx.slope, opserver.DType.DOUBLE)
        grad = _backward(ctx.session, opserver.Session.leaky_relu_backward,
                         grad_output, ctx.x, slope, ctx.self_is_result)
        return grad, None, None, None


def _pack_mask(keep):
    """aclnn's dropout mask: bit i of byte i // 8 (least significant first)
    is element i's keep flag, in align(numel, 128) / 8 bytes."""
    flat = keep.reshape(-1).numpy()
    padded = np.zeros((flat.size + 127) // 128 * 128, np.bool_)
    padded[:flat.size] = flat
    return np.packbits(padded, bitorder="little")


class DropoutFunction(torch.autograd.Function):
    """torch.nn.functional.dropout in training (the same noise from the same
    generator, so the same result); backward: DropoutBackward with the mask
    resident and scale = 1 / (1 - p) as torch computes it."""

    @staticmethod
    def forward(ctx, x, p, inplace, session):
        session = current_session(session)
        ctx.session = session
        noise = torch.empty_like(x, memory_format=torch.contiguous_format)
        noise.bernoulli_(1 - p)
        noise.div_(1 - p)
        if ctx.needs_input_grad[0]:
            # torch's own backward multiplies by this noise: its non-zero
            # value, in x's dtype, is the scale.
            ctx.scale = (0.0 if p == 1 else
                         float(torch.ones((), dtype=x.dtype).div_(1 - p)))
            ctx.mask = session.to_device(_pack_mask(noise != 0))
        if inplace:
            x.mul_(noise)
            ctx.mark_dirty(x)
            return x
        return x * noise

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx.session, opserver.Session.dropout_backward,
                         grad_output, ctx.mask, ctx.scale)
        return grad, None, None, None


def threshold(x, threshold, value, inplace=False, session=None):
    return ThresholdFunction.apply(x, threshold, value, inplace, session)


def softshrink(x, lambd=0.5, session=None):
    return SoftshrinkFunction.apply(x, lambd, session)


def hardswish(x, inplace=False, session=None):
    return HardswishFunction.apply(x, inplace, session)


def leaky_relu(x, negative_slope=0.01, inplace=False, session=None):
    return LeakyReluFunction.apply(x, negative_slope, inplace, session)


def dropout(x, p=0.5, training=True, inplace=False, session=None):
    """As torch.nn.functional.dropout; without training (or with p = 0) it
    is the identity and nothing runs remotely."""
    if p < 0 or p > 1:
        raise ValueError("dropout probability has to be between 0 and 1, "
                         "but got %s" % p)
    if not training or p == 0:
        return x
    return DropoutFunction.apply(x, p, inplace, session)


from opserver.torch import nn  # noqa: E402  (modules use the functions)
