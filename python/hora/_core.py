"""Context and blocking collectives, in Horovod's shape (hora.init, hora.allreduce, ...).

The module holds one hora context per process. Every collective must be called by every rank in
the same order with matching shapes and dtypes, as in Horovod and MPI. The C calls release the GIL
(cffi does that for every call), so other Python threads keep running while one rank waits.
"""
import atexit
import faulthandler
import functools
import os
import sys
import threading

import numpy as np

from . import _buffers as B
from . import _horovod_env
from ._errors import NotInitializedError, MismatchError, check, invalid
from ._hora_cffi import ffi, lib

Sum = lib.HORA_SUM
Average = lib.HORA_AVERAGE
Min = lib.HORA_MIN
Max = lib.HORA_MAX
Product = lib.HORA_PRODUCT
Adasum = lib.HORA_ADASUM  # float32/float64 host arrays, power-of-two sizes (hora.h)
_NP_TO_HORA = B.NP_TO_HORA
_HOST = B.HOST
_from_buffer = ffi.from_buffer
_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product",
             Adasum: "Adasum"}


class _State:
    def __init__(self):
        self.ctx = None  # hora_ctx_t *, or None before init / after shutdown
        self.was_shut_down = False
        self.lock = threading.Lock()
        self.finalizers = []  # callables run by shutdown() before hora_finalize (handles, ...)
        self.failed = False  # an uncaught exception ended the program
        self.pid = None  # the process that ran init(): a fork() child of it must not finalize


_state = _State()


def _ctx():
    c = _state.ctx
    if c is None:  # not initialized, or shut down
        if _state.was_shut_down:
            raise NotInitializedError("hora was shut down (hora.shutdown()); call hora.init() "
                                      "again before using it (possible where MPI was started "
                                      "before hora, for example by mpi4py: where hora started "
                                      "it, shutdown() finalized it)", lib.HORA_ERR_NOT_INITIALIZED)
        raise NotInitializedError("hora is not initialized: call hora.init() first",
                                  lib.HORA_ERR_NOT_INITIALIZED)
    return c


def _mpi_comm_handle(comm):
    """The MPI_Comm (a pointer with Open MPI) of an mpi4py communicator, as void *."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise invalid("init(comm=...): comm must be an mpi4py communicator, and mpi4py is not "
                      "installed") from None
    if not isinstance(comm, MPI.Comm):
        raise invalid(f"init(comm=...): expected an mpi4py MPI.Comm, got {type(comm).__name__}")
    addr = MPI._addressof(comm)
    return ffi.cast("void **", addr)[0]


def init(comm=None):
    """Start hora in this process (collective over the job, or over `comm`).

    comm: None for the whole job (MPI_COMM_WORLD), or an mpi4py communicator that hora dups.
    MPI is started by hora unless it already is (for example by mpi4py); hora then finalizes it in
    shutdown(). Calling init() again while hora is running does nothing, like Horovod. Raises
    LayoutError when the processes were started without a working PMI (each one alone), MPIError
    when MPI cannot start, InvalidArgumentError for a malformed HORA_* variable, a malformed
    HOROVOD_* variable, or the two contradicting each other. Horovod's HOROVOD_* settings
    (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME, HOROVOD_TIMELINE, ...) are honoured through
    their HORA_* counterparts (_horovod_env.py, docs/horovod.md).
    """
    with _state.lock:
        if _state.ctx is not None:
            return
        notes = _horovod_env.apply()  # HOROVOD_* job settings -> HORA_* (before hora_init reads them)
        out = ffi.new("hora_ctx_t **")
        if comm is None:
            check(lib.hora_init(out), "hora.init")
        else:
            opts = ffi.new("hora_init_opts_t *")
            opts.size = ffi.sizeof("hora_init_opts_t")
            opts.mpi_comm = _mpi_comm_handle(comm)
            check(lib.hora_init_ex(opts, out), "hora.init")
        _state.ctx = out[0]
        _state.pid = os.getpid()
        _state.was_shut_down = False
        _enable_faulthandler()
    _horovod_env.warn(notes, rank())


def _enable_faulthandler():
    """A rank that crashes in native code (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) says where
    in the Python program: Python's faulthandler prints every thread's Python stack, then passes
    the signal on to the handler that hora_init installed, which prints hora's line (rank, node,
    pid) and the C stack and ends the process by the signal. Enabled after hora_init, so that the
    order is this one; left as it is when the program enabled faulthandler itself (then hora_init
    kept that handler and installed none: docs/fault-tolerance.md). Not possible where stderr has
    no file descriptor (some notebooks): skipped."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(all_threads=True)
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass


