"""What a session's calls give besides tensors: a pending read, phase
one's Executor, and graph capture (GraphRecorder, Graph)."""

from opserver._tensor import _stream


class _PendingRead:
    __slots__ = ("_read", "_out")

    def __init__(self, read, out):
        self._read, self._out = read, out

    def wait(self):
        self._read.wait()
        return self._out


class Executor:
    """Phase one's plan (``launch=False``): ``workspace_size`` bytes of
    workspace, launched by ``execute``. Single use unless
    ``set_repeatable()``. ``out`` is the tensor it writes."""

    def __init__(self, executor, out, keep):
        self._e = executor
        self.out = out
        self._keep = keep

    @property
    def workspace_size(self):
        return self._e.workspace_size

    def set_repeatable(self):
        self._e.set_repeatable()

    def execute(self, stream=None, workspace=None, workspace_offset=0):
        """Queues the plan on `stream`; `workspace` is a Buffer with at least
        ``workspace_size`` bytes from `workspace_offset` (or None for 0)."""
        self._e.execute(_stream(stream),
                        0 if workspace is None else workspace.handle,
                        workspace_offset)

    def destroy(self):
        self._e.destroy()


class GraphRecorder:
    """The tasks of a graph being recorded (``Session.record_graph``):
    ``launch`` consumes an executor into it instead of launching it
    (checked at once, as ``execute`` would be), and ``define`` makes the
    server-side graph of them all, in order (docs/graphs.md)."""

    def __init__(self, recorder):
        self._r = recorder
        self._keep = []

    def __len__(self):
        return len(self._r)

    def launch(self, executor, stream=None):
        self._r.launch(executor._e, _stream(stream))
        self._keep.append(executor)  # Its tensors, until the definition.

    def define(self):
        """Sends the definition and returns the ``Graph`` once the server
        has taken it (one round trip); raises what the server refused it
        for (a handle gone, its graph limits), with no graph made."""
        graph = Graph(self._r.define())
        self._keep = []
        return graph


class Graph:
    """A graph on the server: ``replay`` queues all of its tasks on a
    stream as one command; ``destroy`` (or the last reference going)
    releases it after the replays already queued."""

    def __init__(self, graph):
        self._g = graph

    @property
    def handle(self):
        return self._g.handle

    @property
    def tasks(self):
        return self._g.tasks

    @property
    def destroyed(self):
        return self._g.destroyed

    def replay(self, stream=None):
        """Queues one replay on `stream` without waiting; its errors are the
        stream's deferred errors. ``FailedPrecondition`` once destroyed."""
        self._g.replay(_stream(stream))

    def destroy(self):
        self._g.destroy()
