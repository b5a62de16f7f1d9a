"""DType, its numpy and torch names, and host arrays as bytes."""

import enum

from opserver import _opserver
from opserver.errors import InvalidArgument


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
