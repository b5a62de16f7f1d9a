"""Graph capture for opserver.torch, in the style of torch.cuda.graph and
torch_npu.npu.graph: the remote part of a training step is captured once
on static device buffers, and each later step is input copies, one replay
per remote segment and one read per gradient torch needs.

    graph = opserver.torch.Graph()
    for x, label in loader:
        optimizer.zero_grad()
        with graph.step():       # the first step captures, the others replay
            loss = torch.nn.functional.cross_entropy(model(x), label)
            loss.backward()
        optimizer.step()
    graph.destroy()

What is captured. Only the server can run a graph, and it runs only the
remote operators: the model's local torch work (Linear layers, the loss,
the optimizer) runs every step as usual, and the step's Python runs every
step too. A graph block records (first step) or replays (later steps) the
remote backwards the opserver.torch modules issue in it:

* a forward sends what its backward needs into a static buffer of the
  graph (the k-th forward of the step into the k-th buffer);
* a backward whose gradient comes from torch writes it into a static
  buffer; one whose gradient comes from another remote backward takes
  that one's static output, on the device;
* a *segment* is the remote backwards between two points where torch
  needs a gradient back. When torch needs one, the segment's launches run
  as one server-side graph (defined the first time, replayed after) and
  the gradient is read: one wait.

So a step waits once per remote gradient torch needs, as the eager step
does, but sends no operator: no phase one, no launch, no plan, only the
input writes, one replay command per segment and the reads. A model whose
remote modules all sit in one run (the usual Linear, activation, dropout,
Linear) waits once per step and replays one graph.

The capturing step is a training step too: each segment is defined and
replayed at once, so the captured step's gradients are the eager step's.
A replay must make the same remote calls with the same shapes, dtypes and
parameters as the capture; anything else raises GraphError naming the
call.
"""

import contextlib
import threading

import torch

import opserver
from opserver import torch as _ot

__all__ = ["Graph", "GraphError", "graph", "active_run"]

_state = threading.local()


class GraphError(RuntimeError):
    """A graph used in a way it cannot be: replayed before its capture or
    after destroy(), a second graph block in a thread that is already in
    one, or a replayed step whose remote calls differ from the capture's."""


def active_run(session):
    """The calling thread's graph step (capture or replay) for a remote
    forward in `session`, or None outside graph blocks."""
    run = getattr(_state, "run", None)
    if run is not None and run.session is not session:
        raise GraphError("a remote module used another session than its "
                         "graph's inside the graph's block; a graph holds "
                         "one session's operators")
    return run


def graph(g):
    """``with opserver.torch.graph(g):`` captures `g`, as torch.cuda.graph
    does (``g.capture()``)."""
    return g.capture()


def _describe(sig):
    dtype, shape = sig
    return "%s%s" % (opserver.DType(dtype).name, list(shape))


def _describe_arguments(arguments):
    def one(a):
        if isinstance(a, tuple) and a[0] == "resident":
            return "forward %d's tensor" % (a[1] + 1)
        if isinstance(a, tuple) and a[0] == "scalar":
            return repr(a[1])
        return repr(a)
    return ", ".join(one(a) for a in arguments)


def _signature(array):
    return int(opserver.dtype_of(array)), tuple(int(d) for d in array.shape)


def _scalar(value):
    if isinstance(value, opserver.Scalar):
        return ("scalar", value.value, value.dtype)
    return value


class _Call:
    """A captured backward: what it must look like on replay, the static
    buffer its gradient is written into (None when it comes from another
    call's output) and its static output."""

    __slots__ = ("name", "signature", "grad", "out")

    def __init__(self, name, signature, grad, out):
        self.name, self.signature, self.grad, self.out = (name, signature,
                                                          grad, out)


