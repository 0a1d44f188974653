"""hora.torch process sets (Horovod 0.28's add_process_set / remove_process_set / process_set=)
and op=Adasum, on every rank: values against single-process torch/NumPy references, errors on
every rank. At 2 ranks the set A is both ranks; at n >= 3, A = {0, n - 1} and B = the ranks
between run at once."""
import numpy as np
import pytest

from conftest import rank_size

torch = pytest.importorskip("torch")
import hora.torch as hvd  # noqa: E402


def _sets():
    r, n = rank_size()
    a = hvd.add_process_set([n - 1, 0])  # unsorted on purpose: a set's ranks are sorted
    b = hvd.add_process_set(list(range(1, n - 1))) if n >= 3 else None
    return a, b


def _x(rank, rows=3):
    return torch.arange(rows * 4, dtype=torch.float64).reshape(rows, 4) * (rank + 1) + rank


def test_process_set_collectives_values():
    r, n = rank_size()
    a, b = _sets()
    try:
        assert a.ranks == sorted({0, n - 1}) and a.process_set_id > 0 and a.size() == len(a.ranks)
        assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
        mine = a if r in a.ranks else b
        other = b if mine is a else a
        assert mine.included() and mine.rank() == mine.ranks.index(r)
        if other is not None:
            assert other.included() is False
            with pytest.raises(ValueError, match="not part"):
                other.rank()
        # The global set's async allreduce runs beside the sets' collectives.
        hg = hvd.allreduce_async(torch.full((5,), float(r)), op=hvd.Sum, name="ps.global")
        m = mine.ranks
        s = hvd.allreduce(_x(r), op=hvd.Sum, name="ps.sum", process_set=mine)
        avg = hvd.allreduce(_x(r), name="ps.avg", process_set=mine)
        g = hvd.allgather(_x(r, rows=r + 1), name="ps.gather", process_set=mine)
        root = m[-1]  # a global rank, as in Horovod
        bc = hvd.broadcast(_x(r), root, name="ps.bcast", process_set=mine)
        ga = hvd.grouped_allreduce([_x(r), _x(r)[0]], op=hvd.Sum, name="ps.grouped",
                                   process_set=mine)
        rows = torch.arange(len(m) * 2, dtype=torch.float32).reshape(len(m) * 2, 1) + 100 * r
        at = hvd.alltoall(rows, name="ps.alltoall", process_set=mine)
        rs = hvd.reducescatter(torch.ones(len(m) * 2, 3) * (r + 1), op=hvd.Sum, name="ps.rs",
                               process_set=mine)
        hvd.barrier(process_set=mine)
        ref = sum(_x(q) for q in m)
        assert torch.equal(s, ref)
        assert torch.allclose(avg, ref / len(m))
        assert torch.equal(g, torch.cat([_x(q, rows=q + 1) for q in m]))
        assert torch.equal(bc, _x(root))
        assert torch.equal(ga[0], ref) and torch.equal(ga[1], ref[0])
        me = m.index(r)
        want = torch.cat([torch.arange(me * 2, me * 2 + 2, dtype=torch.float32).reshape(2, 1)
                          + 100 * q for q in m])
        assert torch.equal(at, want)
        assert torch.equal(rs, torch.ones(2, 3) * sum(q + 1 for q in m))
        assert torch.equal(hg.wait(), torch.full((5,), float(sum(range(n)))))
        assert hvd.allgather_object(r, process_set=mine) == m
        assert hvd.broadcast_object(r * 10 if r == m[0] else None, root_rank=m[0],
                                    process_set=mine) == m[0] * 10
    finally:
        assert hvd.remove_process_set(a) is True
        if b is not None:
            assert hvd.remove_process_set(b) is True
    assert a.process_set_id is None and a.ranks is None
    assert hvd.remove_process_set(a) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False


def test_one_name_in_flight_in_the_global_set_and_in_a_set_at_once():
    """Horovod keeps a tensor queue per process set, so a name may be in flight in the global set
    and in a set at the same time; each gets its own values."""
    r, n = rank_size()
    a, b = _sets()
    try:
        mine = a if r in a.ranks else b
        hg = hvd.allreduce_async(torch.full((3,), 1.0 + r), op=hvd.Sum, name="both")
        hs = hvd.allreduce_async(torch.full((2,), 10.0 * (1 + r)), op=hvd.Sum, name="both",
                                 process_set=mine)
        assert torch.equal(hvd.synchronize(hs),
                           torch.full((2,), 10.0 * sum(q + 1 for q in mine.ranks)))
        assert torch.equal(hvd.synchronize(hg), torch.full((3,), n * (n + 1) / 2))
    finally:
        hvd.remove_process_set(a)
        if b is not None:
            hvd.remove_process_set(b)


def test_process_set_misuse_errors_on_every_rank():
    r, n = rank_size()
    with pytest.raises(ValueError, match="listed twice|another rank"):
        hvd.add_process_set([0, 0])
    with pytest.raises(ValueError, match="not a rank"):
        hvd.add_process_set([n])
    with pytest.raises(ValueError):
        hvd.ProcessSet(["a"])
    with pytest.raises(ValueError, match="different rank lists"):
        hvd.add_process_set([0] if r == 0 else [0, 1])
    a = hvd.add_process_set([0])
    try:
        with pytest.raises(ValueError, match="already registered"):
            hvd.add_process_set([0])
        with pytest.raises(ValueError, match="already registered"):
            hvd.add_process_set(a)
        if r != 0:  # outside the set: a clear error, no hang
            with pytest.raises(ValueError, match="not in the process set"):
                hvd.allreduce(torch.ones(2), process_set=a)
        with pytest.raises(ValueError, match="not in the process set"):
            hvd.broadcast(torch.ones(2), n - 1 if n > 1 else 5, process_set=a)
        hvd.barrier()
    finally:
        hvd.remove_process_set(a)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(2), process_set=a)


