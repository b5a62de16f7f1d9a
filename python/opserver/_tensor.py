"""DeviceTensor: a view of a device buffer, and the shape arithmetic of
views."""

from opserver import _opserver
from opserver._dtypes import (DType, _TORCH_NAMES, _host_bytes,
                              _numpy_dtype)
from opserver.errors import InvalidArgument


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
