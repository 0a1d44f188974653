"""hora.torch's allgather, broadcast, alltoall, reducescatter, barrier and join, with
horovod.torch's (0.28) signatures (see _torch_ops.py for the handle and naming rules)."""
import hashlib

import numpy as np
import torch

from . import _async
from . import _buffers as B
from ._core import Average, Sum, _root, _shape_fp, _shape_key
from ._core import rank as _rank
from ._core import size as _size
from ._errors import MismatchError, check, invalid
from ._hora_cffi import ffi, lib
from ._torch_ops import (TorchHandle, _Chain, _ShapeNote, _apply_post, _check_op, _check_tensor,
                         _compressor, _int_note, _int_scaling, _int_terms, _INT_DTYPES,
                         _members, _one, _refusable, allreduce)
from ._torch_psets import _check_set, _view_rank, _view_size, global_process_set


def _group_tag(names):
    """(key, size) of a grouped call whose members are `names`, for hora_set_call_group: a digest
    of the set of names, the same on every rank that groups the same names."""
    digest = hashlib.blake2b("\0".join(sorted(names)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1, len(names)


def _meta_contact(name, args):
    """_refusable's contact of allgather and alltoall: their shape exchange comes first."""
    return [f"{name}.meta"], None


def _grouped_meta_contact(name, args):
    """grouped_allgather: each member's shape exchange ("allgather.<name>.<i>.meta", as
    _allgather_part names it), tagged as grouped_allgather_async tags them."""
    tag = [f"{n}.meta" for n in _members(name, args)[0]]
    return [f"allgather.{n}" for n in tag], _group_tag(tag)


def _grouped_rs_contact(name, args):
    """grouped_reducescatter: each member ("reducescatter.<name>.<i>"), tagged as
    grouped_reducescatter_async tags them."""
    tag = _members(name, args)[0]
    return [f"reducescatter.{n}" for n in tag], _group_tag(tag)


def _check_members(tensors, kind, what):
    """The checks each member's submission makes, for all members before any is submitted: a
    grouped call's members are negotiated only once all are submitted (hora_set_call_group), so a
    member refused half way through would leave the earlier ones waiting."""
    for i, t in enumerate(tensors):
        _check_tensor(t, f"{kind}(tensors[{i}])")
        if t.dim() == 0:
            raise invalid(f"{kind}(tensors[{i}]): a 0-d tensor {what}")
        B.as_buf(t.detach(), f"{kind}(tensors[{i}])")


def _set_group(view, group, kind):
    if group is not None:
        check(lib.hora_set_call_group(view.ctx, group[0], group[1]), f"hora.torch.{kind}")


def _engine_allgather(view, name, send, out, group=None):
    """hora_allgather_async of a NumPy or torch buffer into `out` (size * count elements);
    `group`: the (key, size) of the grouped call it is a member of (_group_tag), or None."""
    b = B.as_buf(send, "allgather")
    o = B.as_buf(out, "allgather output", writable=True)
    hp = ffi.new("hora_handle_t **")
    _set_group(view, group, "allgather")  # last, right before the call that takes it
    check(lib.hora_allgather_async(view.ctx, name.encode(), b.ptr, o.ptr, b.count, b.dtype,
                                   b.device, hp), "hora.torch.allgather")
    return _async.Handle(hp[0], (b, o), out)


def _meta(view, name, values, group=None):
    """Start the allgather of a few int64 per rank under `<name>.meta`: result [size, k]. The
    members of a grouped allgather tag their meta with the group: ranks that group other tensors
    then get a MismatchError for every member instead of waiting for a member's meta that the
    other ranks never submit."""
    send = np.asarray(values, dtype=np.int64)
    return _engine_allgather(view, f"{name}.meta", send,
                             np.empty((_view_size(view), send.size), np.int64), group)


def _describe(t):
    return [t.dim(), int(B.as_buf(t.detach(), "tensor").dtype), _shape_key(t.shape[1:]),
            0 if t.device.type == "cpu" else 1]


def _check_agree(meta, k, what, name):
    """meta[:, :k] must be the same on every rank (ndim, dtype, trailing shape, device)."""
    bad = [r for r in range(meta.shape[0]) if not (meta[r, :k] == meta[0, :k]).all()]
    if bad:
        rows = "; ".join(f"rank {r}: ndim {meta[r, 0]}, dtype "
                         f"{B.DTYPE_NAMES.get(int(meta[r, 1]), meta[r, 1])}"
                         for r in range(meta.shape[0]))
        raise MismatchError(f"{what} {name!r}: ranks disagree on dtype, rank or trailing shape "
                            f"({rows})", lib.HORA_ERR_MISMATCH)


def _row(t):
    row = 1
    for s in t.shape[1:]:
        row *= s
    return row


# ---- allgather ------------------------------------------------------------------------------
def _allgather_part(view, h, tensor, name, kind, group=None):
    _check_tensor(tensor, f"{kind}(tensor)")
    if tensor.dim() == 0:
        raise invalid(f"{kind}(tensor): a 0-d tensor has no first dimension to concatenate; "
                      "pass tensor.reshape(1)")
    nm = h._claim(name, "allgather", view)
    src = tensor.detach()
    row = _row(tensor)

    def then(meta):
        _check_agree(meta, 4, "allgather", nm)
        firsts = [int(v) for v in meta[:, 4]]
        out = torch.empty((sum(firsts),) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        if all(f == firsts[0] for f in firsts):
            return _engine_allgather(view, nm, src, out)
        b = B.as_buf(src, "allgather")
        o = B.as_buf(out, "allgather output", writable=True)
        counts = ffi.new("size_t[]", [f * row for f in firsts])
        hp = ffi.new("hora_handle_t **")
        check(lib.hora_allgatherv_async(view.ctx, nm.encode(), b.ptr, b.count, o.ptr,
                                        counts, b.dtype, b.device, hp), "hora.torch.allgather")
        return _async.Handle(hp[0], (b, o, counts), out)

    return _Chain(_meta(view, nm, _describe(tensor) + [tensor.shape[0]], group), then)


@_refusable("allgather", _meta_contact)
def allgather_async(tensor, name=None, process_set=global_process_set):
    """Start the concatenation along dim 0 of every rank's tensor (dim 0 may differ between
    ranks; the other dims and the dtype must match, else MismatchError on every rank)."""
    view = _check_set(process_set, "allgather_async")
    h = TorchHandle(lambda outs: outs[0])
    h._parts.append(_allgather_part(view, h, tensor, name, "allgather_async"))
    return h


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0]
        ctx.ps = process_set
        return allgather_async(tensor, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        g = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        dims = allgather(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.ps)
        off = int(dims[:_view_rank(_check_set(ctx.ps, "allgather"))].sum())
        return g.narrow(0, off, ctx.dim), None, None


@_refusable("allgather", _meta_contact)
def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated along dim 0 in rank order (differentiable)."""
    _check_set(process_set, "allgather")
    _check_tensor(tensor, "allgather(tensor)")
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _AllgatherFn.apply(tensor, name, process_set)
    return allgather_async(tensor, name, process_set).wait()


@_refusable("grouped_allgather", _grouped_meta_contact)
def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Start the allgather of each tensor of a list (names `<name>.<index>`)."""
    view = _check_set(process_set, "grouped_allgather_async")
    tensors = list(tensors)
    if not tensors:
        raise invalid("grouped_allgather_async: the list of tensors is empty")
    _check_members(tensors, "grouped_allgather_async", "has no first dimension to concatenate")
    h = TorchHandle(lambda outs: list(outs))
    base = h._claim(name, "grouped_allgather", view)
    group = _group_tag([f"{base}.{i}.meta" for i in range(len(tensors))])
    for i, t in enumerate(tensors):
        h._parts.append(_allgather_part(view, h, t, f"{base}.{i}", "grouped_allgather_async",
                                        group))
    return h


class _GroupedAllgatherFn(torch.autograd.Function):
    """Horovod 0.28's HorovodGroupedAllgather: the gradient of each member is its rows of the
    average over ranks of the incoming gradients (as for allgather)."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.ps = process_set
        return tuple(grouped_allgather_async(list(tensors), name, process_set).wait())

    @staticmethod
    def backward(ctx, *grads):
        from ._torch_ops import grouped_allreduce
        g = grouped_allreduce([x.contiguous() for x in grads], op=Average, process_set=ctx.ps)
        dims = allgather(torch.tensor([ctx.dims], dtype=torch.int64), process_set=ctx.ps)
        offs = dims[:_view_rank(_check_set(ctx.ps, "grouped_allgather"))].sum(0).tolist()
        return (None, None, *[x.narrow(0, int(o), d) for x, o, d in zip(g, offs, ctx.dims)])


@_refusable("grouped_allgather", _grouped_meta_contact)
def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """The allgather of each tensor of a list (differentiable, as allgather)."""
    tensors = list(tensors)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in tensors):
        _check_set(process_set, "grouped_allgather")
        if not tensors:
            raise invalid("grouped_allgather: the list of tensors is empty")
        return list(_GroupedAllgatherFn.apply(name, process_set, *tensors))
    return grouped_allgather_async(tensors, name, process_set).wait()


# ---- broadcast ------------------------------------------------------------------------------
@_refusable("broadcast", _one)
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Start an in-place broadcast of root_rank's tensor; synchronize returns `tensor`."""
    view = _check_set(process_set, "broadcast_async_")
    _check_tensor(tensor, "broadcast_async_(tensor)")
    root = view.root(_root(root_rank), "broadcast_async_")
    h = TorchHandle(lambda outs: tensor)
    nm = h._claim(name, "broadcast", view)
    h._parts.append(_async.broadcast_async_(tensor.detach(), root, name=nm, ctx=view.ctx))
    return h


@_refusable("broadcast", _one)
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Start a broadcast into a new tensor (root_rank's values)."""
    _check_tensor(tensor, "broadcast_async(tensor)")
    out = tensor.detach().clone(memory_format=torch.contiguous_format)
    return broadcast_async_(out, root_rank, name, process_set)


@_refusable("broadcast", _one)
def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return broadcast_async_(tensor, root_rank, name, process_set).wait()


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root = root_rank
        ctx.ps = process_set
        return broadcast_async(tensor, root_rank, name, process_set).wait()

    @staticmethod
    def backward(ctx, grad):
        g = allreduce(grad.contiguous(), op=Average, process_set=ctx.ps)
        if _rank() != ctx.root:  # roots are global ranks, as in Horovod
            g = torch.zeros_like(g)
        return g, None, None, None


@_refusable("broadcast", _one)
def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor, as a new tensor on every rank (differentiable)."""
    _check_set(process_set, "broadcast")
    _check_tensor(tensor, "broadcast(tensor)")
    if torch.is_grad_enabled() and tensor.requires_grad:
        return _BroadcastFn.apply(tensor, _root(root_rank), name, process_set)
    return broadcast_async(tensor, root_rank, name, process_set).wait()


# ---- alltoall -------------------------------------------------------------------------------
def _splits_of(splits, n, rows, kind):
    """Horovod 0.28's argument checks of alltoall (EnqueueTensorAlltoall): splits None needs a
    first dimension divisible by the number of ranks; else n non-negative ints whose sum is at
    most the first dimension (rows past the sum are not sent)."""
    if splits is None:
        if rows % n:
            raise invalid(f"{kind}: splits not provided, but first dimension of tensor ({rows}) "
                          f"is not an even multiple of the number of workers ({n})")
        return [rows // n] * n
    if isinstance(splits, torch.Tensor):
        # Horovod 0.28 reads a splits tensor as int32 (a float tensor is an error there, whatever
        # its values); hora takes int32 and int64, and refuses the rest instead of truncating.
        if splits.dtype not in (torch.int32, torch.int64):
            raise invalid(f"{kind}: splits is a {splits.dtype} tensor; expected int32 (or int64)")
        splits = splits.tolist()
    try:
        sp = [int(v) for v in np.asarray(splits).reshape(-1)]
    except (TypeError, ValueError):
        raise invalid(f"{kind}(splits={splits!r}): expected {n} ints") from None
    if len(sp) != n:
        raise invalid(f"{kind}(splits={sp}): number of entries in splits ({len(sp)}) does not "
                      f"equal number of workers ({n})")
    if any(v < 0 for v in sp):
        raise invalid(f"{kind}(splits={sp}): splits must be non-negative")
    if sum(sp) > rows:
        raise invalid(f"{kind}(splits={sp}): sum of splits entries ({sum(sp)}) is greater than "
                      f"the first dimension of tensor ({rows})")
    return sp


@_refusable("alltoall", _meta_contact)
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Start an alltoall: splits[p] rows of dim 0 go to rank p (splits None: an even split).
    synchronize(handle) returns (output, received_splits), received_splits an int32 tensor.

    Invalid splits (or, without splits, a first dimension not divisible by the number of ranks)
    raise ValueError at this call, as in Horovod; the call is refused under its name (see
    _torch_ops.py, "refusals"), so the peers' raise MismatchError (a ValueError) at synchronize
    instead of waiting."""
    view = _check_set(process_set, "alltoall_async")
    _check_tensor(tensor, "alltoall_async(tensor)")
    if tensor.dim() == 0:
        raise invalid("alltoall_async(tensor): a 0-d tensor cannot be split across ranks")
    n, me = _view_size(view), _view_rank(view)
    h = TorchHandle(lambda outs: outs[0])
    nm = h._claim(name, "alltoall", view)
    sp = _splits_of(splits, n, tensor.shape[0], "alltoall")
    src = tensor.detach()
    if sum(sp) < tensor.shape[0]:
        src = src[:sum(sp)]
    row, trail = _row(tensor), tuple(tensor.shape[1:])

    def then(meta):
        _check_agree(meta, 4, "alltoall", nm)
        S = meta[:, 4:]  # S[p][q]: rows rank p sends to rank q
        recv = [int(S[p, me]) for p in range(n)]
        m = int(S.max())
        rsplits = torch.tensor(recv, dtype=torch.int32)
        if (S == m).all():
            send = src
            buf = torch.empty((n * m,) + trail, dtype=src.dtype, device=src.device)
        else:  # pad every block to m rows: one equal-block alltoall through the engine
            send = torch.zeros((n * m,) + trail, dtype=src.dtype, device=src.device)
            off = 0
            for p in range(n):
                send[p * m:p * m + sp[p]] = src[off:off + sp[p]]
                off += sp[p]
            buf = torch.empty_like(send)
        b = B.as_buf(send, "alltoall")
        o = B.as_buf(buf, "alltoall output", writable=True)
        hp = ffi.new("hora_handle_t **")
        check(lib.hora_alltoall_async(view.ctx, nm.encode(), b.ptr, o.ptr, m * row,
                                      b.dtype, b.device, hp), "hora.torch.alltoall")
        if send is src:
            result = (buf, rsplits)
        else:
            result = _Unpad(buf, recv, m)
        return _async.Handle(hp[0], (b, o, send), result)

    h._parts.append(_Chain(_meta(view, nm, _describe(tensor) + sp), then))
    h._finish = lambda outs: outs[0].get() if isinstance(outs[0], _Unpad) else outs[0]
    return h


class _Unpad:
    def __init__(self, buf, recv, m):
        self.buf, self.recv, self.m = buf, recv, m

    def get(self):
        parts = [self.buf[p * self.m:p * self.m + r] for p, r in enumerate(self.recv)]
        return torch.cat(parts), torch.tensor(self.recv, dtype=torch.int32)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, rsplits = alltoall_async(tensor, splits, name, process_set).wait()
        ctx.rsplits = rsplits
        ctx.rows = tensor.shape[0]
        ctx.ps = process_set
        ctx.mark_non_differentiable(rsplits)
        return out, rsplits

    @staticmethod
    def backward(ctx, grad, _):
        g, _ = alltoall(grad.contiguous(), splits=ctx.rsplits, process_set=ctx.ps)
        if g.shape[0] < ctx.rows:  # rows past sum(splits) were not sent: zero gradient
            g = torch.cat([g, g.new_zeros((ctx.rows - g.shape[0],) + tuple(g.shape[1:]))])
        return g, None, None, None


@_refusable("alltoall", _meta_contact)
def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatter blocks of rows to every rank and gather theirs. Returns the output tensor, or with
    `splits` given, (output, received_splits) as Horovod does (differentiable)."""
    _check_set(process_set, "alltoall")
    _check_tensor(tensor, "alltoall(tensor)")
    if torch.is_grad_enabled() and tensor.requires_grad:
        out, rsplits = _AlltoallFn.apply(tensor, splits, name, process_set)
    else:
        out, rsplits = alltoall_async(tensor, splits, name, process_set).wait()
    return out if splits is None else (out, rsplits)


# ---- reducescatter --------------------------------------------------------------------------
def _reducescatter_part(view, h, tensor, name, op, pre, post, kind, group=None):
    _check_tensor(tensor, f"{kind}(tensor)")
    if tensor.dim() == 0:
        raise invalid(f"{kind}(tensor): a 0-d tensor cannot be split across ranks")
    op = _check_op(op, kind, adasum=False)
    pre, post = float(pre), float(post)
    terms = _int_terms(tensor.dtype, op, pre, post)  # before _int_scaling turns Average into Sum
    shape = tuple(tensor.shape)
    # made only on a mismatch, of the values the caller passed (op changes below)
    note = ((lambda o=op: _int_note(f"shape {shape}", o, pre, post)) if terms else
            (lambda: f"this rank's tensor has shape {shape}"))
    nm = h._claim(name, "reducescatter", view)
    n, me = _view_size(view), _view_rank(view)
    rows = tensor.shape[0]
    sizes = [rows // n + (1 if p < rows % n else 0) for p in range(n)]
    m = sizes[0]
    trail = tuple(tensor.shape[1:])
    with torch.no_grad():
        if rows % n == 0:
            send = tensor.detach()
        else:  # pad every rank's block to m rows; the padding is dropped from the result
            send = torch.zeros((n * m,) + trail, dtype=tensor.dtype, device=tensor.device)
            off = 0
            for p in range(n):
                send[p * m:p * m + sizes[p]] = tensor[off:off + sizes[p]]
                off += sizes[p]
        ipost = None
        cpre, cpost = pre, post  # floating dtypes: hora_reducescatter_async scales, as Horovod
        if tensor.dtype in _INT_DTYPES:
            cpre = cpost = 1.0  # integers: scaled here the way Horovod does (_int_scaling)
            if op == Average or pre != 1.0 or post != 1.0:
                if rows % n == 0:
                    send = send.clone()  # scaled in place below: never the caller's tensor
                op, ipost = _int_scaling(send, op, pre, post, n)
    out = torch.empty((m,) + trail, dtype=tensor.dtype, device=tensor.device)
    b = B.as_buf(send, kind)
    o = B.as_buf(out, f"{kind} output", writable=True)
    hp = ffi.new("hora_handle_t **")
    # Ranks must agree on the whole shape, as in Horovod ("Mismatched REDUCESCATTER tensor
    # shapes"), not only on the count ([17, 1311] against [17, 23, 57]): the shape fingerprint.
    # The engine compares the op and scale factors it applies; those of integer tensors, applied
    # here, ride in the fingerprint ("Mismatched prescale and/or postscale factors").
    lib.hora_set_call_shape(view.ctx, _shape_fp(tuple(tensor.shape) + terms))
    _set_group(view, group, kind)  # a grouped member (see _meta): last, right before the call
    check(lib.hora_reducescatter_async(view.ctx, nm.encode(), b.ptr, o.ptr, m * _row(tensor),
                                       b.dtype, op, cpre, cpost, b.device, hp), f"hora.torch.{kind}")

    def finish(res):
        res = res[:sizes[me]]
        if ipost is None:
            return res
        return _apply_post(res, ipost)
    return _ShapeNote(_async.Handle(hp[0], (b, o, send), out), note), finish


@_refusable("reducescatter", _one)
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Start a reduce-scatter: rank r gets its block of rows of the reduction (the first
    rows % size ranks get one row more, as in Horovod)."""
    view = _check_set(process_set, "reducescatter_async")
    h = TorchHandle()
    part, fin = _reducescatter_part(view, h, tensor, name, op, prescale_factor, postscale_factor,
                                    "reducescatter_async")
    h._parts.append(part)
    h._finish = lambda outs: fin(outs[0])
    return h


def _reducescatter_grad_scale(op, pre, post, ps):
    """Horovod 0.28's factor on a reducescatter's incoming gradient before the allgather
    (HorovodReducescatter.backward): the set size for Sum (and 1 for Average: no division),
    times prescale, times postscale."""
    scale = float(_view_size(_check_set(ps, "reducescatter"))) if op == Sum else 1.0
    return scale * pre * post


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, pre, post, process_set):
        ctx.args = (_reducescatter_grad_scale(op, pre, post, process_set), process_set)
        return reducescatter_async(tensor, name, op, process_set, pre, post).wait()

    @staticmethod
    def backward(ctx, grad):
        scale, ps = ctx.args
        g = grad.contiguous()
        if scale != 1.0:
            g = g * scale
        return allgather(g, process_set=ps), None, None, None, None, None


@_refusable("reducescatter", _one)
def reducescatter(tensor, name=None, compression=None, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """This rank's block of rows of the reduction over ranks (differentiable)."""
    _check_set(process_set, "reducescatter")
    _check_tensor(tensor, "reducescatter(tensor)")
    comp = _compressor(compression)
    t, cctx = comp.compress(tensor)
    t = t.contiguous()
    if torch.is_grad_enabled() and t.requires_grad:
        out = _ReducescatterFn.apply(t, name, op, float(prescale_factor),
                                     float(postscale_factor), process_set)
    else:
        out = reducescatter_async(t, name, op, process_set, prescale_factor,
                                  postscale_factor).wait()
    return comp.decompress(out, cctx)


@_refusable("grouped_reducescatter", _grouped_rs_contact)
def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Start the reduce-scatter of each tensor of a list (names `<name>.<index>`)."""
    view = _check_set(process_set, "grouped_reducescatter_async")
    tensors = list(tensors)
    if not tensors:
        raise invalid("grouped_reducescatter_async: the list of tensors is empty")
    _check_members(tensors, "grouped_reducescatter_async", "cannot be split across ranks")
    _check_op(op, "grouped_reducescatter_async", adasum=False)
    h = TorchHandle()
    base = h._claim(name, "grouped_reducescatter", view)
    group = _group_tag([f"{base}.{i}" for i in range(len(tensors))])
    fins = []
    for i, t in enumerate(tensors):
        part, fin = _reducescatter_part(view, h, t, f"{base}.{i}", op, prescale_factor,
                                        postscale_factor, "grouped_reducescatter_async", group)
        h._parts.append(part)
        fins.append(fin)
    h._finish = lambda outs: [f(o) for f, o in zip(fins, outs)]
    return h


@_refusable("grouped_reducescatter", _grouped_rs_contact)
def grouped_reducescatter(tensors, name=None, compression=None, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    comp = _compressor(compression)
    pairs = [comp.compress(t) for t in tensors]
    sent = [p[0].contiguous() for p in pairs]
    if torch.is_grad_enabled() and any(t.requires_grad for t in sent):
        outs = _GroupedReducescatterFn.apply(name, op, float(prescale_factor),
                                             float(postscale_factor), process_set, *sent)
    else:
        outs = grouped_reducescatter_async(sent, name, op, process_set, prescale_factor,
                                           postscale_factor).wait()
    return [comp.decompress(o, p[1]) for o, p in zip(outs, pairs)]


class _GroupedReducescatterFn(torch.autograd.Function):
    """Horovod 0.28's HorovodGroupedReducescatter: each member's gradient as reducescatter's."""

    @staticmethod
    def forward(ctx, name, op, pre, post, process_set, *tensors):
        ctx.args = (_reducescatter_grad_scale(op, pre, post, process_set), process_set)
        return tuple(grouped_reducescatter_async(list(tensors), name, op, process_set, pre,
                                                 post).wait())

    @staticmethod
    def backward(ctx, *grads):
        scale, ps = ctx.args
        g = [x.contiguous() * scale if scale != 1.0 else x.contiguous() for x in grads]
        return (None, None, None, None, None, *grouped_allgather(g, process_set=ps))


# ---- barrier, join --------------------------------------------------------------------------
def barrier(process_set=global_process_set):
    """Return once every rank has entered barrier()."""
    view = _check_set(process_set, "barrier")
    check(lib.hora_barrier(view.ctx), "hora.torch.barrier")


def join(device=-1):
    """A rank out of data calls join(); the other ranks' allreduces proceed with zeros from it.
    Returns the rank that joined last, once all have. `device` is accepted as in Horovod; hora
    makes the zeros itself, on this rank's GPU for the others' CUDA tensors."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise invalid(f"join(device={device!r}): device must be an int")
    return _async.join()
