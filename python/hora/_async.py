"""Asynchronous collectives through hora's engine: allreduce_async, grouped_allreduce, join.

A call submits the tensor to the engine's background thread, which negotiates across ranks by
name, fuses small tensors into one buffer and runs the allreduce; the call returns at once with a
Handle. Tensors are matched across ranks by `name`, so ranks may submit in any order; every rank
must submit every name. Without a name, the n-th unnamed call of a rank is named
"allreduce.noname.<n>", which matches across ranks only when they submit in the same order (as in
Horovod).

Restrictions: the memory of a submitted tensor (and of its output) must not be changed or freed
until the handle completes; the Handle keeps a reference to both, so dropping the Python object
early is safe.
"""
import collections
import functools
import inspect
import threading
import time
import weakref

from . import _buffers as B
from ._core import Average, _add_finalizer, _ctx, _op, _root, _scale, _shape_fp
from ._core import size as _size
from ._errors import check, invalid, make_error
from ._hora_cffi import ffi, lib



class NameCounter:
    """The number of the next unnamed request ("<kind>.noname.<n>"), one counter per module
    (slot 0: hora, slot 1: hora.torch), as Horovod numbers unnamed requests. Ranks agree on
    unnamed names only while they make the same unnamed calls; a rank that has joined skips the
    others' calls, so join() sets every counter to the largest value across ranks (resync)."""

    SLOTS = 2
    _all = [None] * SLOTS
    _lock = threading.Lock()

    def __init__(self, slot=None):
        """slot: 0 or 1 for the job-wide counters that join() resyncs; None for a process
        set's own (hora.torch numbers each set's unnamed calls apart)."""
        self.n = 0
        if slot is not None:
            NameCounter._all[slot] = self

    def __next__(self):
        with NameCounter._lock:
            n = self.n
            self.n += 1
            return n

    @classmethod
    def resync(cls, ctx):
        """Collective over ctx (every rank, at the same point: right after hora_join): every
        counter becomes the largest value any rank has, so later unnamed requests match."""
        with cls._lock:
            v = ffi.new("int64_t[]", [c.n if c else 0 for c in cls._all])
        check(lib.hora_allreduce(ctx, v, v, cls.SLOTS, lib.HORA_INT64, lib.HORA_MAX, 1.0, 1.0,
                                 lib.HORA_DEVICE_HOST), "hora.join (the unnamed-request numbers)")
        with cls._lock:
            for c, n in zip(cls._all, v):
                if c is not None and n > c.n:
                    c.n = n


_noname = NameCounter(0)
# Handles still holding a C handle, weakly: shutdown() completes them before hora_finalize.
_live = weakref.WeakValueDictionary()
_live_lock = threading.Lock()
# Dropped handles (strong references: the engine may still use their buffers), appended by the
# finalizer and completed by later submissions (_reap_orphans) or shutdown(). A deque because a
# finalizer must take no lock: the garbage collector runs it inside whatever the thread is doing,
# also while it holds _live_lock (an allocation in Handle.__init__), and a finalizer that took
# _live_lock there deadlocked the thread, and every thread that waited for that lock after it.
_orphans = collections.deque()


class Handle:
    """An operation in flight. wait() blocks until it is done and returns its result (or raises
    its error); done() says whether wait() would return at once. wait() may be called again and
    returns the same result. A Handle dropped before completion does not block: it completes in
    the background and is freed by a later submission or by shutdown()."""

    __slots__ = ("_h", "_keep", "_result", "_error", "_lock", "_done", "__weakref__")

    def __init__(self, h, keep, result):
        self._h = h
        self._keep = keep
        self._result = result
        self._error = None
        self._lock = threading.Lock()
        self._done = ffi.new("int *")
        with _live_lock:
            _live[id(self)] = self
        if _orphans:
            _reap_orphans()

    def done(self):
        """True when the operation has completed (successfully or not). Local, non-blocking."""
        h = self._h
        if h is None:
            return True
        with self._lock:
            if self._h is None:
                return True
            check(lib.hora_poll(self._h, self._done), "Handle.done")
            return bool(self._done[0])

    def wait(self):
        """Block until done; return the output (a new array, or the input for in-place calls)."""
        if self._h is not None:
            self._complete()
        if self._error is not None:
            raise self._error
        return self._result

    def _complete(self):
        with self._lock:
            h = self._h
            if h is None:
                return
            rc = lib.hora_wait(h)
            err = make_error(rc, "Handle.wait") if rc != 0 else None
            lib.hora_handle_free(h)
            self._h = None
            self._keep = None
            with _live_lock:
                _live.pop(id(self), None)
            if err is not None:
                self._error = err
                self._result = None

    def __del__(self):
        # Horovod's fire-and-forget: a handle dropped before completion must not block here,
        # nor take a lock (see _orphans). It is kept alive (resurrected) in _orphans; later
        # submissions and shutdown() complete and free it.
        if getattr(self, "_h", None) is not None:
            _orphans.append(self)


