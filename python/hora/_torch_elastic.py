"""hora.torch.elastic: Horovod's elastic API (horovod.torch.elastic) on libhora's committed state,
with Slurm as the membership service (docs/elastic.md).

    import hora.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, start=state.batch): # loader over sampler
                ...; state.train_sampler.record_batch(state.batch, batch_size)
                if state.batch % 10 == 0: state.commit()
            state.batch = 0; state.train_sampler.set_epoch(state.epoch + 1); state.commit()
    train(state)

The difference from Horovod: MPI cannot shrink a running world, so the retry after a lost rank
happens in a new Slurm step that `launch --elastic` starts on the nodes still usable. run() syncs
the state at its start (the newest commit of any surviving rank, else the checkpoint, else rank
0's state), and on RemoteError (a peer died) or a host change each rank writes its last commit
and exits with EXIT_ELASTIC. See docs/horovod.md for every difference.
"""
import functools
import pickle

import numpy as np

from . import _core
from ._errors import RemoteError, invalid
from .elastic import BLOB_MAX, EXIT_ELASTIC, CommittedState, exit_for_restart  # noqa: F401


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by State.commit()/check_host_updates() when launch --elastic reports another number
    of usable nodes: the state is committed, and run() ends this step for a re-formed one."""


def _torch():
    import torch
    return torch


class ElasticSampler:
    """Shards the samples of an epoch that are not yet processed over the current world size
    (Horovod's ElasticSampler). No sample is repeated: unlike Horovod (which pads every shard to
    the same length by repeating samples), shard lengths may differ by one; call hvd.join() after
    the epoch's loop when the remaining count is not a multiple of the world size.
    record_batch/record_indices mark samples processed; TorchState carries the processed set
    (as a bitmap tensor, united over the ranks at each commit) to the next step."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset_len = len(dataset)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed = np.zeros(self.dataset_len, dtype=bool)
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
        self.processed[:] = False
        self.reset()

    def _order(self):
        if not self.shuffle:
            return np.arange(self.dataset_len)
        return np.random.default_rng(self.seed + self.epoch).permutation(self.dataset_len)

    def reset(self, num_replicas=None, rank=None):
        """Re-shard the remaining samples (for the current world size unless given)."""
        self.num_replicas = _core.size() if num_replicas is None else int(num_replicas)
        self.rank = _core.rank() if rank is None else int(rank)
        order = self._order()
        self.remaining = order[~self.processed[order]]
        self.indices = self.remaining[self.rank::self.num_replicas].tolist()
        self.num_samples = len(self.indices)

    def get_indices(self, batch_idx, batch_size):
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def record_batch(self, batch_idx, batch_size):
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices):
        self.processed[np.asarray(list(indices), dtype=np.int64)] = True

    def state_dict(self):
        return {"epoch": self.epoch, "processed_indices": np.flatnonzero(self.processed).tolist()}

    def load_state_dict(self, sd):
        self.epoch = int(sd["epoch"])
        self.processed[:] = False
        self.processed[np.asarray(sd["processed_indices"], dtype=np.int64)] = True
        self.reset()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class State:
    """Horovod's hvd.elastic.State: commit/restore/sync, reset callbacks, host checks. Subclasses
    give the tensors (_arrays) and the small picklable rest (_extra, _load_extra)."""

    def __init__(self, hora_dir=None, hora_checkpoint=None, hora_ckpt_every=0):
        # hora_dir None (a Horovod program): libhora's default folder (HORA_ELASTIC_DIR).
        self._st = CommittedState(hora_dir, hora_checkpoint, hora_ckpt_every)
        self._reset_callbacks = []
        self.commit_id = -1
        self.resized = False  # the last sync came from a world of another size

    def register_reset_callbacks(self, callbacks):
        """Callables run (in order) by run() when the world size changed since the commit it
        resumed from: adjust the learning rate or batch size there (hvd.size() is the new one)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def _blob(self):
        b = pickle.dumps({"extra": self._extra(), "world_size": _core.size()})
        if len(b) > BLOB_MAX:
            raise invalid(f"TorchState: the non-tensor state pickles to {len(b)} bytes; at most "
                          f"{BLOB_MAX} (keep large values in tensors)")
        return b

    def _apply_blob(self, blob):
        if not blob:
            return None
        d = pickle.loads(blob)
        self._load_extra(d["extra"])
        return d["world_size"]

    def save(self):
        """Horovod's save(): commit without the host check."""
        self._before_commit()
        self._st.commit(self._arrays(), self._blob())
        self.commit_id = self._st.commit_id

    def commit(self):
        """Collective: save the state (in memory; to the checkpoint every N commits), then
        check_host_updates() (which raises HostsUpdatedInterrupt when the job must re-form)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        if self._st.hosts_changed():
            raise HostsUpdatedInterrupt("launch --elastic reports another number of nodes")

    def restore(self):
        """Local: back to the last commit (or sync), bit for bit."""
        self._apply_blob(self._st.restore(self._arrays()))
        self._after_load()

    def sync(self):
        """Collective: every rank takes the newest commit any rank holds (memory, the files of a
        failed step's survivors, the checkpoint), else rank 0's current state."""
        self.commit_id, blob = self._st.sync(self._arrays())
        ws = self._apply_blob(blob)
        self.resized = ws is not None and ws != _core.size()
        self._after_load()

    def save_for_restart(self):
        """Local, no MPI: this rank's last commit to a file for the next step."""
        self._st.save()

    def _before_commit(self):
        pass

    def _after_load(self):
        pass


class TorchState(State):
    """Horovod's TorchState(model, optimizer, **kwargs): the model's state_dict tensors, the
    optimizer's state tensors (materialized at construction by a zero-gradient step with the
    parameters restored after it), ElasticSampler
    kwargs (processed samples as a bitmap tensor) and every other kwarg (pickled; attributes of
    the state). hora extensions (keyword-only): hora_dir, hora_checkpoint (a hora.Checkpoint),
    hora_ckpt_every."""

    def __init__(self, model=None, optimizer=None, hora_dir=None, hora_checkpoint=None,
                 hora_ckpt_every=0, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._names = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        if optimizer is not None:
            _materialize(optimizer)
        super().__init__(hora_dir, hora_checkpoint, hora_ckpt_every)
        self._bitmaps = {}

    def _samplers(self):
        return {k: getattr(self, k) for k in self._names if isinstance(getattr(self, k), ElasticSampler)}

    def _arrays(self):
        torch = _torch()
        a = {}
        if self.model is not None:
            for k, v in self.model.state_dict().items():
                if isinstance(v, torch.Tensor):
                    a["model." + k] = v
        if self.optimizer is not None:
            for pid, st in self.optimizer.state_dict()["state"].items():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        a[f"optim.{pid}.{k}"] = v
        for k, s in self._samplers().items():
            bm = self._bitmaps.get(k)
            if bm is None or bm.size != (s.dataset_len + 7) // 8:
                bm = self._bitmaps[k] = np.zeros((s.dataset_len + 7) // 8, dtype=np.uint8)
            a[f"sampler.{k}"] = bm
        return a

    def _before_commit(self):
        for k, s in self._samplers().items():  # the union of every rank's processed samples
            union = _core.allreduce(s.processed.view(np.uint8), op=_core.Max).view(bool)
            s.processed[:] = union  # a bitwise OR needs one byte per sample (Max of bytes)
            self._arrays()  # makes the bitmap buffers
            self._bitmaps[k][:] = np.packbits(union)

    def _extra(self):
        e = {k: getattr(self, k) for k in self._names if not isinstance(getattr(self, k), ElasticSampler)}
        e["__samplers__"] = {k: s.epoch for k, s in self._samplers().items()}
        if self.optimizer is not None:
            sd = self.optimizer.state_dict()
            e["__param_groups__"] = sd["param_groups"]
            e["__optim_other__"] = {pid: {k: v for k, v in st.items() if not hasattr(v, "dtype")}
                                    for pid, st in sd["state"].items()}
        return e

    def _load_extra(self, e):
        for k, ep in e.pop("__samplers__", {}).items():
            getattr(self, k).epoch = ep
        groups, other = e.pop("__param_groups__", None), e.pop("__optim_other__", {})
        if self.optimizer is not None and groups is not None:
            for g, sg in zip(self.optimizer.param_groups, groups):
                for k, v in sg.items():
                    if k != "params":
                        g[k] = v
            for pid, st in self.optimizer.state_dict()["state"].items():
                st.update(other.get(pid, {}))
        for k, v in e.items():
            setattr(self, k, v)

    def _after_load(self):
        for k, s in self._samplers().items():
            s.processed[:] = np.unpackbits(self._bitmaps[k])[:s.dataset_len].astype(bool)
            s.reset()


def _materialize(optimizer):
    """Create the optimizer's per-parameter state (momentum, Adam moments) now, so that the state
    has the same tensors before and after the first step: one step with zero gradients, the
    parameters put back bit for bit afterwards. The state stays as that step leaves it, as
    Horovod's broadcast_optimizer_state leaves it: set to zero, some of it would be wrong for
    the first real step (NAdam's mu_product starts at 1, Rprop's step sizes at lr)."""
    torch = _torch()
    if len(optimizer.state) > 0:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved = [p.detach().clone() for p in params]
    grads = [p.grad for p in params]
    with torch.no_grad():
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        for p, s, g in zip(params, saved, grads):
            p.copy_(s)
            p.grad = g


def run(func):
    """Horovod's @hvd.elastic.run: sync the state, run func(state, ...), and when a peer dies
    (RemoteError) or the hosts change, write this rank's last commit and exit with EXIT_ELASTIC
    so that launch --elastic starts the next step (which resumes from that commit). Reset
    callbacks run after the sync when the world size differs from the commit's."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        state.sync()
        if state.resized:
            state.on_reset()
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt:
            exit_for_restart(state._st)
        except RemoteError:
            exit_for_restart(state._st)

    return wrapper
