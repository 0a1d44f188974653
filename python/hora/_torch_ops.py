"""hora.torch's collectives, with horovod.torch's (0.28) signatures, defaults and results.

Every call goes through hora's async engine, matched across ranks by name as in Horovod; the
blocking forms submit and wait. A handle returned here (a TorchHandle) yields torch tensors of the
input's dtype and device. Operations whose output size depends on other ranks (allgather,
alltoall) first exchange their shapes through the engine under `<name>.meta`; a helper thread
submits the data phase once the shapes are known, so ranks may submit and wait in any order.
"""
import os
import queue
import sys
import threading
import warnings

import numpy as np
import torch

from . import _async
from . import _buffers as B
from ._core import Average, Max, Min, Product, Sum, _add_finalizer, _shape_fp
from ._core import rank as _rank
from ._core import size as _size
from ._errors import MismatchError, NotSupportedError, invalid
from ._hora_cffi import lib

Adasum = lib.HORA_ADASUM  # Horovod's constant: CPU float tensors (see _adasum_part)
_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product",
             Adasum: "Adasum"}
_OPS = (Sum, Average, Min, Max, Product, Adasum)
_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)


from ._torch_psets import (  # noqa: E402,F401
    ProcessSet, _check_set, _set_noname, _view_size, add_process_set, global_process_set,
    remove_process_set,
)


