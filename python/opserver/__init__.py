"""opserver's Python client: remote backward operators on numpy arrays and
torch tensors.

    import numpy as np
    import opserver

    client = opserver.connect("127.0.0.1:50051")
    with client.session("my-job") as s:
        x = s.to_device(np.array([0.2, 1.2, 2.2, 3.2], np.float32))
        g = s.to_device(np.array([4.5, 4.4, 4.3, 4.2], np.float32))
        out = s.threshold_backward(g, x, 1.0)   # queued: returns at once
        print(out.numpy())                      # waits: [0, 4.4, 4.3, 4.2]

Everything goes through the C++ client (the extension opserver._opserver),
so calls are pipelined as in C++: an operator is checked and planned here,
queued on the session's command channel and not waited for; a download or
``synchronize`` waits and raises the first error the server found since.
Large transfers use the server's data path and several connections, TLS
and tokens are the C++ client's. Blocking calls release the GIL.

Operators take device tensors (``DeviceTensor``: a buffer with a view) or
host arrays (numpy arrays, torch CPU tensors), which are uploaded for the
call; with host inputs and no ``out``, the result comes back as the same
kind of array. ``launch=False`` gives phase one's ``Executor`` instead of
launching (phase two is ``executor.execute(stream, workspace)``).
"""

import enum
import json

from opserver import _opserver
from opserver.errors import (  # noqa: F401  (re-exported)
    Error, Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound,
    AlreadyExists, PermissionDenied, ResourceExhausted, FailedPrecondition,
    Aborted, OutOfRange, Unimplemented, Internal, Unavailable, DataLoss,
    Unauthenticated)

__all__ = [
    "connect", "Client", "Pool", "Session", "DeviceTensor", "Executor", "DType",
    "Scalar", "Error", "operators", "Graph", "GraphRecorder",
]


class DType(enum.IntEnum):
    """aclDataType's values (the wire's dtypes). 27 has two names, as on
    every surface: BFLOAT16, the one printed, and BF16 (CANN's ACL_BF16)."""
    FLOAT = 0
    FLOAT16 = 1
    INT8 = 2
    INT32 = 3
    UINT8 = 4
    INT16 = 6
    UINT16 = 7
    UINT32 = 8
    INT64 = 9
    UINT64 = 10
    DOUBLE = 11
    BOOL = 12
    BFLOAT16 = 27
    BF16 = 27  # The same member as BFLOAT16.


float32, float16, bfloat16, float64 = (DType.FLOAT, DType.FLOAT16,
                                       DType.BFLOAT16, DType.DOUBLE)
int8, int32, uint8, int64, bool_ = (DType.INT8, DType.INT32, DType.UINT8,
                                    DType.INT64, DType.BOOL)

Scalar = _opserver.Scalar
"""A typed scalar: ``Scalar(0.01, DType.DOUBLE)`` (LeakyReLU's slope)."""

_NUMPY_NAMES = {
    DType.FLOAT: "float32", DType.FLOAT16: "float16", DType.INT8: "int8",
    DType.INT32: "int32", DType.UINT8: "uint8", DType.INT16: "int16",
    DType.UINT16: "uint16", DType.UINT32: "uint32", DType.INT64: "int64",
    DType.UINT64: "uint64", DType.DOUBLE: "float64", DType.BOOL: "bool",
}
_FROM_NUMPY = {name: dtype for dtype, name in _NUMPY_NAMES.items()}
_TORCH_NAMES = {**_NUMPY_NAMES, DType.BFLOAT16: "bfloat16"}
_FROM_TORCH = {name: dtype for dtype, name in _TORCH_NAMES.items()}


def _is_torch(obj):
    return type(obj).__module__.startswith("torch")


def dtype_of(array):
    """The DType of a numpy array or torch tensor."""
    if _is_torch(array):
        name = str(array.dtype).replace("torch.", "")
        if name in _FROM_TORCH:
            return _FROM_TORCH[name]
    else:
        name = str(array.dtype)
        if name in _FROM_NUMPY:
            return _FROM_NUMPY[name]
    raise InvalidArgument(3, 161002, "dtype %s has no aclDataType" % name)


def _numpy_dtype(dtype):
    import numpy as np
    if dtype == DType.BFLOAT16:
        raise InvalidArgument(3, 161002,
                              "numpy has no bfloat16; use torch tensors")
    return np.dtype(_NUMPY_NAMES[DType(dtype)])


