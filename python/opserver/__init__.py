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

# The package is split in private modules (_dtypes, _tensor, _handles,
# _session, _connect); every name is used from here, as ``opserver.X``.
from opserver import _opserver  # noqa: F401
from opserver._connect import Client, Pool, connect, _ETCD_SCHEME  # noqa: F401
from opserver._dtypes import (  # noqa: F401
    DType, Scalar, bfloat16, bool_, dtype_of, float16, float32, float64,
    int32, int64, int8, uint8, _FROM_NUMPY, _FROM_TORCH, _NUMPY_NAMES,
    _TORCH_NAMES, _host_bytes, _is_torch, _numpy_dtype)
from opserver._handles import (  # noqa: F401
    Executor, Graph, GraphRecorder, _PendingRead)
from opserver._session import (  # noqa: F401
    Session, operators, _make_operator, _snake)
from opserver._tensor import (  # noqa: F401
    DeviceTensor, _broadcast, _contiguous_strides, _stream)
from opserver.errors import (  # noqa: F401  (re-exported)
    Error, Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound,
    AlreadyExists, PermissionDenied, ResourceExhausted, FailedPrecondition,
    Aborted, OutOfRange, Unimplemented, Internal, Unavailable, DataLoss,
    Unauthenticated)

__all__ = [
    "connect", "Client", "Pool", "Session", "DeviceTensor", "Executor", "DType",
    "Scalar", "Error", "operators", "Graph", "GraphRecorder",
]

# The classes say they are opserver's, as they did before the split
# (help(), repr of the class, pickling by name).
for _cls in (Client, Pool, Session, DeviceTensor, Executor, DType, Graph,
             GraphRecorder, _PendingRead):
    _cls.__module__ = __name__
del _cls