def shutdown():
    """Stop hora: waits for outstanding work, stops the engine and checkpoint threads and
    finalizes MPI if hora started it. Collective. A no-op when hora is not running. Afterwards
    every hora call raises NotInitializedError until init() is called again."""
    with _state.lock:
        c = _state.ctx
        if c is None:
            return
        fins = list(_state.finalizers)  # registered once at import: run at every shutdown
        first = None
        for f in fins:
            try:
                f()
            except Exception as e:  # keep going: the context must be finalized in any case
                first = first or e
        _state.ctx = None
        _state.was_shut_down = True
        check(lib.hora_finalize(c), "hora.shutdown")
        if first is not None:
            raise first


def is_initialized():
    """True between init() and shutdown()."""
    return _state.ctx is not None


def _add_finalizer(fn):
    _state.finalizers.append(fn)


# An uncaught exception must not turn into a collective hora_finalize at exit: the other ranks
# may be waiting in a collective this rank never reaches, and a finalize would then hang them
# all. Without it, mpirun/srun sees the non-zero exit and ends the job with the traceback shown.
_prev_excepthook = sys.excepthook


def _excepthook(tp, value, tb):
    _state.failed = True
    if _state.ctx is not None and _state.pid == os.getpid():
        # Save the timeline's last second of events (rank 0; local, never waits for a peer).
        lib.hora_timeline_stop(_state.ctx)
    _prev_excepthook(tp, value, tb)


sys.excepthook = _excepthook


@atexit.register
def _shutdown_at_exit():
    # A child made by os.fork() from a rank inherits the context but none of its threads or MPI
    # state: finalizing there would wait forever (libhora refuses it, hora.shutdown() raises
    # NotSupportedError). Its parent shuts hora down.
    if _state.pid != os.getpid():
        return
    if _state.ctx is not None and not _state.failed:
        try:
            shutdown()
        except Exception as e:  # at exit there is nobody left to raise to
            sys.stderr.write(f"hora: shutdown at exit failed: {e}\n")


def _layout(fn):
    out = ffi.new("int *")
    check(fn(_ctx(), out))
    return out[0]


def rank():
    """This process's rank in the job, 0 .. size()-1."""
    return _layout(lib.hora_rank)


def size():
    """Number of ranks in the job (world size)."""
    return _layout(lib.hora_size)


def local_rank():
    """Rank among the ranks on this node."""
    return _layout(lib.hora_local_rank)


def local_size():
    """Number of ranks on this node."""
    return _layout(lib.hora_local_size)


def cross_rank():
    """Index of this node among the job's nodes."""
    return _layout(lib.hora_cross_rank)


def cross_size():
    """Number of nodes in the job."""
    return _layout(lib.hora_cross_size)


def _op(op):
    if type(op) is int and 0 <= op <= 4:  # the common case, checked first (hot path)
        return op
    if isinstance(op, np.integer):
        op = int(op)
    if op not in _OP_NAMES or isinstance(op, bool) or not isinstance(op, int):
        raise invalid(f"op {op!r} is not one of hora.Sum, hora.Average, hora.Min, hora.Max, "
                      f"hora.Product, hora.Adasum")
    return op


def _scale(v, what):
    if type(v) is float:
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise invalid(f"{what} must be a number, got {type(v).__name__}") from None
    return f


def _root(root_rank):
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise invalid(f"root_rank must be an int, got {type(root_rank).__name__}")
    return int(root_rank)


# ---- allreduce -----------------------------------------------------------------------------

def _shape_fp(shape):
    # The fingerprint of the cross-rank call check (hora_set_call_shape): a deterministic digest of
    # the shape (hash() of an int tuple does not depend on PYTHONHASHSEED), never 0 (unchecked).
    return (hash(tuple(shape)) & 0x7FFFFFFFFFFFFFFF) | 1



