"""PyTorch integration in Horovod's shape: broadcast_parameters, broadcast_optimizer_state,
broadcast_object and DistributedOptimizer.

    import hora, hora.torch as ht
    hora.init()
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hora.size())
    opt = ht.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    ht.broadcast_parameters(model.state_dict(), root_rank=0)
    ht.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in data:              # this rank's shard
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # each gradient's allreduce starts as soon as it is ready
        opt.step()                        # waits for them, then updates

Only CPU tensors and, in a CUDA build, CUDA tensors of the rank's GPU are supported.
"""
import contextlib
import io
import pickle

import numpy as np
import torch

import hora
from . import _core
from ._errors import invalid

if not hasattr(hora, "allreduce_async_"):  # pragma: no cover - a libhora without the engine
    raise ImportError("hora.torch needs libhora's async engine (hora_allreduce_async), which "
                      "this build of libhora does not have")


def _tensors_of(params):
    if isinstance(params, dict):
        items = list(params.items())
    else:
        try:
            items = list(params)
        except TypeError:
            raise invalid("broadcast_parameters: expected a state_dict or named_parameters(), "
                          f"got {type(params).__name__}") from None
        if items and not (isinstance(items[0], tuple) and len(items[0]) == 2):
            raise invalid("broadcast_parameters: expected (name, tensor) pairs, as "
                          "model.named_parameters() gives")
    return sorted(((str(k), v) for k, v in items), key=lambda kv: kv[0])


def broadcast_parameters(params, root_rank=0):
    """Copy root_rank's tensors into every rank's, in place (model.state_dict() or
    model.named_parameters()). Entries are matched by name (sorted), so every rank must pass the
    same names. Collective."""
    items = _tensors_of(params)
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise invalid(f"broadcast_parameters: {name!r} is a {type(t).__name__}, not a tensor")
    with torch.no_grad():
        # All broadcasts in flight at once (the engine runs them back to back), then wait.
        pending = []
        for name, t in items:
            buf = t.detach() if t.is_contiguous() else t.detach().contiguous()
            pending.append((t, buf, hora.broadcast_async_(buf, root_rank,
                                                          name=f"broadcast.{name}")))
        for t, buf, h in pending:
            h.wait()
            if buf.data_ptr() != t.data_ptr():
                t.copy_(buf)


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's Python object on every rank (pickled; torch tensors inside are pickled by
    torch). Collective."""
    if hora.rank() == root_rank:
        f = io.BytesIO()
        torch.save(obj, f, pickle_protocol=pickle.HIGHEST_PROTOCOL)
        payload = np.frombuffer(f.getbuffer(), dtype=np.uint8).copy()
        n = np.array([payload.size], dtype=np.int64)
    else:
        payload = None
        n = np.zeros(1, dtype=np.int64)
    hora.broadcast_(n, root_rank)
    if payload is None:
        payload = np.empty(int(n[0]), dtype=np.uint8)
    hora.broadcast_(payload, root_rank)
    if hora.rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(payload.tobytes()), weights_only=False)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Make every rank's optimizer state (step counts, momentum buffers, learning rates, ...)
    root_rank's. Ranks whose optimizer has not stepped yet get the state too. Collective."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise invalid("broadcast_optimizer_state: LBFGS is not supported (as in Horovod)")
    state = broadcast_object(optimizer.state_dict() if hora.rank() == root_rank else None,
                             root_rank)
    if hora.rank() != root_rank:
        optimizer.load_state_dict(state)


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods mixed into the user's optimizer class by DistributedOptimizer()."""

    def __init__(self, params, named_parameters, op, backward_passes_per_step):
        super(self.__class__, self).__init__(params)
        all_params = [p for g in self.param_groups for p in g["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            for n, p in named:
                if not isinstance(n, str):
                    raise invalid("DistributedOptimizer: named_parameters must be (str, "
                                  "Parameter) pairs")
            names = {id(p): n for n, p in named}
            if len(set(names.values())) != len(named):
                raise invalid("DistributedOptimizer: named_parameters has duplicate names")
            missing = [i for i, p in enumerate(all_params) if id(p) not in names]
            if missing:
                raise invalid(f"DistributedOptimizer: {len(missing)} optimizer parameters are "
                              "not in named_parameters")
        else:
            # Names by position: every rank builds the same model, so positions match.
            names = {id(p): f"param.{i}" for i, p in enumerate(all_params)}
        if backward_passes_per_step < 1:
            raise invalid("DistributedOptimizer: backward_passes_per_step must be >= 1")
        self._hora_names = {p: "grad." + names[id(p)] for p in all_params}
        self._hora_op = _core._op(op)
        self._hora_passes = int(backward_passes_per_step)
        self._hora_counts = {p: 0 for p in all_params}
        self._hora_handles = {}
        self._hora_synced = False
        self._hora_hooks = [p.register_post_accumulate_grad_hook(self._hora_hook)
                            for p in all_params if p.requires_grad]

    def _hora_start(self, p):
        g = p.grad
        if not g.is_contiguous():
            p.grad = g = g.contiguous()
        self._hora_handles[p] = hora.allreduce_async_(g.detach(), op=self._hora_op,
                                                      name=self._hora_names[p])

    def _hora_hook(self, p):
        # Runs inside backward, right after p.grad has been accumulated.
        if p in self._hora_handles:
            raise RuntimeError(
                f"hora.torch.DistributedOptimizer: the gradient of {self._hora_names[p]} was "
                "computed twice before step(); call backward once per step, or pass "
                "backward_passes_per_step=N")
        self._hora_counts[p] += 1
        if self._hora_counts[p] == self._hora_passes:
            self._hora_start(p)

    def synchronize(self):
        """Wait until every gradient's allreduce is done. Parameters whose gradient was not
        computed on this rank this step (unused in its forward) contribute zeros, so that every
        rank submits the same names."""
        for p in self._hora_names:
            if p not in self._hora_handles and p.requires_grad:
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
                self._hora_start(p)
        handles, self._hora_handles = self._hora_handles, {}
        for h in handles.values():
            h.wait()
        for p in self._hora_counts:
            self._hora_counts[p] = 0
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
        if not getattr(self, "_hora_skip", False):
            self.synchronize()
        self._hora_synced = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none=True):
        if self._hora_handles:
            raise RuntimeError("hora.torch.DistributedOptimizer: zero_grad() was called while "
                               "gradient allreduces are in flight (after backward, before "
                               "step()); call step() or synchronize() first")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, op=hora.Average,
                         backward_passes_per_step=1):
    """Wrap a torch.optim optimizer so that gradients are averaged across ranks.

    During backward, a hook on each parameter starts an asynchronous allreduce of its gradient
    as soon as the gradient is accumulated (the engine fuses small ones), so communication
    overlaps the rest of backward; step() waits for all of them and then applies the wrapped
    optimizer's update. The returned object is an instance of a subclass of the optimizer's
    class (isinstance checks and LR schedulers keep working); the wrapped optimizer's state is
    not carried over, as in Horovod.

    named_parameters: model.named_parameters(), so that gradients are matched across ranks by
      name (default: by position in the optimizer's parameter groups).
    op: hora.Average (default) or hora.Sum.
    backward_passes_per_step: local backward passes accumulated before the allreduce.
    """
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, op, backward_passes_per_step)