def _host_bytes(array, writable=False):
    """A C-contiguous buffer-protocol view of a numpy array or torch CPU
    tensor, sharing its memory (no copy unless it is not contiguous and
    only read; a writable one must be contiguous)."""
    if _is_torch(array):
        import torch
        if array.device.type != "cpu":
            raise InvalidArgument(3, 161002,
                                  "only CPU tensors can be transferred")
        if not array.is_contiguous():
            if writable:
                raise InvalidArgument(3, 161002, "the tensor to fill must be "
                                      "contiguous")
            array = array.contiguous()
        array = array.detach()
        if array.dtype == torch.bfloat16:
            array = array.view(torch.int16)
        return array.numpy()
    import numpy as np
    if writable:
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise InvalidArgument(3, 161002, "the array to fill must be "
                                  "C-contiguous and writable")
        return array
    return np.ascontiguousarray(array)


def _stream(stream):
    if stream is None:
        return 0
    return stream if isinstance(stream, int) else stream.handle


def _contiguous_strides(shape):
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return list(reversed(strides))


def _broadcast(a, b):
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise InvalidArgument(3, 161002, "shapes %s and %s do not "
                                  "broadcast" % (a, b))
        out.append(y if x == 1 else x)
    return out


class DeviceTensor:
    """A tensor in a device buffer: the buffer and a view of it (dtype,
    shape, strides and offset in elements, as aclCreateTensor takes them).
    Keeps its buffer alive; the buffer is freed with its last tensor."""

    __slots__ = ("session", "buffer", "dtype", "shape", "strides", "offset",
                 "buffer_offset", "desc", "_keep")

    def __init__(self, session, buffer, dtype, shape, strides=None, offset=0,
                 buffer_offset=0, _keep=None):
        self.session = session
        self.buffer = buffer
        self.dtype = DType(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.strides = (tuple(int(s) for s in strides) if strides is not None
                        else tuple(_contiguous_strides(self.shape)))
        self.offset = int(offset)
        self.buffer_offset = int(buffer_offset)
        self._keep = _keep
        # The wire description, built once: operators take it as it is.
        self.desc = _opserver.TensorDesc(
            buffer.handle, int(self.dtype), list(self.shape),
            list(self.strides) if strides is not None else [], self.offset,
            self.buffer_offset)

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def view(self, shape, strides=None, offset=0):
        """Another view of the same storage (strides/offset in elements)."""
        return DeviceTensor(self.session, self.buffer, self.dtype, shape,
                            strides, offset, self.buffer_offset, self._keep)

    def _span(self):
        """(first, count) elements of the storage this view covers."""
        if self.numel == 0:
            return self.offset, 0
        lo = hi = self.offset
        for d, s in zip(self.shape, self.strides):
            if s >= 0:
                hi += (d - 1) * s
            else:
                lo += (d - 1) * s
        return lo, hi - lo + 1

    def _download_into(self, flat, stream):
        first, count = self._span()
        size = _opserver.dtype_size(int(self.dtype))
        self.session._s.download(self.buffer.handle,
                                 self.buffer_offset + first * size,
                                 flat[:count] if count else flat[:0],
                                 _stream(stream))
        return first

    def numpy(self, stream=None):
        """Downloads the view into a new numpy array (waits for the work
        queued on `stream` and raises its deferred error)."""
        import numpy as np
        dt = _numpy_dtype(self.dtype)
        first, count = self._span()
        storage = np.empty(count, dt)
        self._download_into(storage, stream)
        if list(self.strides) == _contiguous_strides(self.shape):
            return storage.reshape(self.shape)
        view = np.lib.stride_tricks.as_strided(
            storage[self.offset - first:] if count else storage,
            self.shape, [s * dt.itemsize for s in self.strides])
        return np.array(view)

    def torch(self, stream=None):
        """Downloads the view into a new torch CPU tensor (bfloat16 too)."""
        import torch
        first, count = self._span()
        storage = torch.empty(count,
                              dtype=getattr(torch, _TORCH_NAMES[self.dtype]))
        self._download_into(_host_bytes(storage, writable=True), stream)
        return torch.as_strided(storage, self.shape, self.strides,
                                self.offset - first).clone() \
            if list(self.strides) != _contiguous_strides(self.shape) \
            else storage.reshape(self.shape)

    def __repr__(self):
        return "DeviceTensor(%s, shape=%s, buffer=%d)" % (
            self.dtype.name, list(self.shape), self.buffer.handle)


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


class Client:
    """A connection to one opserver. Made by ``connect``."""

    def __init__(self, client):
        self._c = client

    @property
    def address(self):
        return self._c.address

    def device_info(self):
        return json.loads(self._c.device_info())

    def health(self, service=""):
        return self._c.health(service)

    def session(self, name="python", attach=True, device=0):
        """Opens a session; use it as a context manager to close it. With
        `attach`, the server also frees it if this process dies. `device` is
        the server's device the session runs on (an index into
        ``device_info()["devices"]``)."""
        return Session(self._c.create_session(name, attach, device))


class Pool:
    """The devices of a pool of opservers registered in etcd, as one list of
    ordinals: the C API's for the same OPSERVER_ADDRESS (docs/pool.md).
    Made by ``connect("etcd://HOST:PORT/PREFIX")``. With a claim, the
    ordinals are exactly the claimed devices, held until ``close()`` (or
    until the pool is garbage, or the process dies: the claim's lease)."""

    def __init__(self, address, device_set):
        self._address = address
        self._d = device_set

    @property
    def address(self):
        return self._address

    def __len__(self):
        return self._d.size

    @property
    def devices(self):
        """One dict per ordinal, in order: ``address`` (the server),
        ``device`` (its index there) and ``info`` (the server's
        DeviceInfo)."""
        devices = []
        for ordinal in range(self._d.size):
            address, device, info = self._d.device(ordinal)
            devices.append({"address": address, "device": device,
                            "info": json.loads(info)})
        return devices

    def session(self, name="python", attach=True, device=0):
        """Opens a session on pool ordinal `device`; as ``Client.session``.
        Raises ``opserver.InvalidArgument`` naming the count past the last
        ordinal."""
        return Session(self._d.create_session(device, name, attach))

    def close(self):
        """Releases the claim now: its devices are free for other jobs.
        Sessions already open go on. Without a claim, does nothing."""
        self._d.release_claim()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_ETCD_SCHEME = "etcd://"


def connect(address, *, tls_ca_file=None, tls_cert_file=None,
            tls_key_file=None, tls_server_name=None, token=None,
            pipeline=True, data_path=True, connect_timeout=5.0,
            call_timeout=30.0, wait_timeout=600.0, transfer_connections=None,
            max_message_bytes=None, claim=None, claim_wait_s=None,
            claim_ttl_s=None):
    """Connects to the opserver at HOST:PORT and waits until it answers.

    TLS is used when any tls_* file is given (the CA that signed the
    server's certificate; a certificate and key for mTLS). `token` is sent
    as a bearer token with every call. `pipeline=False` makes every call
    its own RPC (for debugging). Timeouts are in seconds. Raises
    ``opserver.InvalidArgument`` for an address that is not HOST:PORT, and
    ``opserver.Unavailable`` naming the cause when no server answers: at
    once for a refused connection or a failed handshake, after
    `connect_timeout` for a host that does not answer.

    ``etcd://HOST:PORT[,HOST:PORT...]/PREFIX`` gives a ``Pool`` of the
    devices opservers registered there (``--register``), in the C API's
    order; the other options apply to every server. `claim=N` claims N
    free devices, which are then the pool's ordinals (``ResourceExhausted``
    when fewer are free, after waiting `claim_wait_s` seconds);
    `claim_ttl_s` is how long a dead job's claim lasts (default 10). Each
    one not given is read from OPSERVER_CLAIM, OPSERVER_CLAIM_WAIT_S and
    OPSERVER_CLAIM_TTL_S, as the C API does; etcd's TLS and user come from
    OPSERVER_ETCD_* (docs/pool.md).
    """
    options = dict(
        tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file, tls_server_name=tls_server_name,
        token=token, pipeline=pipeline, data_path=data_path,
        connect_timeout=connect_timeout, call_timeout=call_timeout,
        wait_timeout=wait_timeout, transfer_connections=transfer_connections,
        max_message_bytes=max_message_bytes)
    if address.startswith(_ETCD_SCHEME):
        return Pool(address, _opserver.DeviceSet.connect(
            address, claim=claim, claim_wait_s=claim_wait_s,
            claim_ttl_s=claim_ttl_s, **options))
    for name, value in (("claim", claim), ("claim_wait_s", claim_wait_s),
                        ("claim_ttl_s", claim_ttl_s)):
        if value is not None:
            raise InvalidArgument(3, 161002, "%s= needs an etcd:// address "
                                  "(a pool); %s is one server" %
                                  (name, address))
    return Client(_opserver.Client.connect(address, **options))
