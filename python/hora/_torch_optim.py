"""hora.torch's DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state,
broadcast_object and allgather_object, with horovod.torch's (0.28) signatures and behaviour."""
import contextlib
import io
import itertools
import pickle
import warnings

import numpy as np
import torch

from . import _buffers as B
from ._compression import Compression
from ._core import Average, Sum, _root, rank, size
from ._errors import MismatchError, invalid
from ._hora_cffi import lib
from ._torch_gather import (_group_tag, _set_group, allgather, allgather_async, broadcast_,
                            broadcast_async_)
from ._torch_ops import (Adasum, _OP_NAMES, _check_op, allreduce_async_, grouped_allreduce_async_,
                         synchronize)
from ._torch_adasum import (_DistributedAdasumOptimizer, _claim_hook, _compression_name,
                            _count_backward_pass, _gather_layouts, _settings_disagreement,
                            _warn_taken_over)
from ._torch_psets import ProcessSet, _check_set, _view_size, global_process_set


def _named_items(params, what):
    if isinstance(params, dict):
        return sorted(((str(k), v) for k, v in params.items()), key=lambda kv: kv[0])
    try:
        items = list(params)
    except TypeError:
        raise invalid(f"{what}: invalid params of type {type(params).__name__} (a state_dict, "
                      "named_parameters() or a list of tensors)") from None
    # named_parameters() pairs, or plain tensors (named by position, as Horovod does).
    return [(str(it[0]), it[1]) if isinstance(it, tuple) and len(it) == 2 else (f"param.{i}", it)
            for i, it in enumerate(items)]


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """The allreduce of a sparse COO tensor as Horovod does it: its indices and values are
    allgathered (names `<name>.indices`, `<name>.values`), so the result holds every rank's
    entries (duplicates summed when it is coalesced); op Average divides the values by the
    set's size, any other op sums. Returns a function that waits and returns the sparse result.
    Collective over process_set."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise invalid("sparse_allreduce_async: tensor must be a sparse COO torch tensor")
    view = _check_set(process_set, "sparse_allreduce_async")
    t = tensor.coalesce()
    hi = allgather_async(t.indices().t().contiguous(), name=f"{name}.indices",
                         process_set=process_set)
    hv = allgather_async(t.values().contiguous(), name=f"{name}.values", process_set=process_set)

    def handle():
        values, indices = synchronize(hv), synchronize(hi)
        if op == Average:
            values = values / _view_size(view)
        return torch.sparse_coo_tensor(indices.t(), values, t.shape)
    return handle


def broadcast_parameters(params, root_rank=0):
    """Copy root_rank's tensors into every rank's, in place: model.state_dict() (matched by
    sorted name), model.named_parameters(), or a list of tensors (matched by position).
    Collective. The broadcasts are one group (hora_set_call_group): ranks whose lists differ (a
    key more on one rank) get a MismatchError on every rank instead of waiting for a tensor the
    others never send; every item is checked before any is sent."""
    items, bufs = [], []
    for name, t in _named_items(params, "broadcast_parameters"):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
            raise invalid(f"broadcast_parameters: {name!r} is a "
                          f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.layout}, "
                          "not a dense tensor")
        buf = t.detach() if t.is_contiguous() else t.detach().contiguous()
        B.as_buf(buf, f"broadcast_parameters: {name!r}")  # its dtype and device, before any send
        items.append((name, t))
        bufs.append(buf)
    if not items:
        return
    view = _check_set(global_process_set, "broadcast_parameters")
    view.root(_root(root_rank), "broadcast_parameters")
    names = [f"broadcast_parameters.{name}" for name, _ in items]
    group = _group_tag(names)
    handles = []
    with torch.no_grad():
        for (name, t), buf, nm in zip(items, bufs, names):
            _set_group(view, group, "broadcast_parameters")
            try:
                handles.append((t, buf, broadcast_async_(buf, root_rank, name=nm)))
            except BaseException:
                _set_group(view, (0, 0), "broadcast_parameters")  # not left for the next call
                raise
        first = None
        for t, buf, h in handles:  # every one, so that none is left in flight
            try:
                synchronize(h)
            except MismatchError as e:
                first = first or e
                continue
            if buf.data_ptr() != t.data_ptr():
                t.copy_(buf)
    if first is not None:
        raise MismatchError(f"broadcast_parameters: the ranks' tensors differ (every rank must "
                            f"pass the same names, shapes and dtypes): {first}",
                            lib.HORA_ERR_MISMATCH)


try:
    # Horovod's serializer for broadcast_object/allgather_object: lambdas, closures and classes
    # defined in functions pickle too. torch.save keeps tensors' storages compact around it.
    import cloudpickle as _pickle_module
except ImportError:  # the standard pickle: such objects are then a PicklingError
    _pickle_module = pickle


def _dumps(obj):
    f = io.BytesIO()
    torch.save(obj, f, pickle_module=_pickle_module, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    return torch.from_numpy(np.frombuffer(f.getbuffer(), dtype=np.uint8).copy())


def _try_dumps(obj):
    """(payload, None), or (None, the exception) where obj does not pickle: the caller first
    tells the other ranks, which would otherwise wait for this rank's bytes forever."""
    try:
        return _dumps(obj), None
    except Exception as e:  # PicklingError, TypeError, AttributeError: whatever pickle raises
        return None, e