def _resolve_op(op, average, what):
    """Horovod's handling of the deprecated `average=` next to `op=`."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning, stacklevel=3)
        op = Average if average else Sum
    else:
        op = Average
    return _check_op(op, what)


def _check_op(op, what, adasum=True):
    if not adasum and not isinstance(op, bool) and op == Adasum:
        raise invalid(f"{what}: op=Adasum is supported by allreduce only")
    if isinstance(op, bool) or op not in _OPS:
        raise invalid(f"{what}: op {op!r} is not one of Sum, Average, Min, Max, Product"
                      + (", Adasum" if adasum else ""))
    return int(op)


def _check_tensor(t, what):
    if not isinstance(t, torch.Tensor):
        raise invalid(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout is not torch.strided:
        raise invalid(f"{what}: {t.layout} tensors are not supported (dense tensors only)")
    if not t.is_contiguous():
        raise ValueError(f"{what}: Tensor is required to be contiguous.")
    return t


# ---- names ------------------------------------------------------------------------------------
# Names of requests in flight on this rank: the same name submitted again before the first
# completes is a ValueError at the second call (as in Horovod). Each name holds a _Claim of its
# request's parts, strongly: a handle dropped without synchronize (Horovod's fire-and-forget)
# keeps its name claimed until its request completes, as Horovod's tensor queue does.
class _Claim:
    __slots__ = ("parts", "refusal", "key")

    def __init__(self, parts, key):
        self.parts = parts  # the handle's list of engine handles / chains (appended after claim)
        self.refusal = False  # parts is [the refusal's handle] (_refuse_call)
        self.key = key  # its key in _inflight

    def done(self):
        return all(p.done() for p in self.parts)


_inflight = {}
_inflight_lock = threading.Lock()
_sweep = {"at": 256}  # drop completed claims when the table grows past this
_counter = _async.NameCounter(1)  # join() resyncs it across ranks
# Unnamed requests from two threads at once: the thread ident -> the claim of its last unnamed
# request, and whether the warning (once per process) was given.
_unnamed_last = {}
_unnamed_warned = [False]


def _claim(name, kind, parts, view=None):
    """The engine's name of a request: "<kind>.<name>", or "<kind>.noname.<n>" without a name,
    as Horovod's torch ops name theirs (GetOpName): an allreduce and an allgather may carry the
    same user name at once, and the timeline's rows read "allreduce.<name>" as in Horovod's."""
    user = name
    if name is None:
        name = f"{kind}.noname.{next(_set_noname(view) or _counter)}"
    elif not isinstance(name, str):
        raise invalid(f"{kind}: name must be a str, got {type(name).__name__}")
    else:
        name = f"{kind}.{name}"
    # Names are claimed per process set, as Horovod keeps a tensor queue per set: the same name
    # may be in flight in the global set and in a set at once (each set has its own engine).
    pid = getattr(getattr(view, "ps", None), "process_set_id", 0) or 0
    key = (pid, name)
    prev = _inflight.get(key)
    if prev is not None and prev.refusal:
        _async.await_refusal(prev.done)
    with _inflight_lock:
        prev = _inflight.get(key)
        if prev is not None and not prev.done():
            if prev.refusal:
                e = ValueError(f"{kind}: an earlier call named {user!r} failed its checks on this "
                               "rank, and the other ranks have not made that call for "
                               f"{_async.REFUSAL_WAIT_S:g} s (its refusal waits for them)")
            else:
                e = ValueError(f"{kind}: a request named {user!r} is already in flight on this "
                               "rank; wait for it (synchronize) before submitting the name again")
            e._hora_refused = True  # the name is the other request's: no refusal under it
            raise e
        if len(_inflight) >= _sweep["at"]:
            for n in [n for n, c in _inflight.items() if c.done()]:
                del _inflight[n]
            _sweep["at"] = max(256, 2 * len(_inflight))
        claim = _inflight[key] = _Claim(parts, key)
        warn = user is None and _note_unnamed(claim)
    rec = getattr(_call, "claims", None)
    if rec is not None:
        rec.append((name, claim))
    if warn:
        warnings.warn(f"{kind}: collectives without a name= are in flight from two threads at "
                      "once; unnamed requests are numbered in the order they arrive, which can "
                      "differ between ranks, and then one thread's tensor is reduced with "
                      "another thread's, without an error. Give them names.", RuntimeWarning,
                      stacklevel=_caller_level())
    return name, claim


def _caller_level():
    """warnings.warn's stacklevel of the first frame outside hora and torch (the program's call),
    counted from the function that calls this one."""
    skip = (os.path.dirname(__file__), os.path.dirname(torch.__file__))
    f, level = sys._getframe(2), 2
    while f is not None and f.f_code.co_filename.startswith(skip):
        f, level = f.f_back, level + 1
    return level


def _note_unnamed(claim):
    """Record an unnamed request of this thread (under _inflight_lock); True, the first time in
    the process, when another thread's unnamed request is still in flight."""
    me = threading.get_ident()
    # A claim without parts yet is being submitted by its thread: in flight too.
    busy = any(not c.parts or not c.done() for t, c in _unnamed_last.items() if t != me)
    _unnamed_last[me] = claim
    if len(_unnamed_last) > 64:  # threads come and go: keep the ones still in flight
        for t in [t for t, c in _unnamed_last.items() if t != me and c.done()]:
            del _unnamed_last[t]
    if busy and not _unnamed_warned[0]:
        _unnamed_warned[0] = True
        return True
    return False


def _release(claim):
    with _inflight_lock:
        if _inflight.get(claim.key) is claim:
            del _inflight[claim.key]
        me = threading.get_ident()
        if _unnamed_last.get(me) is claim:
            del _unnamed_last[me]


# ---- refusals ---------------------------------------------------------------------------------
# A call that fails this rank's own checks (a non-contiguous tensor, a 0-d tensor to allgather,
# bad splits, a dtype or scale factor the C layer refuses) raises here, as in Horovod. Two things
# must not follow, and did in Horovod and before this: (1) the peers, whose own call of that name
# was valid, wait for it forever; (2) an unnamed call, whose number this rank did not take, shifts
# every later unnamed name by one here alone, so that this rank's next tensor meets the peers'
# current one: another tensor's data, without an error. So every public collective below is
# wrapped (_refusable): an error raised before any of its requests reached the engine still takes
# the call's name, and submits a refusal under the names the peers' call submits first
# (hora_refuse_async). The peers' call then raises MismatchError naming this rank, and the unnamed
# numbers stay the same on every rank. Errors that are not this call's own make no refusal: a
# rank outside the process set (not a member of the call), a name still in flight here (the name
# is the other request's), and anything raised after a request was submitted (the engine then
# tells every rank itself).
_call = _async._call  # .claims: the names the outermost public call of this thread took


