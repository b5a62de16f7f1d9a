"""Session: memory, transfers and streams of one server session, and one
method per operator of the registry (Session.threshold_backward, ...)."""

import json

from opserver import _opserver
from opserver._dtypes import DType, _host_bytes, _is_torch, dtype_of
from opserver._handles import Executor, GraphRecorder, _PendingRead
from opserver._tensor import DeviceTensor, _broadcast, _stream
from opserver.errors import InvalidArgument, Unavailable


class Session:
    """A session on the server: owns the buffers, streams and executors made
    through it. A context manager: leaving it closes the session. Made by
    ``Client.session``. Thread-safe; two threads on two sessions do not wait
    for each other."""

    def __init__(self, session):
        self._s = session

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.close()
        except Unavailable:
            # The server went away. With an error in flight (the loss
            # itself, raised by a call in the block, or one before it),
            # a second traceback for the same loss would only hide it.
            if exc_type is None:
                raise
        return False

    @property
    def token(self):
        return self._s.token

    @property
    def routing_key(self):
        """The key every call of this session carries as the metadata
        x-opserver-session, for a proxy's session affinity (docs/pool.md)."""
        return self._s.routing_key

    @property
    def closed(self):
        return self._s.closed

    def close(self):
        """Closes the session (idempotent); raises a deferred error still
        pending."""
        self._s.close()

    def flush(self):
        """Waits until every queued command ran; raises the session's
        deferred error (frees, executor calls, plans never launched)."""
        self._s.flush()

    def synchronize(self, stream=None):
        """Waits for the work queued on `stream` (default stream 0) and
        raises the first error it met."""
        self._s.synchronize(_stream(stream))

    def stats(self):
        return json.loads(self._s.stats())

    def lost(self):
        """None, or why the server dropped this session."""
        return self._s.lost()

    def malloc(self, nbytes):
        """A device buffer of `nbytes` (freed with its last reference, or by
        ``free()``)."""
        return self._s.malloc(int(nbytes))

    def create_stream(self):
        return self._s.create_stream()

    def record_graph(self):
        """A ``GraphRecorder``: the launches of a graph, defined at once."""
        return GraphRecorder(self._s.record_graph())

    def upload(self, buffer, data, offset=0, stream=None):
        """Copies a numpy array or torch CPU tensor into buffer[offset:],
        after the work queued on `stream`. Returns once the bytes are sent;
        `data` may then be reused."""
        self._s.upload(buffer.handle, int(offset), _host_bytes(data),
                       _stream(stream))

    def write(self, buffer, data, offset=0, stream=None):
        """Like ``upload``, without waiting: up to 1 MiB is copied and
        queued on the session's command channel, in order with the
        launches around it (larger: an upload). Errors only the server
        finds are reported by the stream's next synchronize."""
        self._s.write(buffer.handle, int(offset), _host_bytes(data),
                      _stream(stream))

    def read_async(self, buffer, out, offset=0, stream=None):
        """Queues a download into the contiguous array or tensor `out`
        after the work on `stream`, without waiting; ``.wait()`` on the
        result waits for the bytes, raises the stream's deferred error, and
        returns `out`. Until then `out` must not be read."""
        return _PendingRead(self._s.read_async(
            buffer.handle, int(offset), _host_bytes(out, writable=True),
            _stream(stream)), out)

    def download(self, buffer, out, offset=0, stream=None):
        """Fills the contiguous array or tensor `out` from buffer[offset:],
        after the work queued on `stream`; returns `out`."""
        self._s.download(buffer.handle, int(offset),
                         _host_bytes(out, writable=True), _stream(stream))
        return out

    def tensor(self, buffer, dtype, shape, strides=None, offset=0,
               buffer_offset=0):
        """A view of `buffer` as a tensor (strides/offset in elements)."""
        return DeviceTensor(self, buffer, dtype, shape, strides, offset,
                            buffer_offset)

    def empty(self, shape, dtype):
        """A new contiguous device tensor (contents: zeros for a new
        buffer, as the server promises a new owner)."""
        n = 1
        for d in shape:
            n *= int(d)
        size = n * _opserver.dtype_size(int(dtype))
        return DeviceTensor(self, self.malloc(max(size, 1)), dtype, shape)

    def to_device(self, array, stream=None):
        """A new device tensor holding a copy of a numpy array or torch CPU
        tensor (uploaded before this returns)."""
        t = self.empty(tuple(array.shape), dtype_of(array))
        if t.numel:
            self.upload(t.buffer, array, stream=stream)
        return t

    def _device(self, value, name, keep):
        if isinstance(value, DeviceTensor):
            return value, False
        if value is None:
            return None, False
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            t = self.to_device(value)
            keep.append(t)
            return t, True
        raise InvalidArgument(3, 161001 if value is None else 161002,
                              "%s must be a DeviceTensor, a numpy array or a "
                              "torch tensor, not %s" % (name, type(value)))