def _reap_orphans():
    """Free the dropped handles that have completed (non-blocking; never from a finalizer)."""
    for _ in range(len(_orphans)):
        try:
            h = _orphans.popleft()
        except IndexError:  # another thread reaped the rest
            return
        try:
            if h.done():
                h._complete()
                continue
        except Exception:  # its error had no one to go to
            continue
        _orphans.append(h)


def _complete_all():
    """Complete every live handle (shutdown() runs this before hora_finalize)."""
    with _live_lock:
        hs = list(_live.values())
    while _orphans:
        try:
            hs.append(_orphans.popleft())
        except IndexError:
            break
    for h in hs:
        h._complete()


_add_finalizer(_complete_all)


def refuse(ctx, names, group=None):
    """Tell the other ranks that this rank's call of `names` (the engine names, str, that the
    call would have submitted first) failed its own checks: hora_refuse_async, so that their
    requests of those names fail with a MismatchError instead of waiting. `group`: the (key, size)
    tag the refused call's members carry (hora_set_call_group), or None. Returns the refusal's
    Handle: done once the ranks have met (its error is the refusal's answer; no one need wait)."""
    c_names = [ffi.new("char[]", n.encode()) for n in names]
    arr = ffi.new("const char *[]", c_names)
    hp = ffi.new("hora_handle_t **")
    if group is not None:
        check(lib.hora_set_call_group(ctx, group[0], group[1]), "hora.refuse")
    check(lib.hora_refuse_async(ctx, arr, len(c_names), hp), "hora.refuse")
    return Handle(hp[0], (c_names, arr), None)


# ---- refusals (hora_refuse_async; hora.torch's _torch_ops.py says why) ------------------------
# The public async calls below are wrapped (_refusable): an error raised on this rank before the
# call's request reached the engine (a dtype hora does not take, a 0-d tensor to split, a bad root
# or scale factor) still takes the call's name and submits a refusal under it, so that the other
# ranks' requests of that name fail instead of waiting, and unnamed names stay numbered alike.
_call = threading.local()  # .active: inside a wrapped public call (hora's or hora.torch's);
#                            .names: the engine names this thread's hora call took (_name)
_refusals = {}  # engine name (bytes) -> the Handle of this rank's refusal under it, until reused
REFUSAL_WAIT_S = 10.0


def await_refusal(done):
    """Wait (at most REFUSAL_WAIT_S) until done() is true: a name whose last request here was a
    refusal is taken again. Without this, ranks failing the same named call twice in a row could
    differ on whether the first refusal had completed when the second came, and one rank's
    second refusal would be left to meet the others' next call of the name."""
    t_end = time.monotonic() + REFUSAL_WAIT_S
    delay = 0.0002
    while not done() and time.monotonic() < t_end:
        time.sleep(delay)
        delay = min(delay * 2, 0.01)