def _refusable(kind, contact):
    """Wrap a public collective of hora.torch (see "refusals" above; _async.refusable). `kind`:
    the prefix of its engine name ("allreduce", "grouped_allgather", ...); `contact(name, args)`:
    (names, group) of the requests the peers' call submits first under engine name `name` (args:
    the call's bound arguments), group being the hora_set_call_group tag they carry, or None."""
    return _async.refusable("claims", lambda e, sig, a, k, claims: _refuse_call(
        e, kind, contact, sig, a, k, claims))


def _refuse_call(e, kind, contact, sig, args, kwargs, claims):
    """The refusal of a failed call (see "refusals" above), unless the error was not the call's own
    or a request of it reached the engine. Never raises: the call's own error is what the caller
    gets."""
    if getattr(e, "_hora_refused", False) or any(c.parts for _, c in claims):
        return
    try:
        a = sig.bind(*args, **kwargs)
        a.apply_defaults()
        args = a.arguments
        view = _check_set(args.get("process_set", global_process_set), kind)
        if claims:
            name, claim = claims[0]
        else:
            name, claim = _claim(args.get("name"), kind, [], view)
        names, group = contact(name, args)
        claim.parts.append(_async.refuse(view.ctx, names, group))
        claim.refusal = True
    except Exception:  # noqa: BLE001 (no engine, a bad name or process set: nothing to tell)
        pass
    try:
        e._hora_refused = True  # an outer call that catches and re-raises it refuses nothing
    except AttributeError:
        pass


def _n_members(tensors):
    try:
        return max(1, len(tensors))
    except TypeError:
        return 1


def _one(name, args):
    return [name], None


def _members(name, args):
    return [f"{name}.{i}" for i in range(_n_members(args.get("tensors")))], None


# ---- handles ----------------------------------------------------------------------------------
class TorchHandle:
    """An operation of hora.torch in flight: poll(h)/h.done(), synchronize(h)/h.wait().

    Holds one or more engine handles (or a two-phase chain) and a `finish` function that turns
    their results into the torch result. A dropped TorchHandle never blocks: its engine handles
    complete in the background (hora's Handle finalizer hands them to shutdown)."""

    __slots__ = ("_parts", "_finish", "_result", "_error", "_waited", "_names", "__weakref__")

    def __init__(self, finish=None):
        self._parts = []
        self._finish = finish
        self._result = None
        self._error = None
        self._waited = False
        self._names = []

    def _claim(self, name, kind, view=None):
        """The request's engine name; `view`: its process set (unnamed requests are numbered
        per set)."""
        name, claim = _claim(name, kind, self._parts, view)
        self._names.append((name, claim))
        return name

    def done(self):
        return self._waited or all(p.done() for p in self._parts)

    def wait(self):
        if not self._waited:
            try:
                outs = [p.wait() for p in self._parts]
                self._result = self._finish(outs) if self._finish else outs
            except Exception as e:
                self._error = e
            self._waited = True
            self._parts = []
            for _, claim in self._names:
                _release(claim)
        if self._error is not None:
            raise self._error
        return self._result


class _Chain:
    """Phase 1 (an engine handle whose result is metadata), then `then(meta)` submits phase 2
    (returns an engine handle) from the chain thread, in submission order."""

    def __init__(self, first, then):
        self._first = first
        self._then = then
        self._second = None
        self._error = None
        self._ready = threading.Event()
        _chain_queue().put(self)

    def _advance(self):
        try:
            self._second = self._then(self._first.wait())
        except Exception as e:
            self._error = e
        self._first = self._then = None
        self._ready.set()

    def done(self):
        if not self._ready.is_set():
            return False
        return self._error is not None or self._second.done()

    def wait(self):
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._second.wait()


