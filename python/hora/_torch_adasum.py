"""DistributedOptimizer(op=Adasum) on more than one rank: Horovod's delta optimizer
(horovod.torch's _DistributedAdasumOptimizer). Each rank takes the wrapped optimizer's step on
its own gradients, the update deltas (new - old parameters) are combined with Adasum (one Adasum
per parameter), and every rank applies the combined delta to the old parameters:

    start = p;  p = step(p, g_r);  delta_r = p - start;  p = start + Adasum_r(delta_r)

so the learning rate is not scaled by the number of ranks (Adasum of equal deltas is that delta;
of orthogonal ones, their sum).

Also the gradient-hook helpers both DistributedOptimizer classes share (_count_backward_pass,
_claim_hook): here because _torch_optim imports this module."""
import contextlib
import warnings
import weakref

import torch

from ._errors import MismatchError, check, invalid
from ._hora_cffi import ffi, lib
from ._torch_ops import Adasum, grouped_allreduce_async_, synchronize
from ._torch_psets import _view_size


def _adasum_layout_problem(view, params):
    """What keeps op=Adasum from running on these parameters in this process set, or None; the
    same answer on every rank (hora.h, HORA_ADASUM): CPU tensors need a power-of-two number of
    ranks; GPU tensors (averaged within each node, Adasum between nodes, as Horovod's GPU Adasum)
    the same number of ranks on every node and a power-of-two number of nodes."""
    n = _view_size(view)
    if any(not p.is_cuda for p in params) and n & (n - 1):
        return f"Adasum needs a power-of-two number of ranks, the process set has {n}"
    if not any(p.is_cuda for p in params):
        return None
    out = ffi.new("int *")
    check(lib.hora_is_homogeneous(view.ctx, out))
    if not out[0]:
        return ("Adasum of GPU tensors needs the same number of ranks on every node, as "
                "Horovod's GPU Adasum does")
    check(lib.hora_cross_size(view.ctx, out))
    if out[0] & (out[0] - 1):
        return (f"Adasum of GPU tensors needs a power-of-two number of nodes, the process set "
                f"spans {out[0]}")
    return None


def _compression_name(comp):
    """A compression's name for the cross-rank settings check (Compression.none is a class)."""
    return getattr(comp, "__name__", type(comp).__name__)


def _gather_layouts(settings, params, name, process_set):
    """Every rank's (settings, params) of an optimizer, from one allgather_object: (the world
    ranks in set order, [(settings, params) per rank]). Collective over process_set."""
    from ._torch_optim import allgather_object  # (that module imports this one)
    every = allgather_object((settings, params), name=name, process_set=process_set)
    return (process_set.ranks if process_set.process_set_id else range(len(every))), every


def _settings_disagreement(ranks, every):
    """'k a on rank 0 and b on rank r; ...' for the first rank whose settings (a dict) differ
    from the set's first rank's, or None."""
    first = every[0][0]
    for r, (theirs, _) in zip(ranks, every):
        diff = [f"{k} {first.get(k)!r} on rank {ranks[0]} and {v!r} on rank {r}"
                for k, v in theirs.items() if v != first.get(k)]
        if diff:
            return "; ".join(diff)
    return None


def _count_backward_pass(delay, p):
    """One more gradient of p accumulated (its post-accumulate hook, inside backward): counts down
    delay[p] from backward_passes_per_step and returns what is left; Horovod's AssertionError
    when more passes came than the optimizer was told to accumulate."""
    if delay[p] <= 0:
        raise AssertionError("Gradients were computed more than backward_passes_per_step "
                             "times before call to step(). Increase "
                             "backward_passes_per_step to accumulate gradients locally.")
    delay[p] -= 1
    return delay[p]


# Which DistributedOptimizer holds each parameter's gradient hook: id(parameter) -> (weak
# references to that optimizer and to the parameter, the hook's handle). A parameter has one
# hook of hora's at a time (_claim_hook).
_hook_owner = {}


def _claim_hook(opt, p, hook):
    """p.register_post_accumulate_grad_hook(hook) for opt, taking p over from an earlier
    DistributedOptimizer that still holds a hook on it: that hook is removed and the earlier
    optimizer told (its _hora_release). Returns (handle, whether p was taken over).

    Why: a trainer that wraps its optimizer again each epoch, or a second phase that wraps a new
    optimizer over the same model, left the earlier optimizer's hook counting backward passes it
    is never stepped for: Horovod 0.28 (and hora before this) raised AssertionError ("Gradients
    were computed more than backward_passes_per_step times") at the second backward."""
    moved = False
    prev = _hook_owner.get(id(p))
    if prev is not None:
        owner, param, handle = prev[0](), prev[1](), prev[2]
        if owner is not None and owner is not opt and param is p:
            handle.remove()
            owner._hora_release(p)
            moved = True
    handle = p.register_post_accumulate_grad_hook(hook)
    _hook_owner[id(p)] = (weakref.ref(opt), weakref.ref(p), handle)
    return handle, moved