def refusable(record, on_error):
    """The wrapper of a public call, for hora's async calls and hora.torch's collectives: the
    outermost public call of a thread collects in `_call.<record>` what it takes (names, claims);
    on an exception, on_error(e, sig, args, kwargs, taken) decides on a refusal (it must not
    raise); the call's own error is re-raised. Calls inside another public call pass through."""
    def wrap(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if getattr(_call, "active", False):  # inside another public call
                return fn(*args, **kwargs)
            taken = []
            _call.active = True
            setattr(_call, record, taken)
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                on_error(e, sig, args, kwargs, taken)
                raise
            finally:
                _call.active = False
                setattr(_call, record, None)
        return call
    return wrap


def _refusable(kind, members=False):
    """refusable() for a public async call of hora. `kind`: the prefix of its unnamed names;
    `members`: a grouped call, whose engine names are "<name>.<i>" for each of args["tensors"]."""
    return refusable("names", lambda e, sig, a, k, taken: _refuse(e, kind, members, sig, a, k,
                                                                   taken))


def _refuse(e, kind, members, sig, args, kwargs, taken):
    """The refusal of a failed call of hora (never raises: the call's own error is the one the
    caller gets). Every error of these calls is raised before their one request is submitted."""
    if getattr(e, "_hora_refused", False):
        return
    try:
        a = sig.bind(*args, **kwargs)
        a.apply_defaults()
        args = a.arguments
        nm = taken[0] if taken else _name(args.get("name"), kind)
        base = nm.decode()
        names = [base]
        if members:
            try:
                names = [f"{base}.{i}" for i in range(max(1, len(args.get("tensors"))))]
            except TypeError:
                pass
        _refusals[nm] = refuse(args.get("ctx") or _ctx(), names)
        if len(_refusals) > 256:
            for k, h in list(_refusals.items()):  # one C-level copy: other threads may add
                if h.done():
                    _refusals.pop(k, None)
    except Exception:  # noqa: BLE001 (no engine, a bad name: nothing to tell)
        pass
    try:
        e._hora_refused = True
    except AttributeError:
        pass


def _name(name, kind):
    if name is None:
        b = f"{kind}.noname.{next(_noname)}".encode()
    elif not isinstance(name, str):
        raise invalid(f"{kind}: name must be a str, got {type(name).__name__}")
    else:
        b = name.encode()
        if not b or len(b) > 1023 or b"\0" in b:
            raise invalid(f"{kind}: name must be 1 to 1023 bytes without NUL, got {name!r}")
        h = _refusals.pop(b, None)
        if h is not None:
            await_refusal(h.done)
    names = getattr(_call, "names", None)
    if names is not None:
        names.append(b)
    return b


def _submit_allreduce(kind, tensor, out, op, name, prescale_factor, postscale_factor, result,
                      ctx=None, fp_terms=()):
    ctx = ctx or _ctx()
    b = B.as_buf(tensor, f"{kind}(tensor)", writable=out is None, sync=False)
    o = b if out is None else B.as_buf(out, f"{kind} output", writable=True, sync=False)
    hp = ffi.new("hora_handle_t **")
    nm = _name(name, "allreduce")
    args = (_op(op), _scale(prescale_factor, "prescale_factor"),
            _scale(postscale_factor, "postscale_factor"), b.device, hp)
    # last, right before the call that takes it; fp_terms: what else the ranks must agree on
    lib.hora_set_call_shape(ctx, _shape_fp(tuple(b.shape) + fp_terms if fp_terms else b.shape))
    ev = B.set_ready(ctx, (b, o))  # CUDA tensors: the engine waits for this event, not we
    check(lib.hora_allreduce_async(ctx, nm, b.ptr, o.ptr, b.count, b.dtype, *args),
          f"hora.{kind}")
    return Handle(hp[0], (b, o, ev), result)


@_refusable("allreduce")
def allreduce_async_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Start an in-place allreduce of tensor (see hora.allreduce_); returns a Handle whose wait()
    returns tensor. Every rank must submit the same name with the same count, dtype and op."""
    return _submit_allreduce("allreduce_async_", tensor, None, op, name, prescale_factor,
                             postscale_factor, tensor)


@_refusable("allreduce")
def allreduce_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Start an allreduce into a new array; returns a Handle whose wait() returns that array."""
    out = B.empty_like(tensor)
    return _submit_allreduce("allreduce_async", tensor, out, op, name, prescale_factor,
                             postscale_factor, out)


@_refusable("broadcast")
def broadcast_async_(tensor, root_rank, name=None, ctx=None):
    """Start an in-place broadcast of root_rank's tensor into every rank's; returns a Handle
    whose wait() returns tensor. Matched across ranks by name, like allreduce_async. `ctx`: a
    process set's context (hora.torch), root_rank then counted within it."""
    ctx = ctx or _ctx()
    b = B.as_buf(tensor, "broadcast_async_(tensor)", writable=True, sync=False)
    hp = ffi.new("hora_handle_t **")
    nm, root = _name(name, "broadcast"), _root(root_rank)
    lib.hora_set_call_shape(ctx, _shape_fp(b.shape))
    ev = B.set_ready(ctx, (b,))
    check(lib.hora_broadcast_async(ctx, nm, b.ptr, b.count, b.dtype, root, b.device, hp),
          "hora.broadcast_async_")
    return Handle(hp[0], (b, ev), tensor)


@_refusable("broadcast")
def broadcast_async(tensor, root_rank, name=None):
    """Start a broadcast into a new array (a copy of tensor that root_rank's values overwrite);
    wait() returns it."""
    B.as_buf(tensor, "broadcast_async(tensor)")
    out = B.empty_like(tensor)
    B.copy_into(out, tensor)
    return broadcast_async_(out, root_rank, name=name)


def _rows(b, kind, n):
    if len(b.shape) == 0:
        raise invalid(f"{kind}(tensor): a 0-d tensor cannot be split across ranks")
    if b.shape[0] % n:
        raise invalid(f"{kind}(tensor): the first dimension {b.shape[0]} does not divide by the "
                      f"world size {n}; use the blocking call, which also takes uneven splits")
    row = 1
    for s in b.shape[1:]:
        row *= s
    return b.shape[0] // n, row


@_refusable("reducescatter")
def reducescatter_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Start a reduce-scatter of equal blocks of rows (the first dimension must divide by the
    world size): wait() returns this rank's block of postscale * OP over ranks of
    (prescale * tensor), a new array. Ranks must agree on count, dtype, op and scale factors."""
    ctx = _ctx()
    n = _size()
    b = B.as_buf(tensor, "reducescatter_async(tensor)")
    rows, row = _rows(b, "reducescatter_async", n)
    pre = _scale(prescale_factor, "prescale_factor")
    post = _scale(postscale_factor, "postscale_factor")
    out = B.empty_like(tensor, (rows,) + tuple(b.shape[1:]))
    o = B.as_buf(out, "reducescatter_async output", writable=True)
    hp = ffi.new("hora_handle_t **")
    check(lib.hora_reducescatter_async(ctx, _name(name, "reducescatter"), b.ptr, o.ptr,
                                       rows * row, b.dtype, _op(op), pre, post, b.device, hp),
          "hora.reducescatter_async")
    return Handle(hp[0], (b, o), out)


@_refusable("alltoall")
def alltoall_async(tensor, name=None):
    """Start an alltoall of equal blocks of rows (the first dimension must divide by the world
    size): block p goes to rank p; wait() returns a new array whose block p came from rank p."""
    ctx = _ctx()
    n = _size()
    b = B.as_buf(tensor, "alltoall_async(tensor)")
    rows, row = _rows(b, "alltoall_async", n)
    out = B.empty_like(tensor)
    o = B.as_buf(out, "alltoall_async output", writable=True)
    hp = ffi.new("hora_handle_t **")
    check(lib.hora_alltoall_async(ctx, _name(name, "alltoall"), b.ptr, o.ptr, rows * row,
                                  b.dtype, b.device, hp), "hora.alltoall_async")
    return Handle(hp[0], (b, o), out)


def synchronize(handle):
    """Horovod's hora.synchronize(handle): handle.wait()."""
    if not isinstance(handle, Handle):
        raise invalid(f"synchronize: expected a hora Handle, got {type(handle).__name__}")
    return handle.wait()


def poll(handle):
    """Horovod's hora.poll(handle): handle.done()."""
    if not isinstance(handle, Handle):
        raise invalid(f"poll: expected a hora Handle, got {type(handle).__name__}")
    return handle.done()


def _grouped(kind, tensors, outs, op, name, prescale_factor, postscale_factor):
    """outs False: in place, wait() returns the tensors; True: into new arrays it returns."""
    ctx = _ctx()
    try:
        tensors = list(tensors)
    except TypeError:
        raise invalid(f"{kind}: expected a list of tensors, got {type(tensors).__name__}") \
            from None
    if not tensors:
        raise invalid(f"{kind}: the list of tensors is empty")
    bufs = [B.as_buf(t, f"{kind}(tensors[{i}])", writable=not outs, sync=False)
            for i, t in enumerate(tensors)]
    if outs:
        result = [B.empty_like(t) for t in tensors]
        obufs = [B.as_buf(o, f"{kind} output", writable=True, sync=False) for o in result]
    else:
        result = tensors
        obufs = bufs
    b0 = bufs[0]
    for i, b in enumerate(bufs):
        if b.dtype != b0.dtype or b.device != b0.device:
            raise invalid(f"{kind}: tensors[{i}] is {B.DTYPE_NAMES[b.dtype]} on device "
                          f"{b.device}, tensors[0] is {B.DTYPE_NAMES[b0.dtype]} on device "
                          f"{b0.device}; a group has one dtype and device")
    base = _name(name, "grouped_allreduce").decode()
    names = [ffi.new("char[]", f"{base}.{i}".encode()) for i in range(len(bufs))]
    n = len(bufs)
    c_names = ffi.new("const char *[]", names)
    c_send = ffi.new("const void *[]", [b.ptr for b in bufs])
    c_recv = ffi.new("void *[]", [o.ptr for o in obufs])
    c_counts = ffi.new("size_t[]", [b.count for b in bufs])
    hp = ffi.new("hora_handle_t **")
    c_op, pre = _op(op), _scale(prescale_factor, "prescale_factor")
    post = _scale(postscale_factor, "postscale_factor")
    ev = B.set_ready(ctx, bufs + obufs)  # last before the call that takes it
    check(lib.hora_grouped_allreduce_async(ctx, c_names, c_send, c_recv, c_counts, n, b0.dtype,
                                           c_op, pre, post, b0.device, hp), f"hora.{kind}")
    return Handle(hp[0], (bufs, obufs, names, c_names, c_send, c_recv, c_counts, ev), result)


@_refusable("grouped_allreduce", members=True)
def grouped_allreduce_async_(tensors, op=Average, name=None, prescale_factor=1.0,
                             postscale_factor=1.0):
    """Start one in-place allreduce of several tensors of one dtype, fused by the engine into as
    few transfers as HORA_FUSION_THRESHOLD allows; the Handle completes when all are done and
    wait() returns the list."""
    return _grouped("grouped_allreduce_async_", tensors, False, op, name, prescale_factor,
                    postscale_factor)


@_refusable("grouped_allreduce", members=True)
def grouped_allreduce_async(tensors, op=Average, name=None, prescale_factor=1.0,
                            postscale_factor=1.0):
    """grouped_allreduce_async_ into new arrays; wait() returns the list of outputs."""
    return _grouped("grouped_allreduce_async", tensors, True, op, name, prescale_factor,
                    postscale_factor)


@_refusable("grouped_allreduce", members=True)
def grouped_allreduce(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """Allreduce of a list of tensors of one dtype in one fused request; returns new arrays."""
    return grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor).wait()


@_refusable("grouped_allreduce", members=True)
def grouped_allreduce_(tensors, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0):
    """In-place grouped_allreduce; returns the list of tensors."""
    return grouped_allreduce_async_(tensors, op, name, prescale_factor, postscale_factor).wait()


def join():
    """Horovod's join: a rank that has run out of data calls join(); while it waits, the other
    ranks' allreduces proceed with zeros from the joined ranks (Sum/Average). Returns the rank
    that joined last, on every rank, once all ranks have joined. Collective."""
    last = ffi.new("int *")
    ctx = _ctx()
    check(lib.hora_join(ctx, last), "hora.join")
    NameCounter.resync(ctx)
    return last[0]


__all__ = ["Handle", "allreduce_async", "allreduce_async_", "alltoall_async", "broadcast_async",
           "broadcast_async_", "grouped_allreduce", "reducescatter_async",
           "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "join",
           "poll", "synchronize"]