def _snake(name):
    out = []
    for i, c in enumerate(name):
        if c.isupper() and i:
            out.append("_")
        out.append(c.lower())
    return "".join(out)


def _make_operator(info):
    """Session.<snake_name>(in0, in1, *scalars, out=None, stream=None,
    launch=True, **scalars_by_name) for one registry entry."""
    name = info["name"]
    method_name = _snake(name)
    ins = [t["name"] for t in info["tensors"] if not t["is_output"]]
    scalars = info["scalars"]
    scalar_names = [_snake(s["name"]) for s in scalars]
    is_mask = info["bit_mask_input"]

    def operator(self, a, b, *args, out=None, stream=None, launch=True,
                 **kwargs):
        # The common case first: resident tensors, no conversions.
        if len(args) > len(scalars):
            raise TypeError("%s takes %d scalar arguments" %
                            (method_name, len(scalars)))
        values = list(args)
        for i in range(len(args), len(scalars)):
            key = scalar_names[i]
            if key in kwargs:
                values.append(kwargs.pop(key))
            elif scalars[i]["default"] is not None:
                default = scalars[i]["default"]
                values.append(bool(default) if scalars[i]["type"] == "bool"
                              else default)
            else:
                raise TypeError("%s: missing %s" % (method_name, key))
        if kwargs:
            raise TypeError("%s got unexpected arguments %s" %
                            (method_name, sorted(kwargs)))
        keep = []
        host_in = [x for x in (a, b) if not isinstance(x, DeviceTensor)]
        da, _ = self._device(a, ins[0], keep)
        db, _ = self._device(b, ins[1], keep)
        if da is None or db is None:
            raise InvalidArgument(3, 161001, "%s: %s must not be None" %
                                  (method_name, ins[0] if da is None
                                   else ins[1]))
        host_out = None
        if out is None or not isinstance(out, DeviceTensor):
            host_out = out
            if is_mask:
                shape, dtype = da.shape, da.dtype
            else:
                shape = _broadcast(da.shape, db.shape)
                dtype = DType(_opserver.promote(int(da.dtype), int(db.dtype)))
            if host_out is not None:
                dtype = dtype_of(host_out)
            dout = self.empty(shape, dtype)
        else:
            dout = out
        s = _stream(stream)
        plan = getattr(self._s, name)(da.desc, db.desc, *values, dout.desc,
                                      s, launch)
        if not launch:
            return Executor(plan, dout, keep)
        if host_out is not None:
            dout._download_into(_host_bytes(host_out, writable=True), s)
            return host_out
        if out is None and host_in:
            # Host inputs give a host result of the same kind.
            torch_in = any(_is_torch(x) for x in host_in)
            return dout.torch(s) if torch_in else dout.numpy(s)
        if keep:
            dout._keep = keep
        return dout

    operator.__name__ = method_name
    operator.__doc__ = "%s(%s, %s, %s, out=None, stream=None, launch=True)\n\n%s" % (
        method_name, _snake(ins[0]), "input" if ins[1] == "self" else ins[1],
        ", ".join(scalar_names), info["description"])
    return method_name, operator


def operators():
    """The operators' registry (names, arguments, dtypes)."""
    return _opserver.operators()


for _info in _opserver.operators():
    _name, _method = _make_operator(_info)
    setattr(Session, _name, _method)