_chain = {"queue": None, "thread": None}
_chain_lock = threading.Lock()


def _chain_loop(q):
    while True:
        item = q.get()
        if item is None:
            q.task_done()
            return
        item._advance()
        q.task_done()


def _chain_queue():
    with _chain_lock:
        if _chain["queue"] is None:
            q = queue.Queue()
            t = threading.Thread(target=_chain_loop, args=(q,), name="hora-torch-chain",
                                 daemon=True)
            t.start()
            _chain["queue"], _chain["thread"] = q, t
        return _chain["queue"]


def _drain_chains():
    """shutdown(): let every chain submit its second phase, then complete all engine handles."""
    with _chain_lock:
        q, t = _chain["queue"], _chain["thread"]
        _chain["queue"] = _chain["thread"] = None
    if q is not None:
        q.put(None)
        t.join()
    _async._complete_all()
    with _inflight_lock:
        _inflight.clear()


_add_finalizer(_drain_chains)


def poll(handle):
    """True when the operation of `handle` has completed (synchronize will not block)."""
    if not isinstance(handle, (TorchHandle, _async.Handle)):
        raise invalid(f"poll: expected a handle of hora.torch, got {type(handle).__name__}")
    return handle.done()


def synchronize(handle):
    """Wait for `handle` and return its result (a tensor, a list of tensors, or for alltoall
    the tuple (output, received_splits))."""
    if not isinstance(handle, (TorchHandle, _async.Handle)):
        raise invalid(f"synchronize: expected a handle of hora.torch, got "
                      f"{type(handle).__name__}")
    return handle.wait()


# ---- allreduce ----------------------------------------------------------------------------------
def _int_scaling(t, op, pre, post, n=None):
    """Horovod scales integer tensors through double and truncates toward zero; Average is a
    postscale of 1/size. hora's C layer takes scale factors for floating dtypes only, so for
    integers the scaling happens here around a Sum (or the op). Returns (c_op, post or None)."""
    if t.dtype not in _INT_DTYPES or (op != Average and pre == 1.0 and post == 1.0):
        return op, None
    if t.dtype == torch.bool:
        raise invalid("Average and scale factors are not defined for bool tensors; use op=Sum "
                      "or Max (logical OR), Min or Product (logical AND)")
    if op == Average:
        op, post = Sum, post / (_size() if n is None else n)
    if pre != 1.0:
        with torch.no_grad():
            t.copy_((t.to(torch.float64) * pre).trunc().to(t.dtype))
    return op, (post if post != 1.0 else None)


def _apply_post(t, post):
    if post is not None:
        with torch.no_grad():
            t.copy_((t.to(torch.float64) * post).trunc().to(t.dtype))
    return t


class _ShapeNote:
    """An engine handle whose MismatchError on the shape field gets `note` appended (a string,
    or a function that makes it, called only on that error): this rank's shape and what else the
    fingerprint covers. The fingerprint is a digest, so the engine can print only hex values,
    and each rank can print only its own."""

    __slots__ = ("_h", "_note")

    def __init__(self, h, note):
        self._h = h
        self._note = note

    def done(self):
        return self._h.done()

    def wait(self):
        try:
            return self._h.wait()
        except MismatchError as e:
            if "disagree on shape" not in e.message:
                raise
            note = self._note() if callable(self._note) else self._note
            raise MismatchError(f"{e.message} ({note})", e.code) from None


def _int_terms(dtype, op, pre, post):
    """What an integer tensor's shape fingerprint covers besides the shape: the op and the scale
    factors, which hora.torch applies itself for integers (_int_scaling) around a plain Sum, so
    the engine cannot compare them (ranks passing Average and Sum, or other factors, would
    otherwise mix silently; Horovod: "Mismatched prescale and/or postscale factors")."""
    # -1 marks the start of the terms (no dimension is negative); no str: hash() of a str
    # differs between processes (PYTHONHASHSEED), of ints and floats it does not.
    return (-1, int(op), float(pre), float(post)) if dtype in _INT_DTYPES else ()


