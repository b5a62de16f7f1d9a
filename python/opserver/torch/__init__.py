"""The five activations as torch.autograd Functions whose backward runs on an
opserver.

Each forward runs locally in torch, exactly as torch computes it, and keeps
what the backward needs (the input, the result or the dropout mask) resident
on the remote device: it is sent once, during the forward, queued on the
session's command channel without waiting. The backward sends only
``grad_output`` (queued the same way), launches the remote backward
operator with aclnn's semantics, and reads the gradient back.

    import opserver, opserver.torch
    client = opserver.connect("127.0.0.1:50051")
    with client.session("train") as s, opserver.torch.remote(s):
        y = opserver.torch.hardswish(x)   # or opserver.torch.nn.Hardswish()
        y.sum().backward()                # x.grad computed remotely

Pipelined across the step: when the gradient a backward computes goes
straight into another of these backwards (remote activations applied one
after another), it stays on the device and is handed over as a pending
tensor; only what torch itself computes with waits for a gradient. So a
chain of remote operators waits once, at its end, and a remote activation
between local layers waits once per backward, for the round trip that
carries its gradient in and out. A pending tensor that torch touches is read
then (any operation on it waits for its bytes, then runs on them).

The session is passed explicitly (``session=``) or taken from the innermost
``with opserver.torch.remote(session):`` of the calling thread. Buffers are
kept per session and reused from step to step, so a step allocates nothing
once the first one has run.

Where aclnn and torch define different results (aclnn's here): see
docs/python.md. Everywhere else, fp32 gradients are
torch's bit for bit.
"""

import contextlib
import threading

import numpy as np
import torch
from torch.utils._pytree import tree_map

import opserver

__all__ = ["remote", "current_session", "threshold", "softshrink",
           "hardswish", "leaky_relu", "dropout", "nn", "stats", "Graph",
           "GraphError", "graph"]

_state = threading.local()
_stats_lock = threading.Lock()
_stats = {"waits": 0, "replays": 0}


def stats():
    """{"waits": n, "replays": m}: how many times a backward (or torch,
    touching a pending gradient) has waited for a gradient from the server,
    and how many graph replays (see Graph) were queued, since the start."""
    with _stats_lock:
        return dict(_stats)


def _count(what):
    with _stats_lock:
        _stats[what] += 1


def _count_wait():
    _count("waits")


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


class _Pool:
    """A session's free device buffers by size, reused by later steps. All
    of this module's work is on stream 0, in order, so a buffer returned
    here once its tensor is gone is only written after the work that read
    it."""

    # Free bytes kept (beyond them, returned buffers are freed): a step's
    # worth of activations and gradients for most models.
    MAX_BYTES = 256 << 20

    def __init__(self, session):
        self.session = session
        self.lock = threading.RLock()  # A return may come from a GC pass.
        self.free = {}
        self.free_bytes = 0

    def take(self, nbytes):
        with self.lock:
            free = self.free.get(nbytes)
            if free:
                self.free_bytes -= nbytes
                return _Pooled(self, free.pop())
        return _Pooled(self, self.session.malloc(nbytes))

    def give_back(self, buffer):
        with self.lock:
            if (self.free_bytes + buffer.nbytes <= self.MAX_BYTES and
                    not self.session.closed):
                self.free.setdefault(buffer.nbytes, []).append(buffer)
                self.free_bytes += buffer.nbytes


class _Pooled:
    """A pooled buffer, returned to its pool when no tensor uses it."""

    __slots__ = ("pool", "buffer", "handle", "nbytes")

    def __init__(self, pool, buffer):
        self.pool, self.buffer = pool, buffer
        self.handle, self.nbytes = buffer.handle, buffer.nbytes

    def __del__(self):
        try:
            self.pool.give_back(self.buffer)
        except Exception:  # Interpreter shutdown: the session frees it.
            pass


_pools_lock = threading.Lock()


