"""hora.torch.elastic: ElasticSampler re-sharding (counted: no sample of the epoch repeated or
skipped for any new world size), TorchState commit/restore/sync bit for bit (model parameters,
optimizer state, kwargs, the sampler's processed samples), sync from the files a failed step's
survivors wrote, and the run decorator's normal path."""
import tempfile

import numpy as np
import pytest

import hora
from conftest import int_step_sgd, rank_size

torch = pytest.importorskip("torch")
import hora.torch as hvd  # noqa: E402


def shared_dir(tag):
    r, _ = rank_size()
    name = np.zeros(256, dtype=np.uint8)
    if r == 0:
        b = tempfile.mkdtemp(prefix=f"hora-elastic-{tag}-").encode()
        name[:len(b)] = np.frombuffer(b, dtype=np.uint8)
    hora.broadcast_(name, 0)
    return bytes(name).rstrip(b"\0").decode()


def test_sampler_reshard_counts():
    r, n = rank_size()
    data = list(range(103))
    s = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
    s.set_epoch(2)
    assert s.num_replicas == n and s.rank == r
    assert abs(len(s) - 103 / n) < 1
    for b in range(3):  # 3 batches of 5 on every rank, then the step "fails"
        s.record_batch(b, 5)
    union = hora.allreduce(s.processed.view(np.uint8), op=hora.Max).view(bool)
    assert union.sum() == 15 * n
    for m in (1, 2, 3, 4):  # the next step's world sizes
        shards = []
        for k in range(m):
            t = hvd.elastic.ElasticSampler(data, shuffle=True, seed=7)
            t.epoch = 2
            t.processed[:] = union
            t.reset(num_replicas=m, rank=k)
            shards.append(list(t))
        counts = np.zeros(103, dtype=int)
        for sh in shards:
            np.add.at(counts, np.asarray(sh, dtype=int), 1)
        counts[union] += 1
        assert (counts == 1).all(), f"world {m}: samples seen {sorted(set(counts.tolist()))} times"
        lens = [len(sh) for sh in shards]
        assert max(lens) - min(lens) <= 1


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def _bits(state):
    """Every state tensor as raw bytes (bitwise comparison, NaN-safe)."""
    return {k: v.detach().cpu().reshape(-1).contiguous().view(torch.uint8).clone() if v.dtype != torch.bool
            else v.clone() for k, v in state._arrays().items() if hasattr(v, "detach")}


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _steps(opt):
    """The optimizer's non-tensor state: the int step counts of int_step_sgd (else nothing)."""
    return sorted(st["step"] for st in opt.state.values() if isinstance(st.get("step"), int))


@pytest.mark.parametrize("optim", ["sgd", "adam", "intstep"])
def test_torch_state_commit_restore_sync(optim):
    r, n = rank_size()
    d = shared_dir(optim)
    model = _model(100 + r)  # every rank starts different
    mk = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
          "adam": lambda p: torch.optim.Adam(p, lr=0.01),
          "intstep": lambda p: int_step_sgd(p, lr=0.1, momentum=0.9)}[optim]
    opt = mk(model.parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(50)), seed=3)
    state = hvd.elastic.TorchState(model, opt, hora_dir=d, train_sampler=sampler, epoch=0, batch=0)
    state.sync()  # fresh: rank 0's parameters everywhere (commit 0)
    assert state.commit_id == 0
    ref = _model(100)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)

    _train(model, opt, 3, seed=5)
    state.epoch, state.batch = 3, 7
    sampler.set_epoch(3)
    sampler.record_batch(0, 4)
    state.commit()
    committed, cid, steps = _bits(state), state.commit_id, _steps(opt)
    assert cid == 1
    assert steps == ([4] * 4 if optim == "intstep" else [])  # the zero-gradient step, then 3
    processed = sampler.processed.copy()
    assert processed.sum() == 4 * n  # the union over ranks

    _train(model, opt, 2, seed=6)
    state.epoch, state.batch = 4, 0
    sampler.record_batch(1, 4)
    assert not _equal(_bits(state), committed)
    state.restore()
    assert _equal(_bits(state), committed) and _steps(opt) == steps
    assert (state.epoch, state.batch) == (3, 7)
    assert (sampler.processed == processed).all()

    # The step fails: every rank writes its commit; a new process (new model, optimizer,
    # sampler, state) syncs from the files.
    state.save_for_restart()
    state._st.close()
    hora.barrier()
    model2 = _model(999)
    opt2 = mk(model2.parameters())
    sampler2 = hvd.elastic.ElasticSampler(list(range(50)), seed=3)
    state2 = hvd.elastic.TorchState(model2, opt2, hora_dir=d, train_sampler=sampler2, epoch=0, batch=0)
    state2.sync()
    assert state2.commit_id == cid
    assert _equal(_bits(state2), committed) and _steps(opt2) == steps
    assert (state2.epoch, state2.batch) == (3, 7)
    assert sampler2.epoch == 3 and (sampler2.processed == processed).all()
    assert len(sampler2) == len(np.flatnonzero(~processed)[r::n])
    state2._st.close()


