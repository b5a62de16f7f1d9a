"""The exceptions opserver raises.

Every failure is an ``opserver.Error``; its subclass follows the gRPC code
(``InvalidArgument``, ``NotFound``, ``ResourceExhausted``, ``Unavailable``,
...). Each carries:

* ``code``: the gRPC status code as a number (3 = INVALID_ARGUMENT);
* ``code_name``: its name ("INVALID_ARGUMENT");
* ``aclnn_status``: aclnn's status (161001 a missing argument, 161002 any
  other bad argument, 361001 a runtime failure, 0 where none applies);
* ``message``: the server's (or the client's) message.

``InvalidArgument`` is also a ``ValueError``, as a bad value is in Python
(an argument out of range, such as ``connect(..., claim=-1)``); an argument
of the wrong type raises ``TypeError``.

    try:
        session.threshold_backward(grad, x, 1.0, out=wrong_dtype)
    except opserver.InvalidArgument as e:
        print(e.aclnn_status, e.message)
"""

_CODE_NAMES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]


class Error(Exception):
    """A failed opserver call."""

    def __init__(self, code, aclnn_status, message):
        self.code = code
        self.code_name = (_CODE_NAMES[code] if 0 <= code < len(_CODE_NAMES)
                          else "CODE_%d" % code)
        self.aclnn_status = aclnn_status
        self.message = message
        super().__init__("%s (aclnn %d): %s" %
                         (self.code_name, aclnn_status, message))


class Cancelled(Error): pass
class Unknown(Error): pass
class InvalidArgument(Error, ValueError): pass
class DeadlineExceeded(Error): pass
class NotFound(Error): pass
class AlreadyExists(Error): pass
class PermissionDenied(Error): pass
class ResourceExhausted(Error): pass
class FailedPrecondition(Error): pass
class Aborted(Error): pass
class OutOfRange(Error): pass
class Unimplemented(Error): pass
class Internal(Error): pass
class Unavailable(Error): pass
class DataLoss(Error): pass
class Unauthenticated(Error): pass

_BY_CODE = {
    1: Cancelled, 2: Unknown, 3: InvalidArgument, 4: DeadlineExceeded,
    5: NotFound, 6: AlreadyExists, 7: PermissionDenied, 8: ResourceExhausted,
    9: FailedPrecondition, 10: Aborted, 11: OutOfRange, 12: Unimplemented,
    13: Internal, 14: Unavailable, 15: DataLoss, 16: Unauthenticated,
}


def from_status(code, aclnn_status, message):
    """The exception for a failed status (the C++ binding calls this)."""
    return _BY_CODE.get(code, Error)(code, aclnn_status, message)