def _warn_taken_over(names):
    """The UserWarning of a DistributedOptimizer that took parameters over (_claim_hook)."""
    if names:
        shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        warnings.warn(f"DistributedOptimizer: {len(names)} parameters ({shown}) were wrapped by an "
                      f"earlier DistributedOptimizer; their gradient hooks move to this one, and "
                      f"the earlier one averages them only in its own synchronize() if it is "
                      f"still stepped (Horovod 0.28 kept both hooks and raised AssertionError at "
                      f"the second backward; docs/horovod.md)", UserWarning, stacklevel=4)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class by DistributedOptimizer(op=Adasum)."""

    def __init__(self, params, names, compression, backward_passes_per_step, process_set, view):
        super(self.__class__, self).__init__(params)
        all_params = [p for g in self.param_groups for p in g["params"]]
        why = _adasum_layout_problem(view, all_params)
        if why:
            raise invalid(f"DistributedOptimizer(op=Adasum): {why}")
        self._hora_names = {p: "adasum.delta." + names[id(p)] for p in all_params}
        self._parameter_names = {p: names[id(p)] for p in all_params}  # Horovod's attribute
        self._hora_compression = compression
        self._hora_passes = backward_passes_per_step
        self._hora_set = process_set
        self._hora_delay = {p: backward_passes_per_step for p in all_params}
        self._hora_checked = False  # _hora_check_deltas done (again after add_param_group)
        self._hora_hooks = []
        taken = []
        for p in all_params:
            if p.requires_grad:
                handle, moved = _claim_hook(self, p, self._hora_hook)
                self._hora_hooks.append(handle)
                if moved:
                    taken.append(names[id(p)])
        _warn_taken_over(taken)

    def _hora_release(self, p):
        """A later DistributedOptimizer took p's hook (_claim_hook): its passes are no longer
        counted here; step() still combines its delta."""

    def add_param_group(self, param_group):
        """torch.optim.Optimizer.add_param_group; the deltas of a group added after construction
        are combined like the others (names "param_group.<g>.<i>"; see _DistributedOptimizer's)."""
        super(self.__class__, self).add_param_group(param_group)
        if "_hora_names" not in self.__dict__:  # the groups torch's __init__ adds
            return
        gi = len(self.param_groups) - 1
        self._hora_checked = False
        for i, p in enumerate(self.param_groups[gi]["params"]):
            self._hora_names[p] = f"adasum.delta.param_group.{gi}.{i}"
            self._parameter_names[p] = f"param_group.{gi}.{i}"
            self._hora_delay[p] = self._hora_passes
            if p.requires_grad:
                self._hora_hooks.append(_claim_hook(self, p, self._hora_hook)[0])

    def _hora_hook(self, p):
        _count_backward_pass(self._hora_delay, p)

    def synchronize(self):
        """Nothing to wait for: the Adasum optimizer combines the deltas in step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")
        yield  # pragma: no cover

    def _hora_check_deltas(self, params):
        """Before the first combination (and the first after add_param_group): every rank's
        deltas (name, shape, dtype, in submission order) and settings must be rank 0's, else
        every rank raises MismatchError naming the first difference, before any rank takes its
        local step. The deltas are one grouped request whose members are numbered by position, so
        ranks whose models list same-shaped parameters in another order would otherwise combine
        one rank's parameter with another's. One allgather_object (a few kB)."""
        settings = {"backward_passes_per_step": self._hora_passes,
                    "compression": _compression_name(self._hora_compression)}
        ranks, every = _gather_layouts(
            settings, [(self._hora_names[p], tuple(p.shape), str(p.dtype)) for p in params],
            "adasum.delta.layout", self._hora_set)
        diff = _settings_disagreement(ranks, every)
        for r, theirs in zip(ranks, every):
            if theirs == every[0]:
                continue
            if diff:
                what = f"settings: {diff}"
            else:
                a, b = every[0][1], theirs[1]
                i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                what = (f"parameters: rank {ranks[0]} has {len(a)}, rank {r} {len(b)}; the first "
                        f"difference is at position {i}: rank {ranks[0]} "
                        f"{a[i] if i < len(a) else 'nothing'}, rank {r} "
                        f"{b[i] if i < len(b) else 'nothing'}")
            raise MismatchError(f"DistributedOptimizer(op=Adasum): ranks disagree on the "
                                f"{what} (every rank must build the same model and optimizer)",
                                lib.HORA_ERR_MISMATCH)
        self._hora_checked = True

    def step(self, closure=None):
        """The wrapped optimizer's step on this rank's gradients, then every parameter becomes
        its value before the step plus the Adasum over the ranks of the step's deltas.
        Collective over the optimizer's process set."""
        loss = closure() if closure is not None else None
        # The trainable parameters now (a layer unfrozen since construction included), sorted by
        # name: every rank submits the deltas in the same order.
        params = sorted((p for p in self._hora_names if p.requires_grad),
                        key=lambda p: self._hora_names[p])
        if not self._hora_checked:
            self._hora_check_deltas(params)
        with torch.no_grad():
            starts = [p.detach().clone() for p in params]
            super(self.__class__, self).step()
            deltas = [(p.detach() - s).contiguous() for p, s in zip(params, starts)]
            comp = [self._hora_compression.compress(d) for d in deltas]
            bufs = [c[0].contiguous() for c in comp]
            if bufs:
                synchronize(grouped_allreduce_async_(bufs, name="adasum.delta", op=Adasum,
                                                     process_set=self._hora_set))
            for p, s, b, (_, ctx) in zip(params, starts, bufs, comp):
                p.copy_(s + self._hora_compression.decompress(b, ctx).to(p.dtype))
        for p in self._hora_delay:
            self._hora_delay[p] = self._hora_passes
        return loss