class Graph:
    """The captured remote part of a training step (see the module's doc).

    ``capture()`` and ``replay()`` are context managers around one step's
    forward and backward; ``step()`` captures the first time and replays
    after. ``destroy()`` releases the server's graphs and the static
    buffers (so does the last reference going). `session` defaults to the
    innermost ``opserver.torch.remote`` block's at capture."""

    def __init__(self, session=None):
        self._session = session
        self._lock = threading.Lock()
        self._state = "new"  # capturing, captured, replaying, destroyed
        self._clear()

    def _clear(self):
        self._residents = []  # [(signature, static DeviceTensor)]
        self._calls = []  # [_Call]
        self._outs = {}  # static output buffer handle -> call index
        self._segments = []  # [(end call index, opserver.Graph)]

    @property
    def captured(self):
        return self._state in ("captured", "replaying")

    @property
    def destroyed(self):
        return self._state == "destroyed"

    @property
    def segments(self):
        """The task count of each server-side graph, in replay order."""
        return [g.tasks for _, g in self._segments]

    def step(self):
        """``replay()`` once captured, else ``capture()``."""
        return self.replay() if self.captured else self.capture()

    def capture(self):
        """Records this block's remote backwards into the graph, running
        them as well (the block is a step like any other)."""
        return self._block(capturing=True)

    def replay(self):
        """Runs this block's remote backwards as replays of the capture."""
        return self._block(capturing=False)

    def destroy(self):
        """Releases the server's graphs (after their queued replays) and
        the static buffers; the graph cannot be used again."""
        with self._lock:
            if self._state in ("capturing", "replaying"):
                raise GraphError("destroy() inside the graph's own block")
            self._state = "destroyed"
            segments = self._segments
            self._clear()
        for _, g in segments:
            g.destroy()

    @contextlib.contextmanager
    def _block(self, capturing):
        other = getattr(_state, "run", None)
        if other is not None:
            raise GraphError(
                "a graph block is already active in this thread (%s); graph "
                "blocks do not nest" %
                ("a capture" if other.capturing else "a replay"))
        with self._lock:
            if self._state == "destroyed":
                raise GraphError("the graph was destroyed; capture a new "
                                 "opserver.torch.Graph")
            if self._state in ("capturing", "replaying"):
                raise GraphError("the graph is already in a block (another "
                                 "thread's?); one step at a time")
            if capturing and self._state == "captured":
                raise GraphError("the graph is already captured; replay() "
                                 "it, or capture a new Graph")
            if not capturing and self._state == "new":
                raise GraphError("the graph was never captured; capture() "
                                 "it first (or use step())")
            session = _ot.current_session(self._session)
            self._session = session
            self._state = "capturing" if capturing else "replaying"
        run = _Run(self, session, capturing)
        _state.run = run
        try:
            with _ot.remote(session):  # Modules without session= use it.
                yield self
            run.finish()
        except BaseException:
            run.open = False
            if capturing:
                self._abandon()
            raise
        finally:
            _state.run = None
            with self._lock:
                # A failed capture left nothing (capture again); a failed
                # replay left the capture as it was.
                self._state = ("new" if capturing and not run.done else
                               "captured")

    def _abandon(self):
        """A capture that failed leaves nothing behind: capture() again."""
        segments = self._segments
        self._clear()
        for _, g in segments:
            g.destroy()