def _pool(session):
    pool = getattr(session, "_torch_pool", None)
    if pool is None:
        with _pools_lock:
            pool = getattr(session, "_torch_pool", None)
            if pool is None:
                pool = session._torch_pool = _Pool(session)
    return pool


def _empty(session, shape, dtype):
    """A device tensor of a pooled buffer."""
    n = 1
    for d in shape:
        n *= int(d)
    nbytes = max(n * opserver._opserver.dtype_size(int(dtype)), 1)
    return opserver.DeviceTensor(session, _pool(session).take(nbytes), dtype,
                                 tuple(shape))


def _send(session, array):
    """`array` (a torch tensor or numpy array) in a pooled device tensor;
    queued, not waited for (up to 1 MiB; larger is an upload)."""
    if isinstance(array, torch.Tensor):
        array = array.detach().contiguous()
    t = _empty(session, tuple(array.shape), opserver.dtype_of(array))
    if t.numel:
        session.write(t.buffer, array)
    return t


def _receive(session, device, dtype):
    """The bytes of `device` in a new torch tensor: waits once."""
    out = torch.empty(device.shape, dtype=dtype)
    if out.numel():
        _count_wait()
        session.read_async(device.buffer, out).wait()
    return out


class _Pending(torch.Tensor):
    """A gradient still on the device. Another of this module's backwards
    takes it as it is; anything else torch does with it reads it first."""

    @staticmethod
    def __new__(cls, session, device, dtype, run=None):
        r = torch.Tensor._make_wrapper_subclass(
            cls, device.shape, dtype=dtype, device="cpu")
        r._session, r._device, r._value = session, device, None
        r._run = run  # The graph step that computes it (see Graph), if any.
        return r

    def value(self):
        if self._value is None:
            if self._run is not None:
                self._run.flush()  # Its graph segment runs first.
            self._value = _receive(self._session, self._device, self.dtype)
            self._device = None  # Its buffer goes back to the pool.
        return self._value

    def on_device(self, session, run=None):
        """The device tensor, if it is still there, in `session`, and made
        by `run` (the graph step taking it, or None outside graphs)."""
        if (self._value is None and self._session is session and
                self._run is run):
            return self._device
        return None

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.value() if isinstance(t, _Pending) else t
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))

    def __repr__(self):
        return repr(self.value())


def _feeds_remote(x):
    """Whether the gradient of `x` goes straight into one of this module's
    backwards: it was made by one of its functions."""
    return getattr(type(x.grad_fn), "_forward_cls", None) in _FUNCTIONS


def _resident(ctx, tensor):
    """`tensor` sent for ctx's later backward (queued): into a pooled
    buffer, or inside a Graph's block into the graph's static one."""
    ctx.run = _graph.active_run(ctx.session)
    if ctx.run is not None:
        return ctx.run.resident(ctx, tensor)
    return _send(ctx.session, tensor)


def _backward(ctx, operator, grad_output, *args):
    """Runs `operator` (a Session method) on the gradient and `args`
    (resident tensors and scalars) into a pooled buffer; returns the
    gradient, pending when it feeds another remote backward. Inside a
    Graph's block, the graph records or replays it instead."""
    run = getattr(ctx, "run", None)
    if run is not None:
        return run.backward(ctx, operator, grad_output, args)
    session = ctx.session
    grad = (grad_output.on_device(session)
            if isinstance(grad_output, _Pending) else None)
    if grad is None:
        grad = _send(session, grad_output)
    out = _empty(session, grad.shape, grad.dtype)
    operator(session, grad, *args, out=out)
    dtype = getattr(torch, opserver._TORCH_NAMES[out.dtype])
    if ctx.pending:
        return _Pending(session, out, dtype)
    return _receive(session, out, dtype)