def _int_note(shape_text, op, pre, post):
    return (f"for integer tensors the shape field also covers the op and the scale factors; "
            f"this rank: {shape_text}, op {_OP_NAMES.get(op, op)}, prescale_factor {pre:g}, "
            f"postscale_factor {post:g}")


def _adasum_part(kind, view, tensor, output, name, pre, post):
    """op=Adasum through the engine (hora's HORA_ADASUM: CPU float32/float64; float16 and
    bfloat16 go through a float32 copy). Returns (engine handle, finish) where finish() writes
    the result into `output` and returns it."""
    if not tensor.is_floating_point():
        raise invalid(f"{kind}: op=Adasum needs a floating-point tensor, got {tensor.dtype}")
    wide = tensor.dtype in (torch.float16, torch.bfloat16)
    with torch.no_grad():
        src = tensor.detach().to(torch.float32) if wide else tensor.detach()
    dst = src if wide else (None if output is tensor else output.detach())
    part = _async._submit_allreduce(kind, src, dst, Adasum, name, pre, post, None, ctx=view.ctx)

    def finish():
        if wide:
            with torch.no_grad():
                output.copy_(src)
        return output
    return part, finish


def _adasum_submit(kind, view, tensor, output, name, pre, post):
    h = TorchHandle()
    nm = h._claim(name, "allreduce", view)
    part, fin = _adasum_part(kind, view, tensor, output, nm, pre, post)
    h._parts.append(part)
    h._finish = lambda outs: fin()
    return h


def _allreduce_submit(kind, tensor, output, name, op, pre, post, process_set):
    view = _check_set(process_set, kind)
    _check_tensor(tensor, f"{kind}(tensor)")
    pre, post = float(pre), float(post)
    if op == Adasum:
        return _adasum_submit(kind, view, tensor, output, name, pre, post)
    h = TorchHandle()
    nm = h._claim(name, "allreduce", view)
    src = tensor
    c_op, ipost = op, None
    terms = _int_terms(tensor.dtype, op, pre, post)
    # made only on a mismatch, of the values the caller passed (op, pre, post change below)
    note = None
    if terms:
        note = lambda s=tuple(tensor.shape), o=op, a=pre, b=post: _int_note(f"shape {s}", o, a, b)  # noqa: E731
    if tensor.dtype in _INT_DTYPES:
        if op == Average or pre != 1.0 or post != 1.0:
            if output is not tensor:
                with torch.no_grad():
                    output.copy_(tensor)
                src = output
            c_op, ipost = _int_scaling(src, op, pre, post, _view_size(view))
        pre = post = 1.0
    part = _async._submit_allreduce(kind, src.detach(), None if src is output else output.detach(),
                                    c_op, nm, pre, post, None, ctx=view.ctx, fp_terms=terms)
    h._parts.append(_ShapeNote(part, note) if note else part)
    h._finish = lambda outs: _apply_post(output, ipost)
    return h