class _Run:
    """One graph block: a capture or a replay of the graph's step."""

    def __init__(self, graph, session, capturing):
        self.graph, self.session, self.capturing = graph, session, capturing
        self.open, self.done = True, False
        self.residents = self.calls = self.segments = 0
        self.segment_start = 0
        self.recorder = session.record_graph() if capturing else None

    def _mismatch(self, what):
        return GraphError("graph replay: %s; a replay makes the remote calls "
                          "of its capture, with their shapes, dtypes and "
                          "parameters (capture another Graph for this step)" %
                          what)

    def resident(self, ctx, tensor):
        """The static buffer of this forward's resident tensor, written."""
        if isinstance(tensor, torch.Tensor):
            tensor = tensor.detach().contiguous()
        sig = _signature(tensor)
        index = self.residents
        self.residents += 1
        residents = self.graph._residents
        if self.capturing:
            static = self.session.empty(sig[1], sig[0])
            residents.append((sig, static))
        else:
            name = ctx._forward_cls.__name__
            if index >= len(residents):
                raise self._mismatch("remote forward %d (%s) is one more than "
                                     "the capture's %d" %
                                     (index + 1, name, len(residents)))
            captured, static = residents[index]
            if captured != sig:
                raise self._mismatch(
                    "remote forward %d (%s) was captured with %s and now has "
                    "%s" % (index + 1, name, _describe(captured),
                            _describe(sig)))
        if static.numel:
            self.session.write(static.buffer, tensor)
        return static

    def _arguments(self, args):
        """The backward's arguments as the signature records them: static
        resident tensors by index, parameters by value."""
        index = {t.buffer.handle: i
                 for i, (_, t) in enumerate(self.graph._residents)}
        return tuple(("resident", index.get(a.buffer.handle))
                     if isinstance(a, opserver.DeviceTensor) else _scalar(a)
                     for a in args)

    def backward(self, ctx, operator, grad_output, args):
        if not self.open:
            raise GraphError("a remote backward ran after its graph block "
                             "ended; run loss.backward() inside the block")
        session, graph = self.session, self.graph
        grad = (grad_output.on_device(session, self)
                if isinstance(grad_output, _ot._Pending) else None)
        if grad is None:
            grad_output = grad_output.detach().contiguous()
            source = "torch"
            sig = _signature(grad_output)
        else:
            source = graph._outs[grad.buffer.handle]
            sig = (int(grad.dtype), grad.shape)
        name = ctx._forward_cls.__name__
        signature = (name, sig, source, self._arguments(args))
        index = self.calls
        self.calls += 1
        if self.capturing:
            static_grad = None
            if grad is None:
                grad = static_grad = session.empty(sig[1], sig[0])
            out = session.empty(grad.shape, grad.dtype)
            graph._outs[out.buffer.handle] = index
            graph._calls.append(_Call(name, signature, static_grad, out))
            executor = operator(session, grad, *args, out=out, launch=False)
            self.recorder.launch(executor)
        else:
            if index >= len(graph._calls):
                raise self._mismatch("remote backward %d (%s) is one more "
                                     "than the capture's %d" %
                                     (index + 1, name, len(graph._calls)))
            call = graph._calls[index]
            if call.signature != signature:
                raise self._mismatch(self._difference(index, call, signature))
            static_grad, out = call.grad, call.out
        if static_grad is not None and static_grad.numel:
            session.write(static_grad.buffer, grad_output)
        dtype = getattr(torch, opserver._TORCH_NAMES[out.dtype])
        if ctx.pending:
            return _ot._Pending(session, out, dtype, self)
        self.flush()
        return _ot._receive(session, out, dtype)

    @staticmethod
    def _difference(index, call, signature):
        name, sig, source, arguments = signature
        _, captured_sig, captured_source, captured_arguments = call.signature
        if (call.name, captured_sig) != (name, sig):
            return ("remote backward %d was captured as %s of a %s gradient "
                    "and is now %s of a %s gradient" %
                    (index + 1, call.name, _describe(captured_sig), name,
                     _describe(sig)))
        if captured_source != source:
            where = lambda s: ("torch" if s == "torch" else
                               "remote backward %d" % (s + 1))
            return ("the gradient of remote backward %d (%s) came from %s at "
                    "the capture and now from %s" %
                    (index + 1, name, where(captured_source), where(source)))
        return ("remote backward %d (%s) was captured with arguments (%s) "
                "and now has (%s)" % (index + 1, name,
                                      _describe_arguments(captured_arguments),
                                      _describe_arguments(arguments)))

    def flush(self):
        """Runs the remote backwards recorded since the last flush: the
        segment's graph, defined now when capturing, replayed."""
        if not self.open:
            raise GraphError("a gradient of a graph's step was read after "
                             "its block ended")
        end = self.calls
        if end == self.segment_start:
            return
        segments = self.graph._segments
        if self.capturing:
            # Raises the server's refusal (its graph limits, ...).
            segment = self.recorder.define()
            self.recorder = self.session.record_graph()
            segments.append((end, segment))
        else:
            m = self.segments
            if m >= len(segments) or segments[m][0] != end:
                raise self._mismatch(
                    "torch needed a gradient after remote backward %d, where "
                    "the capture had %s" %
                    (end, "no more" if m >= len(segments) else
                     "remote backward %d" % segments[m][0]))
            segment = segments[m][1]
        segment.replay()
        _ot._count("replays")
        self.segments += 1
        self.segment_start = end

    def finish(self):
        """The block's end: the last segment runs (its result stays on the
        device), and a replay must have made every call of the capture."""
        self.flush()
        self.open = False
        graph = self.graph
        if self.capturing:
            if not graph._calls:
                graph._abandon()
                raise GraphError("the capture recorded no remote backward; "
                                 "run the step's forward and backward inside "
                                 "the block")
        elif (self.residents, self.calls, self.segments) != (
                len(graph._residents), len(graph._calls),
                len(graph._segments)):
            raise self._mismatch(
                "the step made %d remote forwards and %d backwards in %d "
                "segments, the capture %d, %d and %d" %
                (self.residents, self.calls, self.segments,
                 len(graph._residents), len(graph._calls),
                 len(graph._segments)))
        self.done = True