class ThresholdFunction(torch.autograd.Function):
    """torch.nn.functional.threshold; backward: ThresholdBackward."""

    @staticmethod
    def forward(ctx, x, threshold, value, inplace, session):
        session = current_session(session)
        ctx.session, ctx.threshold = session, float(threshold)
        ctx.pending = _feeds_remote(x)
        ctx.x = _resident(ctx, x) if ctx.needs_input_grad[0] else None
        if inplace:
            torch.nn.functional.threshold(x, threshold, value, inplace=True)
            ctx.mark_dirty(x)
            return x
        return torch.nn.functional.threshold(x, threshold, value)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx, opserver.Session.threshold_backward,
                         grad_output, ctx.x, ctx.threshold)
        return grad, None, None, None, None


class SoftshrinkFunction(torch.autograd.Function):
    """torch.nn.functional.softshrink; backward: SoftshrinkBackward."""

    @staticmethod
    def forward(ctx, x, lambd, session):
        session = current_session(session)
        ctx.session, ctx.lambd = session, float(lambd)
        ctx.pending = _feeds_remote(x)
        ctx.x = _resident(ctx, x) if ctx.needs_input_grad[0] else None
        return torch.nn.functional.softshrink(x, lambd)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx, opserver.Session.softshrink_backward,
                         grad_output, ctx.x, ctx.lambd)
        return grad, None, None


class HardswishFunction(torch.autograd.Function):
    """torch.nn.functional.hardswish; backward: HardswishBackward."""

    @staticmethod
    def forward(ctx, x, inplace, session):
        session = current_session(session)
        ctx.session, ctx.pending = session, _feeds_remote(x)
        ctx.x = _resident(ctx, x) if ctx.needs_input_grad[0] else None
        if inplace:
            torch.nn.functional.hardswish(x, inplace=True)
            ctx.mark_dirty(x)
            return x
        return torch.nn.functional.hardswish(x)

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx, opserver.Session.hardswish_backward,
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
        ctx.pending = _feeds_remote(x)
        ctx.self_is_result = bool(inplace)
        if inplace:
            torch.nn.functional.leaky_relu(x, negative_slope, inplace=True)
            ctx.mark_dirty(x)
            ctx.x = _resident(ctx, x) if ctx.needs_input_grad[0] else None
            return x
        ctx.x = _resident(ctx, x) if ctx.needs_input_grad[0] else None
        return torch.nn.functional.leaky_relu(x, negative_slope)

    @staticmethod
    def backward(ctx, grad_output):
        # A DOUBLE slope, as torch's Scalar is: the kernel rounds it to the
        # compute dtype.
        slope = opserver.Scalar(ctx.slope, opserver.DType.DOUBLE)
        grad = _backward(ctx, opserver.Session.leaky_relu_backward,
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
        ctx.session, ctx.pending = session, _feeds_remote(x)
        noise = torch.empty_like(x, memory_format=torch.contiguous_format)
        noise.bernoulli_(1 - p)
        noise.div_(1 - p)
        if ctx.needs_input_grad[0]:
            # torch's own backward multiplies by this noise: its non-zero
            # value, in x's dtype, is the scale.
            ctx.scale = (0.0 if p == 1 else
                         float(torch.ones((), dtype=x.dtype).div_(1 - p)))
            ctx.mask = _resident(ctx, _pack_mask(noise != 0))
        if inplace:
            x.mul_(noise)
            ctx.mark_dirty(x)
            return x
        return x * noise

    @staticmethod
    def backward(ctx, grad_output):
        grad = _backward(ctx, opserver.Session.dropout_backward,
                         grad_output, ctx.mask, ctx.scale)
        return grad, None, None, None


_FUNCTIONS = (ThresholdFunction, SoftshrinkFunction, HardswishFunction,
              LeakyReluFunction, DropoutFunction)


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


from opserver.torch import graph as _graph  # noqa: E402
from opserver.torch.graph import Graph, GraphError, graph  # noqa: E402,F401
from opserver.torch import nn  # noqa: E402  (modules use the functions)
