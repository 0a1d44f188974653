"""hora's exceptions: one class per result code of runtime/core/result.def.

Every failed C call becomes an instance of the class of its result code, carrying the C library's
detailed message (hora_last_error()). Classes also derive from the closest built-in exception, so
`except ValueError` catches a bad argument and `except OSError` a failed file operation.
"""
import builtins

from ._hora_cffi import ffi, lib


class HoraError(RuntimeError):
    """Base of every hora error. Attributes: code (int result code), name ("HORA_ERR_MPI"),
    message (the detailed message of the C library, or of the Python layer)."""

    code = None
    name = "HORA_ERROR"

    def __init__(self, message, code=None):
        if code is not None:
            self.code = code
            self.name = ffi.string(lib.hora_result_name(code)).decode()
        self.message = message
        super().__init__(f"{message} [{self.name}]")


class HorovodInternalError(HoraError):
    """Horovod's name for an operation that failed across ranks (RuntimeError subclass): a lost
    peer, a shutdown, ranks that disagree on a tensor, a failed transport. `except
    HorovodInternalError` (as hvd.elastic does) catches all of them."""


class InvalidArgumentError(HoraError, ValueError):
    """A bad argument: wrong type or dtype, non-contiguous array, out-of-range value."""


class NotInitializedError(HoraError, ValueError):
    """hora.init() was not called, or hora.shutdown() already ran. Also a ValueError: Horovod's
    rank(), size(), start_timeline() and the rest raise ValueError before init, and programs test
    for an initialized Horovod with `except ValueError`."""


class NotSupportedError(HoraError, NotImplementedError):
    """The feature was built OFF or the hardware is missing."""


class NoMemoryError(HoraError, MemoryError):
    """An allocation in the C library failed."""


class MPIError(HorovodInternalError):
    """An MPI call failed."""


class CUDAError(HoraError):
    """A CUDA runtime call or kernel launch failed."""


class NCCLError(HorovodInternalError):
    """An NCCL call failed."""


class MismatchError(HorovodInternalError, ValueError):
    """Ranks disagree on a collective: which one (call sequence), or a tensor's count, dtype,
    shape, op, root or device. Raised on every rank; also a ValueError (a bad argument on some
    rank) and a HorovodInternalError (Horovod's class for a failed collective)."""


class TimeoutError(HorovodInternalError, builtins.TimeoutError):  # noqa: A001 (hora.TimeoutError on purpose)
    """A stall or peer timeout expired."""


class RemoteError(HorovodInternalError):
    """Another rank died or failed; the message names it."""


class IOError(HoraError, OSError):  # noqa: A001
    """A file system call failed (disk full, permission, ...)."""


class DataError(HoraError):
    """Corrupt or truncated input (checksum, framing)."""


class LayoutError(HoraError):
    """The launcher/Slurm layout and the MPI world disagree."""


class NotFoundError(HoraError, LookupError):
    """Nothing to restore, no such file, no such name."""


class CorruptError(HoraError):
    """Checkpoints exist but none is valid (the message names each and why): do not start over."""


class InternalError(HoraError):
    """A bug in hora: please report it."""


class ShutdownError(HorovodInternalError):
    """The operation was cancelled because hora is shutting down."""


_BY_NAME = {
    "HORA_ERR_INVALID_ARGUMENT": InvalidArgumentError,
    "HORA_ERR_NOT_INITIALIZED": NotInitializedError,
    "HORA_ERR_NOT_SUPPORTED": NotSupportedError,
    "HORA_ERR_NO_MEMORY": NoMemoryError,
    "HORA_ERR_MPI": MPIError,
    "HORA_ERR_CUDA": CUDAError,
    "HORA_ERR_NCCL": NCCLError,
    "HORA_ERR_MISMATCH": MismatchError,
    "HORA_ERR_TIMEOUT": TimeoutError,
    "HORA_ERR_REMOTE": RemoteError,
    "HORA_ERR_IO": IOError,
    "HORA_ERR_DATA": DataError,
    "HORA_ERR_LAYOUT": LayoutError,
    "HORA_ERR_NOT_FOUND": NotFoundError,
    "HORA_ERR_INTERNAL": InternalError,
    "HORA_ERR_SHUTDOWN": ShutdownError,
    "HORA_ERR_CORRUPT": CorruptError,
}

# Result code -> class, built from the C library's own names so that the two cannot drift.
# Codes appended to result.def later map to HoraError until a class is added here.
_BY_CODE = {}
for _name, _cls in _BY_NAME.items():
    _code = getattr(lib, _name)
    _cls.code = _code
    _cls.name = _name
    _BY_CODE[_code] = _cls


def error_class(code):
    return _BY_CODE.get(int(code), HoraError)


def make_error(code, what=None, tensor=None):
    """The exception for result `code` of the C call just made on this thread. tensor: (name,
    shape) of the tensor of a blocking collective, named in a MismatchError's message."""
    msg = ffi.string(lib.hora_last_error()).decode(errors="replace")
    if not msg:
        msg = ffi.string(lib.hora_strerror(code)).decode(errors="replace")
    if tensor is not None and code == lib.HORA_ERR_MISMATCH:
        name, shape = tensor
        label = f"tensor '{name}'" if name else "tensor"
        msg = f"{what}: {label} of shape {tuple(shape)}: {msg}"
    elif what and what not in msg and not msg.startswith("hora_"):
        msg = f"{what}: {msg}"
    e = error_class(code)(msg, code)
    e._hora_c = True  # from libhora: a blocking call that fails there took part in its call check
    return e


def check(rc, what=None, tensor=None):
    """Raise the error of result code rc (a hora_result_t), if it is not HORA_SUCCESS."""
    if rc != 0:
        raise make_error(rc, what, tensor)


def invalid(message):
    """An InvalidArgumentError raised by the Python layer (nothing was passed to C)."""
    return InvalidArgumentError(message, lib.HORA_ERR_INVALID_ARGUMENT)
