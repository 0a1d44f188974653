"""DistributedOptimizer(op=Adasum) on more than one rank: Horovod's delta optimizer
(horovod.torch's _DistributedAdasumOptimizer). Each rank takes the wrapped optimizer's step on
its own gradients, the update deltas (new - old parameters) are combined with Adasum (one Adasum
per parameter), and every rank applies the combined delta to the old parameters:

    start = p;  p = step(p, g_r);  delta_r = p - start;  p = start + Adasum_r(delta_r)

so the learning rate is not scaled by the number of ranks (Adasum of equal deltas is that delta;
of orthogonal ones, their sum)."""
import contextlib

import torch

from ._errors import invalid
from ._torch_ops import Adasum, grouped_allreduce_async_, synchronize
from ._torch_psets import _view_size


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


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class by DistributedOptimizer(op=Adasum)."""

    def __init__(self, params, names, compression, backward_passes_per_step, process_set, view):
        super(self.__class__, self).__init__(params)
        n = _view_size(view)
        if n & (n - 1):
            raise invalid(f"DistributedOptimizer(op=Adasum): Adasum needs a power-of-two number "
                          f"of ranks, the process set has {n}")
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._hora_names = {p: "adasum.delta." + names[id(p)] for p in all_params}
        self._parameter_names = {p: names[id(p)] for p in all_params}  # Horovod's attribute
        self._hora_compression = compression
        self._hora_passes = backward_passes_per_step
        self._hora_set = process_set
        self._hora_delay = {p: backward_passes_per_step for p in all_params}
        self._hora_hooks = [p.register_post_accumulate_grad_hook(self._hora_hook)
                            for p in all_params if p.requires_grad]

    def add_param_group(self, param_group):
        """torch.optim.Optimizer.add_param_group; the deltas of a group added after construction
        are combined like the others (names "param_group.<g>.<i>"; see _DistributedOptimizer's)."""
        super(self.__class__, self).add_param_group(param_group)
        if "_hora_names" not in self.__dict__:  # the groups torch's __init__ adds
            return
        gi = len(self.param_groups) - 1
        for i, p in enumerate(self.param_groups[gi]["params"]):
            self._hora_names[p] = f"adasum.delta.param_group.{gi}.{i}"
            self._parameter_names[p] = f"param_group.{gi}.{i}"
            self._hora_delay[p] = self._hora_passes
            if p.requires_grad:
                self._hora_hooks.append(p.register_post_accumulate_grad_hook(self._hora_hook))

    def _hora_hook(self, p):
        _count_backward_pass(self._hora_delay, p)

    def synchronize(self):
        """Nothing to wait for: the Adasum optimizer combines the deltas in step()."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")
        yield  # pragma: no cover

    def step(self, closure=None):
        """The wrapped optimizer's step on this rank's gradients, then every parameter becomes
        its value before the step plus the Adasum over the ranks of the step's deltas.
        Collective over the optimizer's process set."""
        loss = closure() if closure is not None else None
        # The trainable parameters now (a layer unfrozen since construction included), sorted by
        # name: every rank submits the deltas in the same order.
        params = sorted((p for p in self._hora_names if p.requires_grad),
                        key=lambda p: self._hora_names[p])
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