def test_torch_state_optimizer_state_is_a_zero_gradient_steps():
    """TorchState creates the optimizer's state at construction with one zero-gradient step (as
    Horovod's broadcast_optimizer_state does) and keeps it as that step leaves it: NAdam's
    mu_product is not 0 and Rprop's step sizes are lr (set to zero, NAdam's bias correction and
    Rprop's steps would be wrong from the first real step on). The parameters are unchanged."""
    model = _model(11)
    ref = _model(11)
    opts = [torch.optim.NAdam(model[0].parameters(), lr=0.01),
            torch.optim.Rprop(model[2].parameters(), lr=0.05)]
    states = [hvd.elastic.TorchState(model, o, hora_dir=shared_dir(f"zs{i}"))
              for i, o in enumerate(opts)]
    nadam = [opts[0].state[p]["mu_product"].item() for p in model[0].parameters()]
    rprop = [opts[1].state[p]["step_size"] for p in model[2].parameters()]
    assert all(0.44 < mu < 0.46 for mu in nadam), nadam  # 0.9 * (1 - 0.5 * 0.96 ** 0.004)
    assert all(torch.equal(s, torch.full_like(s, 0.05)) for s in rprop)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q) and p.grad is None
    for st in states:
        st._st.close()


def test_run_decorator_syncs_and_returns():
    r, _ = rank_size()
    model = _model(7 + r)
    state = hvd.elastic.TorchState(model, None, hora_dir=shared_dir("run"), epoch=5)
    calls = []

    @hvd.elastic.run
    def train(st, k):
        calls.append(st.commit_id)
        return st.epoch * k

    assert train(state, 2) == 10
    assert calls == [0]
    ref = _model(7)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    state._st.close()


def test_horovod_program_unchanged_without_hora_dir():
    """Horovod's elastic programs build TorchState(model, optimizer, **kwargs) with no folder:
    that used to raise "dir must be a non-empty path" at construction. It takes libhora's default
    folder (HORA_ELASTIC_DIR, set by conftest.py), and the usual loop trains as one process would
    on the whole batch."""
    import os
    r, n = rank_size()
    model = _model(11 + r)  # different on each rank until the state's first sync
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, batch=0, epoch=0)
    assert os.path.isdir(os.environ["HORA_ELASTIC_DIR"])
    g = torch.Generator().manual_seed(3)
    xs, ys = torch.randn(4, 2 * n, 4, generator=g), torch.randint(0, 3, (4, 2 * n), generator=g)

    @hvd.elastic.run
    def train(st):
        for st.batch in range(st.batch, 4):
            x, y = xs[st.batch, 2 * r:2 * r + 2], ys[st.batch, 2 * r:2 * r + 2]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            st.commit()
        return st.commit_id

    last = train(state)
    assert last == state.commit_id and last >= 4
    ref = _model(11)  # rank 0's start, which the first sync gave every rank
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for b in range(4):
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(xs[b]), ys[b]).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6), (p - q).abs().max()
    state._st.close()


def test_committed_state_empty_dir_is_an_error():
    with pytest.raises(hora.InvalidArgumentError, match="dir is empty"):
        hora.elastic.CommittedState("")


def test_torch_state_from_checkpoint():
    """No commit file anywhere (the allocation was lost, the job requeued): sync restores the
    checkpoint that every hora_ckpt_every-th commit wrote, tensors, kwargs and optimizer alike."""
    r, _ = rank_size()
    ck = hora.Checkpoint(local_dir=shared_dir("ck"))
    model = _model(200 + r)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, hora_dir=shared_dir("ckdir"), hora_checkpoint=ck,
                                   hora_ckpt_every=2, epoch=0)
    state.sync()
    for e in range(1, 5):  # commits 1..4: checkpoints at 2 and 4
        _train(model, opt, 1, seed=e)
        state.epoch = e
        state.commit()
        if e == 4:
            committed = _bits(state)
    _train(model, opt, 1, seed=9)
    state.epoch = 5
    state.commit()  # commit 5: memory only, and this process "dies" without saving
    state._st.close()
    model2 = _model(999)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    state2 = hvd.elastic.TorchState(model2, opt2, hora_dir=shared_dir("ckdir2"), hora_checkpoint=ck,
                                    hora_ckpt_every=2, epoch=0)
    state2.sync()
    assert state2.commit_id == 4 and state2.epoch == 4
    assert _equal(_bits(state2), committed)
    state2._st.close()
    ck.close()