@_refusable("allreduce", _one)
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Start an allreduce into a new tensor; synchronize(handle) returns it."""
    op = _resolve_op(op, average, "allreduce_async")
    _check_tensor(tensor, "allreduce_async(tensor)")
    out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    return _allreduce_submit("allreduce_async", tensor, out, name, op, prescale_factor,
                             postscale_factor, process_set)


@_refusable("allreduce", _one)
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """Start an in-place allreduce; synchronize(handle) returns `tensor`."""
    op = _resolve_op(op, average, "allreduce_async_")
    return _allreduce_submit("allreduce_async_", tensor, tensor, name, op, prescale_factor,
                             postscale_factor, process_set)


@_refusable("allreduce", _one)
def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns `tensor`."""
    return allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor,
                            process_set).wait()


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.args = (op, pre, post, process_set)
        out = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        return _allreduce_submit("allreduce", tensor, out, name, op, pre, post,
                                 process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, ps = ctx.args
        return allreduce(grad.contiguous(), op=op, prescale_factor=pre,
                         postscale_factor=post, process_set=ps), None, None, None, None, None


def _compressor(compression):
    from ._compression import Compression
    return Compression.none if compression is None else compression


@_refusable("allreduce", _one)
def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduce into a new tensor (differentiable: the gradient is the same allreduce of the
    output's gradient). `compression` (Compression.none/fp16/bf16) casts the payload."""
    op = _resolve_op(op, average, "allreduce")
    _check_set(process_set, "allreduce")
    _check_tensor(tensor, "allreduce(tensor)")
    comp = _compressor(compression)
    t, cctx = comp.compress(tensor)
    t = t.contiguous()
    out = _AllreduceFn.apply(t, name, op, float(prescale_factor), float(postscale_factor),
                             process_set)
    return comp.decompress(out, cctx)


# ---- grouped allreduce ------------------------------------------------------------------------
def _grouped_submit(kind, tensors, outputs, name, op, pre, post, process_set):
    view = _check_set(process_set, kind)
    tensors = list(tensors)
    if not tensors:
        raise invalid(f"{kind}: the list of tensors is empty")
    for i, t in enumerate(tensors):
        _check_tensor(t, f"{kind}(tensors[{i}])")
    if op == Adasum:  # one Adasum per tensor (each has its own dot products)
        h = TorchHandle()
        base = h._claim(name, "grouped_allreduce", view)
        fins = []
        for i, (t, o) in enumerate(zip(tensors, outputs)):
            part, fin = _adasum_part(kind, view, t, o, f"{base}.{i}", pre, post)
            h._parts.append(part)
            fins.append(fin)
        h._finish = lambda outs: [f() for f in fins]
        return h
    h = TorchHandle()
    base = h._claim(name, "grouped_allreduce", view)
    posts = [None] * len(tensors)
    # One engine request per (dtype, device) subgroup; members keep their index in the names.
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    for (dtype, _), idx in groups.items():
        c_op, cpre, cpost = op, float(pre), float(post)
        srcs = []
        for i in idx:
            src = tensors[i]
            if dtype in _INT_DTYPES and (op == Average or cpre != 1.0 or cpost != 1.0):
                if outputs[i] is not src:
                    with torch.no_grad():
                        outputs[i].copy_(src)
                    src = outputs[i]
                c_op, posts[i] = _int_scaling(src, op, float(pre), float(post), _view_size(view))
            srcs.append(src)
        if dtype in _INT_DTYPES:
            cpre = cpost = 1.0
        # An in-place member's output is its input: one detached view serves both, so that
        # _grouped_c reads its memory once (a second as_buf per tensor cost about 3 us).
        dsrcs = [s.detach() for s in srcs]
        douts = [d if outputs[i] is s else outputs[i].detach()
                 for d, s, i in zip(dsrcs, srcs, idx)]
        # One fingerprint for the subgroup (hora_grouped_allreduce_async gives it to every
        # member): its members' shapes, as Horovod checks each tensor's, and for integers the op
        # and scale factors applied here.
        terms = _int_terms(dtype, op, pre, post)
        fp = _shape_fp(tuple(tuple(s.shape) for s in dsrcs) + terms)
        part = _grouped_c(kind, dsrcs, douts, idx, base, c_op, cpre, cpost, view.ctx, fp)
        h._parts.append(_ShapeNote(part, _group_note(dsrcs, idx, terms, op, pre, post)))

    def finish(_):
        return [_apply_post(o, p) for o, p in zip(outputs, posts)]
    h._finish = finish
    return h


def _group_note(srcs, idx, terms, op, pre, post):
    def note():
        shapes = ", ".join(f"[{i}] {tuple(s.shape)}" for s, i in zip(srcs[:4], idx[:4]))
        text = f"members' shapes {shapes}{', ...' if len(srcs) > 4 else ''}"
        if terms:
            return _int_note(text, op, pre, post)
        return f"a grouped call's shape field covers every member's shape; this rank: {text}"
    return note


def _grouped_c(kind, srcs, outs, idx, base, op, pre, post, ctx, fp=0):
    from ._hora_cffi import ffi
    bufs = [B.as_buf(s, f"{kind}(tensors[{i}])", sync=False) for s, i in zip(srcs, idx)]
    obufs = [b if s is o else B.as_buf(o, f"{kind} output", writable=True, sync=False)
             for b, s, o in zip(bufs, srcs, outs)]
    names = [ffi.new("char[]", f"{base}.{i}".encode()) for i in idx]
    c_names = ffi.new("const char *[]", names)
    c_send = ffi.new("const void *[]", [b.ptr for b in bufs])
    c_recv = ffi.new("void *[]", [o.ptr for o in obufs])
    c_counts = ffi.new("size_t[]", [b.count for b in bufs])
    hp = ffi.new("hora_handle_t **")
    from ._errors import check
    # The tags last, right before the call that takes them: the ready event (CUDA: the engine
    # waits for it) and the group's fingerprint.
    ev = B.set_ready(ctx, bufs + obufs)
    lib.hora_set_call_shape(ctx, fp)
    check(lib.hora_grouped_allreduce_async(ctx, c_names, c_send, c_recv, c_counts,
                                           len(bufs), bufs[0].dtype, op, pre, post,
                                           bufs[0].device, hp), f"hora.torch.{kind}")
    return _async.Handle(hp[0], (bufs, obufs, names, c_names, c_send, c_recv, c_counts, ev),
                         outs)


@_refusable("grouped_allreduce", _members)
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Start the allreduce of a list of tensors (one request, fused); the result is a list of
    new tensors. Tensors may differ in dtype; names are `<name>.<index>`."""
    op = _resolve_op(op, average, "grouped_allreduce_async")
    tensors = list(tensors)
    outs = [torch.empty_like(t, memory_format=torch.contiguous_format)
            if isinstance(t, torch.Tensor) else t for t in tensors]
    return _grouped_submit("grouped_allreduce_async", tensors, outs, name, op, prescale_factor,
                           postscale_factor, process_set)


@_refusable("grouped_allreduce", _members)
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place grouped_allreduce_async: the result is the list of the tensors themselves."""
    op = _resolve_op(op, average, "grouped_allreduce_async_")
    tensors = list(tensors)
    return _grouped_submit("grouped_allreduce_async_", tensors, tensors, name, op,
                           prescale_factor, postscale_factor, process_set)


@_refusable("grouped_allreduce", _members)
def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set).wait()


@_refusable("grouped_allreduce", _members)
def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduce of a list of tensors; returns new tensors (differentiable per tensor)."""
    op = _resolve_op(op, average, "grouped_allreduce")
    comp = _compressor(compression)
    pairs = [comp.compress(t) for t in tensors]
    sent = [p[0].contiguous() for p in pairs]
    if torch.is_grad_enabled() and any(t.requires_grad for t in sent):
        outs = _GroupedAllreduceFn.apply(name, op, float(prescale_factor),
                                         float(postscale_factor), process_set, *sent)
    else:
        outs = grouped_allreduce_async(sent, None, name, op, prescale_factor, postscale_factor,
                                       process_set).wait()
    return [comp.decompress(o, p[1]) for o, p in zip(outs, pairs)]


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, pre, post, process_set, *tensors):
        ctx.args = (op, pre, post, process_set)
        return tuple(grouped_allreduce_async(list(tensors), None, name, op, pre, post,
                                             process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        op, pre, post, ps = ctx.args
        g = grouped_allreduce([x.contiguous() for x in grads], op=op, prescale_factor=pre,
                              postscale_factor=post, process_set=ps)
        return (None, None, None, None, None, *g)