def _refused_blocking(fn):
    """Wrap a blocking collective: an argument error raised here before the call reached
    libhora (a non-contiguous array, an unsupported dtype, a bad root or splits) still takes part
    in the call check as "invalid arguments" (hora_refuse), as libhora's own argument errors do,
    so that the other ranks' call raises MismatchError naming this rank instead of waiting for it,
    or meeting this rank's next call with other data (a sum of another array, no error). An error
    from libhora (marked by make_error) took part already."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            _refuse_blocking(e)
            raise
    return call


def _refuse_blocking(e):
    """_refused_blocking's refusal of the call that raised e (allreduce_ and allreduce run it
    inline: a wrapper's extra call cost their hot path 0.17 us of 1.5)."""
    if not getattr(e, "_hora_c", False) and _state.ctx is not None:
        lib.hora_refuse(_state.ctx)  # its own result: the caller gets the call's error
        try:
            e._hora_c = True  # an outer call refuses nothing more
        except AttributeError:
            pass


def _allreduce_buf(ctx, what, b, o, op, pre, post, name):
    """The general path of allreduce_ and allreduce: hora_allreduce of buffer b into o (b itself
    in place), any kind of tensor B.as_buf takes."""
    args = (_op(op), _scale(pre, "prescale_factor"), _scale(post, "postscale_factor"), b.device)
    lib.hora_set_call_shape(ctx, _shape_fp(b.shape))  # last, right before the call that takes it
    check(lib.hora_allreduce(ctx, b.ptr, o.ptr, b.count, b.dtype, *args), what, (name, b.shape))


def allreduce_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """In-place allreduce: tensor[i] = postscale * OP over ranks of (prescale * tensor[i]).

    tensor: NumPy array or DLPack tensor, C-contiguous, same shape and dtype on every rank.
    Average divides by the world size (integers: truncating). Scale factors apply to floating
    dtypes only (integers need 1.0). Collective. Returns tensor."""
    try:
        ctx = _state.ctx or _ctx()
        # Hot path of a training loop: a contiguous, writable NumPy array of a hora dtype is handled
        # inline (about 0.5 us less than the general path below, which also explains rejections).
        if type(tensor) is np.ndarray:
            dt = _NP_TO_HORA.get(tensor.dtype)
            fl = tensor.flags
            if dt is not None and fl.c_contiguous and fl.writeable:
                p = _from_buffer(tensor)
                args = (_op(op), _scale(prescale_factor, "prescale_factor"),
                        _scale(postscale_factor, "postscale_factor"), _HOST)
                # The shape tag is set last, right before the call that takes it (a Python error in
                # between would leave it for the next call).
                lib.hora_set_call_shape(ctx, _shape_fp(tensor.shape))
                rc = lib.hora_allreduce(ctx, p, p, tensor.size, dt, *args)
                if rc:
                    check(rc, "hora.allreduce_", (name, tensor.shape))
                return tensor
        b = B.as_buf(tensor, "allreduce_(tensor)", writable=True)
        _allreduce_buf(ctx, "hora.allreduce_", b, b, op, prescale_factor, postscale_factor, name)
        return tensor
    except Exception as e:
        _refuse_blocking(e)
        raise