def test_distributed_optimizer_process_set():
    r, n = rank_size()
    a = hvd.add_process_set([n - 1, 0])
    try:
        # Every rank creates the optimizer; a rank outside the set (ranks 1 .. n - 2) steps on its
        # own gradient, as in Horovod.
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1, bias=False)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       process_set=a)
        w0 = model.weight.detach().clone()
        x = torch.arange(4, dtype=torch.float32).reshape(1, 4) * (r + 1)
        model(x).sum().backward()
        opt.step()
        # The gradient of sum(w.x) is x: averaged over the set's ranks only.
        members = a.ranks if r in a.ranks else [r]
        g = sum(torch.arange(4, dtype=torch.float32).reshape(1, 4) * (q + 1) for q in members)
        assert torch.allclose(model.weight.detach(), w0 - 0.1 * g / len(members))
        assert sorted(opt._parameter_names.values()) == ["weight"]
        hvd.barrier()
    finally:
        hvd.remove_process_set(a)


# Horovod 0.28's Adasum threshold (horovod/common/ops/adasum/adasum.h): a coefficient is 1 only
# where |x|^2 < sqrt(DBL_MIN).
_ADASUM_EPS = np.sqrt(np.finfo(np.float64).tiny)


def _adasum_ref(vs):
    """The Adasum tree over the list of vectors (float64): at distance d, rank r (lower) and
    r + d combine as a + b - a.b/(2|a|^2) a - a.b/(2|b|^2) b."""
    vs = [np.asarray(v, np.float64).copy() for v in vs]
    d = 1
    while d < len(vs):
        for i in range(0, len(vs), 2 * d):
            a, b = vs[i], vs[i + d]
            ab, aa, bb = a @ b, a @ a, b @ b
            ca = 1 - ab / (2 * aa) if aa >= _ADASUM_EPS else 1.0
            cb = 1 - ab / (2 * bb) if bb >= _ADASUM_EPS else 1.0
            vs[i] = ca * a + cb * b
        d *= 2
    return vs[0]


def _grad(q, n=1001):
    rng = np.random.default_rng(1234 + q)
    return rng.standard_normal(n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adasum_against_numpy(dtype):
    r, n = rank_size()
    t = torch.from_numpy(_grad(r)).to(dtype)
    if n & (n - 1):
        with pytest.raises(ValueError, match="power-of-two"):
            hvd.allreduce(t, op=hvd.Adasum)
        # A power-of-two process set of a 3-rank job runs Adasum.
        a = hvd.add_process_set([0, 1])
        try:
            if r in a.ranks:
                out = hvd.allreduce(t, op=hvd.Adasum, process_set=a)
                ref = _adasum_ref([np.asarray(torch.from_numpy(_grad(q)).to(dtype), np.float64)
                                   for q in a.ranks])
                np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-6)
        finally:
            hvd.remove_process_set(a)
        return
    out = hvd.allreduce(t, op=hvd.Adasum)
    h = hvd.allreduce_async_(t.clone(), op=hvd.Adasum)
    ref = _adasum_ref([np.asarray(torch.from_numpy(_grad(q)).to(dtype), np.float64)
                       for q in range(n)])
    assert out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(hvd.synchronize(h).numpy(), ref, rtol=1e-6, atol=1e-6)
    # Equal gradients average; orthogonal ones add (the two limits of the formula).
    same = hvd.allreduce(torch.ones(8, dtype=dtype), op=hvd.Adasum)
    assert torch.allclose(same, torch.ones(8, dtype=dtype))
    e = torch.zeros(n, dtype=dtype)
    e[r] = 1.0
    assert torch.allclose(hvd.allreduce(e, op=hvd.Adasum), torch.ones(n, dtype=dtype))
    with pytest.raises(ValueError, match="floating-point"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.reducescatter(torch.ones(n, 2), op=hvd.Adasum)


@pytest.mark.parametrize("dtype,scale", [(torch.float64, 1e-60), (torch.float32, 1e-30)])
def test_adasum_tiny_parallel_gradients_average(dtype, scale):
    """Parallel gradients (r + 1) v average under Adasum however small |v|^2 is (here 1e-119 and
    1e-59, far below 1e-8), as in Horovod 0.28 (test_adasum_pytorch.py's test_stability): the
    coefficients are computed down to |x|^2 = sqrt(DBL_MIN). At 3 ranks: the set {0, 1}."""
    r, n = rank_size()
    ranks = list(range(n)) if not n & (n - 1) else [0, 1]
    ps = hvd.global_process_set if len(ranks) == n else hvd.add_process_set(ranks)
    try:
        if r in ranks:
            v = np.sin(np.arange(1.0, 65.0)) * scale
            out = hvd.allreduce(torch.from_numpy(v * (r + 1)).to(dtype), op=hvd.Adasum,
                                process_set=ps)
            vs = [np.asarray(torch.from_numpy(v * (q + 1)).to(dtype), np.float64) for q in ranks]
            rtol = 1e-12 if dtype == torch.float64 else 1e-6
            np.testing.assert_allclose(out.double().numpy(), _adasum_ref(vs), rtol=rtol, atol=0)
            np.testing.assert_allclose(out.double().numpy(), np.mean(vs, axis=0),
                                       rtol=10 * rtol, atol=0)  # the mean, not the sum
    finally:
        if ps is not hvd.global_process_set:
            hvd.remove_process_set(ps)