def _loads(t):
    return torch.load(io.BytesIO(t.numpy().tobytes()), weights_only=False)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's Python object on every rank. Collective. Pickled with cloudpickle where it is
    installed, as Horovod does (else pickle), tensors inside by torch. A root whose object does
    not pickle raises pickle's error, and every other rank a ValueError naming the root."""
    _check_set(process_set, "broadcast_object")
    # Horovod's default name is type(obj).__name__, which differs between a root passing an
    # object and ranks passing None (the usual call) and then never matches: one fixed name.
    name = "broadcast_object" if name is None else name
    failure = None
    if rank() == root_rank:
        payload, failure = _try_dumps(obj)
        n = torch.tensor([-1 if failure else payload.numel()], dtype=torch.int64)
    else:
        payload, n = None, torch.zeros(1, dtype=torch.int64)
    broadcast_(n, root_rank, name=f"{name}.sz", process_set=process_set)
    if int(n[0]) < 0:  # the root's object did not pickle: an error on every rank, no wait
        if failure is not None:
            raise failure
        raise ValueError(f"broadcast_object: root rank {root_rank} could not pickle its object "
                         f"(its error is raised there)")
    if payload is None:
        payload = torch.empty(int(n[0]), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.t", process_set=process_set)
    return obj if rank() == root_rank else _loads(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list, in rank order, of every rank's Python object (pickled). Collective. A rank whose
    object does not pickle raises pickle's error, and every other rank a ValueError naming it."""
    view = _check_set(process_set, "allgather_object")
    name = "allgather_object" if name is None else name
    payload, failure = _try_dumps(obj)
    sizes = allgather(torch.tensor([-1 if failure else payload.numel()], dtype=torch.int64),
                      name=f"{name}.sz", process_set=process_set)
    bad = [i if view.ranks is None else view.ranks[i]
           for i, s in enumerate(sizes.tolist()) if s < 0]
    if bad:
        if failure is not None:
            raise failure
        raise ValueError(f"allgather_object: rank(s) {bad} could not pickle their objects (the "
                         f"error is raised there)")
    data = allgather(payload, name=f"{name}.t", process_set=process_set)
    out, off = [], 0
    for s in sizes.tolist():
        out.append(_loads(data[off:off + s]))
        off += s
    return out


def _step_on_zero_grads(optimizer, step):
    """Create an optimizer's per-parameter state (momentum buffers, Adam moments) as Horovod
    does: every parameter that requires grad gets a zero .grad, and step() runs once. With
    weight decay that step also moves the parameters (SGD by lr * wd * p, AdamW by a factor
    1 - lr * wd). Returns [(parameter, its value before the step)], for the caller to put back."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    saved = [(p, p.detach().clone()) for p in params]
    for p in params:
        p.grad = torch.zeros_like(p)
        if isinstance(optimizer, torch.optim.SparseAdam):
            p.grad = p.grad.to_sparse()
    step()
    return saved


def broadcast_optimizer_state(optimizer, root_rank=0, model=None):
    """Make every rank's optimizer state (step counts, momentum buffers, learning rates, ...)
    root_rank's, in place. An optimizer without state yet (never stepped) first gets it as
    Horovod does: every parameter that requires grad gets a zero .grad and the wrapped
    optimizer steps once.

    Where some ranks took that step and others did not, the ones that did put their parameters
    back: with weight decay the step moves them, and in the resume pattern of Horovod's own
    examples (rank 0 alone loads a checkpoint, so it has state and does not step; then
    broadcast_parameters, then this) the other ranks would train on other weights than rank 0's
    from then on, silently, as they do with Horovod 0.28. Where every rank took it (a fresh
    start), the parameters stay as the step left them, the same on every rank and the same
    numbers as Horovod's (docs/horovod.md, "What differs"). Collective."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    saved = None
    if len(state_dict["state"]) == 0:
        if hasattr(optimizer, "_hora_names"):  # a DistributedOptimizer
            # The wrapped class's step: a distributed step would wait for every rank's grads.
            saved = _step_on_zero_grads(optimizer, super(optimizer.__class__, optimizer).step)
        else:
            saved = _step_on_zero_grads(optimizer, optimizer.step)
        state_dict = optimizer.state_dict()
    # Root's structure decides: a rank whose state differs in shape gets root's state whole.
    tensors, scalars = [], {}
    for pid in sorted(state_dict["state"]):
        for key in sorted(state_dict["state"][pid]):
            v = state_dict["state"][pid][key]
            if torch.is_tensor(v):
                tensors.append((f"{pid}.{key}", v))
            else:
                scalars[(pid, key)] = v
    layout = [(n, tuple(v.shape), str(v.dtype)) for n, v in tensors]
    same = broadcast_object(layout, root_rank, name="broadcast_optimizer_state.layout")
    # [this rank's layout is root's, this rank took the zero-gradient step]; Min over the ranks.
    flags = torch.tensor([1 if same == layout else 0, 0 if saved is None else 1],
                         dtype=torch.int32)
    from ._torch_ops import allreduce
    from ._core import Min
    agree, all_stepped = allreduce(flags, op=Min, name="broadcast_optimizer_state.agree").tolist()
    if saved is not None and not all_stepped:
        with torch.no_grad():
            for p, value in saved:
                p.copy_(value)
    if agree == 0:
        state = broadcast_object(optimizer.state_dict() if rank() == root_rank else None,
                                 root_rank, name="broadcast_optimizer_state.whole")
        if rank() != root_rank:
            optimizer.load_state_dict(state)
        return
    broadcast_parameters([(f"state.{n}", t) for n, t in tensors], root_rank)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    groups, scalars = broadcast_object((groups, scalars), root_rank,
                                       name="broadcast_optimizer_state.scalars")
    if scalars:
        # Non-tensor state (a Python int step count: optimizers outside torch.optim, and torch's
        # own Adadelta, Adagrad, Rprop ... before PyTorch 2.2) goes in through load_state_dict,
        # which also puts back the param_groups of this rank's state_dict: so before root's
        # options below, or every rank kept its own learning rate.
        for (pid, key), v in scalars.items():
            state_dict["state"][pid][key] = v
        optimizer.load_state_dict(state_dict)
    for g, opts in zip(optimizer.param_groups, groups):
        g.update(opts)


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class by DistributedOptimizer()."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set):
        super(self.__class__, self).__init__(params)
        all_params = [p for g in self.param_groups for p in g["params"]]
        names = _param_names(all_params, named_parameters)
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be an int >= 1")
        self._hora_op = _check_op(op, "DistributedOptimizer")
        if gradient_predivide_factor != 1.0 and self._hora_op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        # A rank outside process_set steps on its own gradients, as in Horovod (no hooks, no
        # collectives).
        self._hora_outside = isinstance(process_set, ProcessSet) and \
            process_set.included() is False
        self._hora_view = None if self._hora_outside else _check_set(process_set,
                                                                     "DistributedOptimizer")
        self._hora_set = process_set
        self._hora_opt_id = next(_optimizer_count)  # the k-th DistributedOptimizer (names)
        # Its requests' prefix: "grad" for the process's first, "grad.opt<k>" for its k-th (two
        # optimizers stepped after one backward, whose parameters may share names: an encoder's
        # and a decoder's "weight").
        self._hora_prefix = "grad" if self._hora_opt_id == 0 else f"grad.opt{self._hora_opt_id}"
        self._hora_names = {p: f"{self._hora_prefix}.{names[id(p)]}" for p in all_params}
        self._parameter_names = {p: names[id(p)] for p in all_params}  # Horovod's attribute
        self._hora_compression = compression
        self._hora_passes = backward_passes_per_step
        self._hora_pre = 1.0 / gradient_predivide_factor
        self._hora_post = float(gradient_predivide_factor)
        self._hora_sparse_as_dense = bool(sparse_as_dense)
        self._hora_bucketed = groups is None
        self._hora_groups_arg = groups
        if groups is None:
            self._hora_group_of, self._hora_groups = _buckets(all_params, _BUCKET_BYTES)
        else:
            self._hora_group_of, self._hora_groups = _param_groups(all_params, groups)
        self._hora_delay = {p: backward_passes_per_step for p in all_params}
        self._hora_checked = False  # _hora_check_layout done (again after add_param_group)
        self._hora_ready = {}  # group index -> parameters whose gradient is ready
        self._hora_handles = {}  # parameter -> (handle, finish) or group index -> ...
        self._hora_synced = False
        self._hora_skip = False
        self._hora_hooks = {}  # parameter -> its hook's handle
        self._hora_released = set()  # parameters whose hook a later optimizer took
        _warn_taken_over(self._hora_add_hooks(all_params))
        # Which parameters required grad when the buckets were made (_hora_follow_freezing).
        self._hora_trainable = self._hora_trainable_now()

    def _hora_add_hooks(self, params):
        """A post-accumulate-grad hook on each of params that requires grad and has none yet
        (torch refuses a hook on a tensor that does not require grad: a parameter frozen now
        gets its hook when it is unfrozen, see _hora_follow_freezing)."""
        if self._hora_outside:
            return []
        taken = []
        for p in params:
            if p.requires_grad and p not in self._hora_hooks and p not in self._hora_released:
                self._hora_hooks[p], moved = _claim_hook(self, p, self._hora_hook)
                if moved:
                    taken.append(self._parameter_names[p])
        return taken

    def _hora_release(self, p):
        """A later DistributedOptimizer took p's hook (_claim_hook): no hook of this optimizer
        on p again. If this optimizer is still stepped, synchronize() averages p's gradient
        then (as a parameter whose hook did not fire), so its replicas stay equal."""
        self._hora_hooks.pop(p, None)
        self._hora_released.add(p)

    def _hora_trainable_now(self):
        return tuple(p.requires_grad for p in self._hora_names)

    def _hora_follow_freezing(self, now):
        """After a step in which parameters were frozen or unfrozen (p.requires_grad_()) since
        the buckets were made (fine-tuning that freezes a backbone, or unfreezes it, after the
        optimizer was built): the buckets (or `groups=n`) are made again from the parameters that
        require grad now, the unfrozen ones get their hooks, and the next step checks the
        layout across ranks again. Rank-local; every rank that freezes the same parameters
        makes the same buckets, and one that froze others gets the layout check's
        MismatchError. `now`: _hora_trainable_now() of this step."""
        if now == self._hora_trainable:
            return
        self._hora_trainable = now
        params = list(self._hora_names)
        self._hora_add_hooks(params)
        if self._hora_bucketed:
            self._hora_group_of, self._hora_groups = _buckets(params, _BUCKET_BYTES)
        elif isinstance(self._hora_groups_arg, int):
            self._hora_group_of, self._hora_groups = _param_groups(params,
                                                                   self._hora_groups_arg)
        self._hora_checked = False

    def add_param_group(self, param_group):
        """torch.optim.Optimizer.add_param_group. The parameters of a group added after
        construction (a layer unfrozen, a head grown during training) are averaged like the
        others: hooks, buckets of their own, names by position ("param_group.<k>.<g>.<i>" for
        the process's k-th DistributedOptimizer, the same on every rank as long as every rank
        adds the same groups). Horovod 0.28 leaves them out, and each rank would step on its own
        gradients (docs/horovod.md, "What differs")."""
        super(self.__class__, self).add_param_group(param_group)
        if "_hora_names" not in self.__dict__:  # the groups torch's __init__ adds
            return
        gi = len(self.param_groups) - 1
        params = self.param_groups[gi]["params"]
        self._hora_checked = False
        for i, p in enumerate(params):
            self._parameter_names[p] = f"param_group.{self._hora_opt_id}.{gi}.{i}"
            self._hora_names[p] = f"{self._hora_prefix}.{self._parameter_names[p]}"
            self._hora_delay[p] = self._hora_passes
        if self._hora_bucketed:
            group_of, buckets = _buckets(params, _BUCKET_BYTES)
            base = len(self._hora_groups)
            self._hora_groups.extend(buckets)
            self._hora_group_of.update({p: base + i for p, i in group_of.items()})
        self._hora_add_hooks(params)
        self._hora_trainable = self._hora_trainable_now()

    def _hora_hook(self, p):
        # Runs inside backward, right after p.grad has been accumulated.
        if _count_backward_pass(self._hora_delay, p) == 0:
            self._hora_mark_ready(p)

    def _hora_settings(self):
        """What every rank's optimizer must be built with, besides its parameters: when and how
        the gradients are averaged. Ranks that differ would wait for each other (another
        backward_passes_per_step), or average differently without an error the engine could
        give (the engine sees some of these only as other fields, some not at all)."""
        return {"op": _OP_NAMES.get(self._hora_op, self._hora_op),
                "backward_passes_per_step": self._hora_passes,
                "gradient_predivide_factor": self._hora_post,
                "compression": _compression_name(self._hora_compression),
                "sparse_as_dense": self._hora_sparse_as_dense,
                "groups": "buckets" if self._hora_bucketed else "the caller's groups"}

    def _hora_mismatch(self, message):
        """Raise MismatchError(message); nothing was submitted, so the next backward starts
        afresh (and checks again)."""
        self._hora_ready = {}
        for q in self._hora_delay:
            self._hora_delay[q] = self._hora_passes
        raise MismatchError(message, lib.HORA_ERR_MISMATCH)

    def _hora_check_layout(self):
        """Before this optimizer's first request (and the first after add_param_group): every
        rank's settings (_hora_settings) and list of trainable parameters (name, shape, dtype,
        bucket) must be rank 0's, or every rank raises MismatchError naming the first difference.
        Buckets are named by index, so ranks whose models differ would otherwise reduce one
        rank's parameter with another's of the same size (silently), or wait for a bucket member
        the other rank never submits. One allgather_object per check (a few kB), inside the first
        backward. Collective over the optimizer's process set."""
        params = [(self._parameter_names[p], tuple(p.shape), str(p.dtype),
                   self._hora_group_of.get(p, -1)) for p in self._hora_names if p.requires_grad]
        ranks, gathered = _gather_layouts(self._hora_settings(), params,
                                          f"{self._hora_prefix}.layout", self._hora_set)
        diff = _settings_disagreement(ranks, gathered)
        if diff:
            self._hora_mismatch(f"DistributedOptimizer: ranks disagree on its settings: {diff} "
                                f"(every rank must wrap its optimizer with the same arguments)")
        every = [g[1] for g in gathered]

        def at(layout, i):
            if i >= len(layout):
                return "nothing"
            name, shape, dtype, gi = layout[i]
            return f"{name!r} {list(shape)} {dtype}" + (f" (bucket {gi})" if gi >= 0 else "")
        for r, theirs in zip(ranks, every):
            if theirs == every[0]:
                continue
            # The parameters first (a parameter frozen on one rank shifts the buckets of the
            # rest; name the parameter, not a bucket), then the buckets.
            first = next((i for i, (a, b) in enumerate(zip(every[0], theirs)) if a[:3] != b[:3]),
                         min(len(every[0]), len(theirs)))
            if first == len(every[0]) == len(theirs):
                first = next(i for i, (a, b) in enumerate(zip(every[0], theirs)) if a != b)
            self._hora_mismatch(
                f"DistributedOptimizer: ranks disagree on the parameters to average: rank "
                f"{ranks[0]} has {len(every[0])} trainable parameters, rank {r} has "
                f"{len(theirs)}; the first difference is at position {first}: rank {ranks[0]} "
                f"{at(every[0], first)}, rank {r} {at(theirs, first)} (every rank must build the "
                f"same model and optimizer, and freeze the same parameters)")
        self._hora_checked = True  # (on a mismatch every later step raises again)

    def _hora_mark_ready(self, p):
        if not self._hora_checked:
            self._hora_check_layout()
        gi = self._hora_group_of.get(p)
        if gi is None:
            self._hora_handles[p] = self._hora_start([p], self._hora_names[p], False)
            return
        ready = self._hora_ready.setdefault(gi, set())
        ready.add(p)
        if len(ready) == len(self._hora_groups[gi]):
            self._hora_handles[gi] = self._hora_start(self._hora_groups[gi],
                                                      self._hora_group_name(gi), True)

    def _hora_group_name(self, gi):
        """The request name of bucket or group gi: "grad.group.<gi>" for the process's first
        DistributedOptimizer, "grad.opt<k>.group.<gi>" for its k-th (k from 1), so that two
        optimizers of one program (an encoder's and a decoder's, a GAN's two) never submit the
        same name while their buckets are in flight together; every rank makes its optimizers
        in the same order. The name does not depend on the bucket's contents on purpose: ranks
        whose models differ (a parameter more on one rank) then submit the same names with
        other shapes and get a MismatchError, where names from the contents would never meet and
        the ranks would wait for each other."""
        return f"{self._hora_prefix}.group.{gi}"

    def _hora_start(self, params, name, grouped):
        """Submit the allreduce of the gradients of params (a bucket or group: grouped, else
        one parameter); returns the functions that wait and write the results into p.grad."""
        dense, sparse, densified = [], [], set()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            if p.grad.is_sparse:
                if self._hora_sparse_as_dense:
                    p.grad = p.grad.to_dense()
                    densified.add(p)
                else:
                    sparse.append(p)
                    continue
            if not p.grad.is_contiguous():
                p.grad = p.grad.contiguous()
            dense.append(p)
        waits = [self._hora_sparse(p) for p in sparse]
        if dense:
            comp = [self._hora_compression.compress(p.grad.detach()) for p in dense]
            bufs = [c[0].contiguous() for c in comp]
            kw = dict(op=self._hora_op, prescale_factor=self._hora_pre,
                      postscale_factor=self._hora_post, process_set=self._hora_set)
            if grouped:
                # A bucket or group is one grouped request even with one member left (its
                # others frozen, or sparse): ranks that disagree on its members then get a
                # MismatchError for every member (the group is part of what the ranks agree
                # on), where a lone member's own name would never meet the others' group.
                h = grouped_allreduce_async_(bufs, name=name, **kw)
            else:
                h = allreduce_async_(bufs[0], name=name, **kw)

            def finish():
                synchronize(h)
                for p, b, (_, ctx) in zip(dense, bufs, comp):
                    if b.data_ptr() != p.grad.data_ptr():
                        p.grad.copy_(self._hora_compression.decompress(b, ctx))
                    if p in densified:  # back to sparse before the update, as in Horovod
                        p.grad = p.grad.to_sparse()
            waits.append(finish)
        return waits

    def _hora_placeholder(self, name, grouped):
        """The stand-in of a request whose parameters are all frozen on this rank (synchronize)."""
        z = torch.zeros(1, dtype=torch.int8)
        kw = dict(op=Sum, process_set=self._hora_set)
        h = grouped_allreduce_async_([z], name=name, **kw) if grouped else \
            allreduce_async_(z, name=name, **kw)
        return [lambda: synchronize(h)]

    def _hora_sparse(self, p):
        handle = sparse_allreduce_async(p.grad, self._hora_names[p], self._hora_op,
                                        self._hora_set)

        def finish():
            p.grad = handle()
        return finish

    def synchronize(self):
        """Wait until every gradient's allreduce is done. Parameters whose gradient was not
        computed on this rank this step contribute zeros, so that every rank submits the same
        names (as in Horovod). On a rank outside the optimizer's process set: nothing."""
        if self._hora_outside:
            self._hora_synced = True
            return
        for p in self._hora_names:
            if p.requires_grad and self._hora_delay[p] > 0 and \
                    p not in self._hora_handles and \
                    not (self._hora_group_of.get(p) in self._hora_handles):
                self._hora_delay[p] = 0
                self._hora_mark_ready(p)
        # A request of this optimizer left without any member on this rank (a parameter alone
        # in its bucket, or with groups=0, frozen since the buckets were made) is submitted as a
        # placeholder: one int8 zero, Sum, under its name. A rank still training the parameter
        # cannot match it (dtype, op, group) and gets a MismatchError instead of waiting for a
        # request this rank would never send; ranks that all froze it submit the same placeholder.
        # Only in a step whose trainable set differs from the buckets' (once per change).
        now = self._hora_trainable_now()
        frozen = [] if now == self._hora_trainable else \
            [(p, name) for (p, name), was, is_now in
             zip(self._hora_names.items(), self._hora_trainable, now) if was and not is_now]
        for p, name in frozen:
            gi = self._hora_group_of.get(p)
            if gi is None and p not in self._hora_handles:
                self._hora_handles[p] = self._hora_placeholder(name, False)
            elif gi is not None and gi not in self._hora_handles and not self._hora_ready.get(gi):
                self._hora_handles[gi] = self._hora_placeholder(self._hora_group_name(gi), True)
        # A bucket or group still not started holds parameters frozen since it was made
        # (requires_grad False now: no gradient, no hook): its other members are averaged
        # without them, and the frozen ones keep no gradient, as in one process (Horovod 0.28
        # would give them a zero gradient, which momentum and weight decay then step on). Without
        # this the bucket's ready members were never averaged, and each rank stepped on its own
        # gradients.
        for gi, ready in self._hora_ready.items():
            if ready and gi not in self._hora_handles:
                self._hora_handles[gi] = self._hora_start(
                    [q for q in self._hora_groups[gi] if q in ready], self._hora_group_name(gi),
                    True)
        handles, self._hora_handles = self._hora_handles, {}
        self._hora_ready = {}
        try:
            for waits in handles.values():
                for w in waits:
                    w()
        except BaseException:
            # Every rank gets the error of a mismatch; every rank checks the layout again at
            # its next step, and one whose parameters differ then gets the check's
            # MismatchError naming them (rather than some ranks checking and the others not).
            self._hora_checked = False
            raise
        finally:
            for p in self._hora_delay:
                self._hora_delay[p] = self._hora_passes
            # Also after a failure (ranks that froze different parameters: MismatchError), so
            # that the next step's layout check names the parameters the ranks disagree on.
            self._hora_follow_freezing(now)
        self._hora_synced = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize (call synchronize() yourself first,
        for example to clip the averaged gradients)."""
        self._hora_skip = True
        try:
            yield
        finally:
            self._hora_skip = False

    def step(self, closure=None):
        if not self._hora_skip:
            if self._hora_synced:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._hora_synced = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        if self._hora_handles or any(self._hora_ready.values()):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def _param_names(all_params, named_parameters):
    if named_parameters is None:
        # Names by position: every rank builds the same model, so positions match.
        return {id(p): f"allreduce.noname.{i}" for i, p in enumerate(all_params)}
    named = list(named_parameters)
    if any(not isinstance(n, str) for n, _ in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    names = {id(p): n for n, p in named}
    if len(set(n for n, _ in named)) != len(named):
        dups = sorted({n for n, _ in named if [m for m, _ in named].count(n) > 1})
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(dups)}")
    missing = [i for i, p in enumerate(all_params) if id(p) not in names]
    if missing:
        raise ValueError(f"named_parameters was specified, but one or more model parameters "
                         f"were not named ({len(missing)} of them). Python object ids: "
                         f"{', '.join(str(id(all_params[i])) for i in missing)}")
    return names


# Without `groups`, gradients are averaged in buckets of about this many bytes (as DDP's
# bucket_cap_mb): one grouped allreduce per bucket, submitted from the hook of its last gradient
# to become ready. One allreduce_async_ per gradient (Horovod's way; 0 here) costs a Python call,
# a name and an engine request per tensor, and the engine then negotiates and reduces the
# gradients in as many groups as backward spreads them over cycles (ResNet-50: 161 tensors);
# docs/benchmarks.md ("ResNet-50 gradients") measures the two.
_BUCKET_BYTES = 25 * 1024 * 1024
# DistributedOptimizers made so far in this process (their request names: _hora_group_name).
_optimizer_count = itertools.count()


def _buckets(all_params, cap_bytes):
    """Static buckets of the trainable parameters, in reverse order of registration (about the
    order in which backward produces their gradients; the same on every rank, so the grouped
    requests match), each closed when the next parameter would take it past cap_bytes (a larger
    parameter gets a bucket of its own). cap_bytes <= 0: no buckets (one request per gradient).
    Returns ({param: bucket index}, buckets), the shape of _param_groups'."""
    if cap_bytes <= 0:
        return {}, []
    out, cur, used = [], [], 0
    for p in reversed(all_params):
        if not p.requires_grad:
            continue
        nbytes = p.numel() * p.element_size()
        if cur and used + nbytes > cap_bytes:
            out.append(cur)
            cur, used = [], 0
        cur.append(p)
        used += nbytes
    if cur:
        out.append(cur)
    return {p: i for i, b in enumerate(out) for p in b}, out


def _param_groups(all_params, groups):
    """Horovod's `groups`: an int n >= 0 (n contiguous groups of the parameters, 0: none) or a
    list of lists of parameters (others stay alone). Returns ({param: group index}, groups)."""
    if groups is None or groups == 0:
        return {}, []
    trainable = [p for p in all_params if p.requires_grad]
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError("groups should be a non-negative integer or a list of list of "
                             "torch.Tensor.")
        parts = [list(a) for a in np.array_split(np.arange(len(trainable)), groups) if len(a)]
        gl = [[trainable[i] for i in part] for part in parts]
    elif isinstance(groups, list) and all(isinstance(g, (list, tuple)) and
                                          all(isinstance(t, torch.Tensor) for t in g)
                                          for g in groups):
        gl = [list(g) for g in groups if len(g)]
    else:
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    group_of = {}
    for i, g in enumerate(gl):
        for p in g:
            if p in group_of:
                raise ValueError("groups: a parameter appears in more than one group")
            group_of[p] = i
    return group_of, gl


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set):
    """Wrap a torch.optim optimizer so that gradients are averaged (op) across ranks.

    During backward a hook on each parameter marks its gradient ready once it has been
    accumulated backward_passes_per_step times; when every gradient of a bucket (about 25 MB of
    parameters in reverse registration order, as DDP's buckets; or a group given by `groups`) is
    ready, one grouped asynchronous allreduce of the bucket starts. step() waits for all of them
    (synchronize()) and applies the wrapped optimizer's update. The results are Horovod's (each
    gradient averaged over the ranks); only the requests are fewer than Horovod's one per
    gradient. The
    returned object is an instance of a subclass of the optimizer's class. It takes over the
    wrapped optimizer's defaults and per-parameter state (Horovod 0.28 drops both; see
    _carry_over).

    compression: Compression.none/fp16/bf16. gradient_predivide_factor f: gradients are scaled
    by 1/f before the sum and by f/size after it (op Average only). num_groups (deprecated) /
    groups: an int n (n groups, each one grouped allreduce) or a list of lists of parameters
    (the others then each get their own request, as in Horovod).
    sparse_as_dense: sparse gradients become dense for the allreduce and sparse again before
    the update (else they are allgathered). process_set: the ranks that average their gradients together (a registered
    ProcessSet); on a rank outside it the optimizer steps on that rank's own gradients, as in
    Horovod.

    op=Adasum on more than one rank is Horovod's delta optimizer (_torch_adasum.py): each rank
    steps on its own gradients and the parameter deltas are combined with Adasum in step()
    (CPU parameters; a power-of-two number of ranks in the set, else ValueError on every rank;
    synchronize() does nothing and skip_synchronize() is an AssertionError, as in Horovod). On
    one rank it is the ordinary optimizer, as in Horovod.
    """
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if _check_op(op, "DistributedOptimizer") == Adasum and size() > 1:
        if gradient_predivide_factor != 1.0:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        view = _check_set(process_set, "DistributedOptimizer")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError("DistributedOptimizer: backward_passes_per_step must be an int >= 1")
        all_params = [p for g in optimizer.param_groups for p in g["params"]]
        names = _param_names(all_params, named_parameters)
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return _carry_over(optimizer, cls(optimizer.param_groups, names, compression,
                                          backward_passes_per_step, process_set, view))
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return _carry_over(optimizer, cls(optimizer.param_groups, named_parameters, compression,
                                      backward_passes_per_step, op, gradient_predivide_factor,
                                      groups, sparse_as_dense, process_set))


def _carry_over(wrapped, opt):
    """The new optimizer is built from the wrapped one's param_groups alone, so torch gives it the
    optimizer class's constructor defaults (SGD: lr=0.001, momentum=0) and empty state. It takes
    over the wrapped optimizer's defaults, which add_param_group fills a new group from (else a
    group added with only its "lr" would train without the momentum every other group has), and
    its per-parameter state (a checkpoint loaded before wrapping would otherwise be dropped:
    momentum buffers and Adam moments back to nothing). Horovod 0.28 drops both
    (docs/horovod.md, "What differs"). Returns opt."""
    opt.defaults = dict(wrapped.defaults)
    for p, st in wrapped.state.items():
        opt.state[p] = st
    return opt