def allreduce(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Allreduce into a new array of tensor's kind, shape and dtype (see allreduce_). `name` is
    accepted for Horovod compatibility (the blocking call does not need it). Collective."""
    try:
        ctx = _state.ctx or _ctx()
        if type(tensor) is np.ndarray:  # hot path, as in allreduce_
            dt = _NP_TO_HORA.get(tensor.dtype)
            if dt is not None and tensor.flags.c_contiguous:
                out = np.empty(tensor.shape, tensor.dtype)
                args = (_op(op), _scale(prescale_factor, "prescale_factor"),
                        _scale(postscale_factor, "postscale_factor"), _HOST)
                lib.hora_set_call_shape(ctx, _shape_fp(tensor.shape))
                rc = lib.hora_allreduce(ctx, _from_buffer(tensor), _from_buffer(out), tensor.size,
                                        dt, *args)
                if rc:
                    check(rc, "hora.allreduce", (name, tensor.shape))
                return out
        b = B.as_buf(tensor, "allreduce(tensor)")
        out = B.empty_like(tensor)
        o = B.as_buf(out, "allreduce output", writable=True)
        _allreduce_buf(ctx, "hora.allreduce", b, o, op, prescale_factor, postscale_factor, name)
        return out
    except Exception as e:
        _refuse_blocking(e)
        raise


# ---- broadcast -----------------------------------------------------------------------------

@_refused_blocking
def broadcast_(tensor, root_rank, name=None):
    """In place: every rank's tensor becomes root_rank's. Collective. Returns tensor."""
    ctx = _ctx()
    b = B.as_buf(tensor, "broadcast_(tensor)", writable=True)
    root = _root(root_rank)
    lib.hora_set_call_shape(ctx, _shape_fp(b.shape))
    check(lib.hora_broadcast(ctx, b.ptr, b.count, b.dtype, root, b.device),
          "hora.broadcast_", (name, b.shape))
    return tensor


@_refused_blocking
def broadcast(tensor, root_rank, name=None):
    """A new array holding root_rank's tensor (same shape and dtype on every rank). Collective."""
    ctx = _ctx()
    B.as_buf(tensor, "broadcast(tensor)")
    out = B.empty_like(tensor)
    B.copy_into(out, tensor)
    o = B.as_buf(out, "broadcast output", writable=True)
    root = _root(root_rank)
    lib.hora_set_call_shape(ctx, _shape_fp(o.shape))
    check(lib.hora_broadcast(ctx, o.ptr, o.count, o.dtype, root, o.device),
          "hora.broadcast", (name, o.shape))
    return out


# ---- allgather ------------------------------------------------------------------------------

def _shape_key(shape):
    # A deterministic 63-bit digest of the trailing shape (hash() of an int tuple does not depend
    # on PYTHONHASHSEED).
    return hash(tuple(int(s) for s in shape)) & 0x7FFFFFFFFFFFFFFF


def _gather_meta(ctx, values):
    """allgather of a few int64 per rank -> array [size, len(values)]."""
    n = _layout(lib.hora_size)
    send = np.asarray(values, dtype=np.int64)
    recv = np.empty((n, send.size), dtype=np.int64)
    check(lib.hora_allgather(ctx, ffi.from_buffer(send), ffi.from_buffer(recv), send.size,
                             lib.HORA_INT64, B.HOST), "hora.allgather (shapes)")
    return recv


@_refused_blocking
def allgather(tensor, name=None):
    """Concatenation along the first dimension of every rank's tensor, in rank order.

    The first dimension may differ between ranks (as in Horovod); the other dimensions and the
    dtype must match, else every rank raises MismatchError naming the ranks. A 0-d tensor is an
    InvalidArgumentError. Collective: every rank gets the same result."""
    ctx = _ctx()
    b = B.as_buf(tensor, "allgather(tensor)")
    if len(b.shape) == 0:
        raise invalid("allgather(tensor): a 0-d tensor has no first dimension to concatenate; "
                      "pass x.reshape(1)")
    row = 1
    for s in b.shape[1:]:
        row *= s
    meta = _gather_meta(ctx, [b.shape[0], row, b.dtype, len(b.shape), _shape_key(b.shape[1:]),
                              b.device])
    mine = meta[_layout(lib.hora_rank)]
    bad = [r for r in range(meta.shape[0]) if not (meta[r, 1:] == mine[1:]).all()]
    if bad:
        rows = "; ".join(f"rank {r}: dtype {B.DTYPE_NAMES.get(int(meta[r, 2]), meta[r, 2])}, "
                         f"ndim {meta[r, 3]}, {meta[r, 1]} elements per row"
                         for r in range(meta.shape[0]))
        e = MismatchError(f"allgather: ranks disagree on dtype or trailing shape ({rows})",
                          lib.HORA_ERR_MISMATCH)
        e._hora_c = True  # every rank raises it, after the shapes' exchange: no refusal
        raise e
    firsts = [int(v) for v in meta[:, 0]]
    out = B.empty_like(tensor, (sum(firsts),) + tuple(b.shape[1:]))
    o = B.as_buf(out, "allgather output", writable=True)
    if all(f == firsts[0] for f in firsts):
        check(lib.hora_allgather(ctx, b.ptr, o.ptr, b.count, b.dtype, b.device),
              "hora.allgather")
    else:
        counts = ffi.new("size_t[]", [f * row for f in firsts])
        check(lib.hora_allgatherv(ctx, b.ptr, b.count, o.ptr, counts, b.dtype, b.device),
              "hora.allgather")
    return out


# ---- reducescatter --------------------------------------------------------------------------

def _split_sizes(n, parts):
    # Horovod's split of a first dimension of n rows over `parts` ranks: the first n % parts
    # ranks get one row more.
    return [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


@_refused_blocking
def reducescatter(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduce over ranks, then scatter along the first dimension: rank r gets its block of
    rows (the first dim % size ranks get one row more, as in Horovod) of
    postscale * OP over ranks of (prescale * tensor). Same shape and dtype on every rank (the
    shape is checked, not only the count), and the same scale factors (floating dtypes only,
    as in allreduce). When the first dimension divides evenly this is hora's reduce-scatter;
    otherwise it is an allreduce of the whole tensor followed by a slice (correct, twice the
    traffic). Collective. Returns a new array."""
    ctx = _ctx()
    b = B.as_buf(tensor, "reducescatter(tensor)")
    if len(b.shape) == 0:
        raise invalid("reducescatter(tensor): a 0-d tensor cannot be split across ranks")
    pre = _scale(prescale_factor, "prescale_factor")
    post = _scale(postscale_factor, "postscale_factor")
    n, me = _layout(lib.hora_size), _layout(lib.hora_rank)
    sizes = _split_sizes(b.shape[0], n)
    out = B.empty_like(tensor, (sizes[me],) + tuple(b.shape[1:]))
    o = B.as_buf(out, "reducescatter output", writable=True)
    if b.shape[0] % n == 0:
        lib.hora_set_call_shape(ctx, _shape_fp(b.shape))
        check(lib.hora_reducescatter(ctx, b.ptr, o.ptr, o.count, b.dtype, _op(op), pre, post,
                                     b.device), "hora.reducescatter")
        return out
    full = allreduce(tensor, op=op, prescale_factor=pre, postscale_factor=post)
    start = sum(sizes[:me])
    B.copy_into(out, full[start:start + sizes[me]])
    return out


# ---- alltoall -------------------------------------------------------------------------------

@_refused_blocking
def alltoall(tensor, splits=None, name=None):
    """Scatter blocks of rows to every rank and gather what they send.

    splits None: the first dimension must divide by size(); block p (rows p*k .. p*k+k-1) goes to
    rank p, and the result has tensor's shape, holding at block p what rank p sent. Returns the
    result array.
    splits: `size()` non-negative ints summing to the first dimension; splits[p] rows go to rank p.
    Returns (result, received_splits), with received_splits[p] rows from rank p (NumPy int64),
    as Horovod's alltoall with splits. Collective."""
    ctx = _ctx()
    b = B.as_buf(tensor, "alltoall(tensor)")
    if len(b.shape) == 0:
        raise invalid("alltoall(tensor): a 0-d tensor cannot be split across ranks")
    n = _layout(lib.hora_size)
    row = 1
    for s in b.shape[1:]:
        row *= s
    if splits is None:
        if b.shape[0] % n:
            raise invalid(f"alltoall(tensor): the first dimension {b.shape[0]} does not divide "
                          f"by the world size {n}; pass splits=")
        out = B.empty_like(tensor)
        o = B.as_buf(out, "alltoall output", writable=True)
        check(lib.hora_alltoall(ctx, b.ptr, o.ptr, b.count // n, b.dtype, b.device),
              "hora.alltoall")
        return out
    try:
        sp = np.asarray(splits, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise invalid(f"alltoall(splits=...): expected {n} ints, got {splits!r}") from None
    if sp.size != n or (sp < 0).any() or int(sp.sum()) != b.shape[0]:
        raise invalid(f"alltoall(splits={sp.tolist()}): need {n} non-negative ints (one per "
                      f"rank) summing to the first dimension {b.shape[0]}")
    rsp = np.empty(n, dtype=np.int64)
    check(lib.hora_alltoall(ctx, ffi.from_buffer(sp), ffi.from_buffer(rsp), 1, lib.HORA_INT64,
                            B.HOST), "hora.alltoall (splits)")
    out = B.empty_like(tensor, (int(rsp.sum()),) + tuple(b.shape[1:]))
    o = B.as_buf(out, "alltoall output", writable=True)
    scounts = ffi.new("size_t[]", [int(v) * row for v in sp])
    rcounts = ffi.new("size_t[]", [int(v) * row for v in rsp])
    check(lib.hora_alltoallv(ctx, b.ptr, scounts, o.ptr, rcounts, b.dtype, b.device),
          "hora.alltoall")
    return out, rsp


def barrier():
    """Return once every rank has entered barrier(). Collective."""
    check(lib.hora_barrier(_ctx()), "hora.barrier")
