"""Every blocking collective and every dtype against NumPy, computed on each rank from the same
seeded inputs (rank_input): the expected value of every element is known on every rank."""
import numpy as np
import pytest

import hora
from conftest import all_dtypes, rank_input, rank_size, tol

OPS = [hora.Sum, hora.Average, hora.Min, hora.Max, hora.Product]
OP_IDS = ["sum", "average", "min", "max", "product"]
SHAPES = [(0,), (1,), (3, 5), (1000,), (70001,)]
FLOATS = ("float16", "bfloat16", "float32", "float64")


def reference(inputs, op, dtype, pre=1.0, post=1.0):
    """The allreduce result in float64 (exact for these inputs), before the final cast."""
    a = np.stack([x.astype(np.float64) for x in inputs]) * pre
    n = len(inputs)
    if op in (hora.Sum, hora.Average):
        s = a.sum(axis=0)
    elif op == hora.Min:
        s = a.min(axis=0)
    elif op == hora.Max:
        s = a.max(axis=0)
    else:
        s = a.prod(axis=0)
    if op == hora.Average:
        s = s / n if np.dtype(dtype).name in FLOATS else np.trunc(s / n)
    return s * post


def assert_matches(out, ref, dtype, what):
    dtype = np.dtype(dtype)
    assert isinstance(out, np.ndarray), what
    assert out.dtype == dtype, f"{what}: dtype {out.dtype} != {dtype}"
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    if dtype.name in FLOATS:
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol(dtype), atol=tol(dtype),
                                   err_msg=what)
    else:
        np.testing.assert_array_equal(out, ref.astype(dtype), err_msg=what)


def op_range(op, dtype):
    # Products of up to 4 ranks must stay exact and in range (int8: |3^4| = 81 <= 127).
    if op == hora.Product:
        return (0 if np.dtype(dtype) == np.uint8 else -2), 3
    return None, None


@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_allreduce(dtype, op):
    r, n = rank_size()
    lo, hi = op_range(op, dtype)
    results = []
    for si, shape in enumerate(SHAPES):
        seed = 1000 + si
        x = rank_input(dtype, shape, r, seed, lo, hi)
        before = x.copy()
        out = hora.allreduce(x, op=op)
        inputs = [rank_input(dtype, shape, p, seed, lo, hi) for p in range(n)]
        results.append((shape, out, reference(inputs, op, dtype), x, before))
        # In place on a second copy: the same values, and the very same object back.
        y = x.copy()
        same = hora.allreduce_(y, op=op)
        results.append((shape, y, reference(inputs, op, dtype), None, None))
        assert same is y
    for shape, out, ref, x, before in results:
        assert_matches(out, ref, dtype, f"allreduce {shape}")
        if x is not None:
            np.testing.assert_array_equal(x, before, err_msg="allreduce changed its input")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64] +
                         [d for d in all_dtypes() if d.name == "bfloat16"], ids=str)
def test_allreduce_scale_factors(dtype):
    r, n = rank_size()
    x = rank_input(dtype, (257, 3), r, 7)
    out_sum = hora.allreduce(x, op=hora.Sum, prescale_factor=0.5, postscale_factor=4.0)
    out_avg = hora.allreduce(x, op=hora.Average, prescale_factor=2.0, postscale_factor=0.25)
    inputs = [rank_input(dtype, (257, 3), p, 7) for p in range(n)]
    assert_matches(out_sum, reference(inputs, hora.Sum, dtype, 0.5, 4.0), dtype, "sum scaled")
    assert_matches(out_avg, reference(inputs, hora.Average, dtype, 2.0, 0.25), dtype,
                   "average scaled")


def test_integer_average_truncates():
    r, n = rank_size()
    # Rank 0 holds -7, the others 0: the average -7/n truncates toward zero (C division).
    x = np.array([-7 if r == 0 else 0, 7 if r == 0 else 0], dtype=np.int32)
    out = hora.allreduce(x, op=hora.Average)
    np.testing.assert_array_equal(out, np.array([int(-7 / n), int(7 / n)], dtype=np.int32))


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_broadcast(dtype):
    r, n = rank_size()
    got = []
    for root in range(n):
        x = rank_input(dtype, (3, 7), r, 50 + root)
        out = hora.broadcast(x, root_rank=root)
        y = x.copy()
        hora.broadcast_(y, root)
        got.append((root, x.copy(), out, y))
    for root, x, out, y in got:
        want = rank_input(dtype, (3, 7), root, 50 + root)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(x, rank_input(dtype, (3, 7), r, 50 + root))
        assert out.dtype == np.dtype(dtype) and out.shape == (3, 7)


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_allgather_variable_first_dim(dtype):
    r, n = rank_size()
    x = rank_input(dtype, (r + 1, 2, 3), r, 60)
    out = hora.allgather(x)
    eq = hora.allgather(rank_input(dtype, (4, 5), r, 61))
    empty_here = hora.allgather(rank_input(dtype, (0 if r == 0 else 2,), r, 62))
    want = np.concatenate([rank_input(dtype, (p + 1, 2, 3), p, 60) for p in range(n)])
    np.testing.assert_array_equal(out, want)
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(eq, np.concatenate([rank_input(dtype, (4, 5), p, 61)
                                                      for p in range(n)]))
    np.testing.assert_array_equal(
        empty_here, np.concatenate([rank_input(dtype, (0 if p == 0 else 2,), p, 62)
                                    for p in range(n)]))


def test_allgather_mismatch_raises_on_every_rank():
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    # Rank 0 gathers (2, 3) rows, the others (2, 4): every rank must raise MismatchError.
    x = np.zeros((2, 3 if r == 0 else 4), dtype=np.float32)
    with pytest.raises(hora.MismatchError, match="trailing shape"):
        hora.allgather(x)
    y = np.zeros(3, dtype=np.float32 if r == 0 else np.float64)
    with pytest.raises(hora.MismatchError, match="dtype"):
        hora.allgather(y)


@pytest.mark.parametrize("inplace", [False, True], ids=["new", "inplace"])
def test_shape_mismatch_with_equal_counts_raises_on_every_rank(inplace):
    # 12 elements everywhere, as (3, 4) on the last rank and (4, 3) on the others: the cross-rank
    # call check compares the shapes' fingerprints and every rank raises MismatchError (a
    # ValueError) naming the tensor, with its buffer untouched; the ranks stay in step.
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = np.full((3, 4) if r == n - 1 else (4, 3), r + 1, dtype=np.float32)
    f = hora.allreduce_ if inplace else hora.allreduce
    with pytest.raises(hora.MismatchError, match=r"tensor 'grad' of shape .*ranks disagree on shape") as e:
        f(x, name="grad")
    assert isinstance(e.value, ValueError)
    assert f"on rank {n - 1}" in e.value.message
    assert (x == r + 1).all()
    with pytest.raises(ValueError, match="shape"):
        hora.broadcast_(x, root_rank=0)
    assert (x == r + 1).all()
    # Same shapes again: the ranks are in step and the result is right.
    out = hora.allreduce(np.full((4, 3), r + 1, dtype=np.float32), op=hora.Sum)
    assert (out == n * (n + 1) // 2).all()


def test_blocking_call_sequence_mismatch_raises_on_every_rank():
    # The last rank calls broadcast where the others call allreduce: reported, never paired.
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = np.zeros(5, dtype=np.float32)
    with pytest.raises(hora.MismatchError, match="call sequence"):
        if r == n - 1:
            hora.broadcast_(x, root_rank=0)
        else:
            hora.allreduce_(x)
    assert (x == 0).all()
    out = hora.allreduce(np.ones(5, dtype=np.int64), op=hora.Sum)
    assert (out == n).all()


@pytest.mark.parametrize("op", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_reducescatter(dtype, op):
    r, n = rank_size()
    lo, hi = op_range(op, dtype)
    got = []
    for rows in (2 * n, 2 * n + 1, n - 1 if n > 1 else 0):  # even, uneven, fewer rows than ranks
        x = rank_input(dtype, (rows, 3), r, 70 + rows, lo, hi)
        got.append((rows, hora.reducescatter(x, op=op)))
    for rows, out in got:
        inputs = [rank_input(dtype, (rows, 3), p, 70 + rows, lo, hi) for p in range(n)]
        full = reference(inputs, op, dtype)
        sizes = [rows // n + (1 if p < rows % n else 0) for p in range(n)]
        start = sum(sizes[:r])
        assert_matches(out, full[start:start + sizes[r]], dtype, f"reducescatter rows={rows}")


@pytest.mark.parametrize("dtype", FLOATS)
def test_reducescatter_scale_factors(dtype):
    # postscale * OP(prescale * x), blocking and async, even and uneven rows, against NumPy.
    r, n = rank_size()
    for rows in (2 * n, 2 * n + 1):
        x = rank_input(dtype, (rows, 3), r, 90 + rows, -4, 4)
        inputs = [rank_input(dtype, (rows, 3), p, 90 + rows, -4, 4) for p in range(n)]
        full = reference(inputs, hora.Average, dtype, pre=0.5, post=4.0)
        sizes = [rows // n + (1 if p < rows % n else 0) for p in range(n)]
        start = sum(sizes[:r])
        got = hora.reducescatter(x, op=hora.Average, prescale_factor=0.5, postscale_factor=4.0)
        assert_matches(got, full[start:start + sizes[r]], dtype, f"reducescatter rows={rows}")
        if rows % n == 0:
            h = hora.reducescatter_async(x, op=hora.Average, name=f"rs.scaled.{dtype}",
                                         prescale_factor=0.5, postscale_factor=4.0)
            assert_matches(h.wait(), full[start:start + sizes[r]], dtype, "reducescatter_async")


@pytest.mark.parametrize("call", ["allreduce", "reducescatter"])
def test_blocking_scale_factors_that_differ_raise_on_every_rank(call):
    # Ranks that disagree on prescale or postscale would mix differently scaled contributions
    # (Horovod: "Mismatched prescale and/or postscale factors"): MismatchError on every rank,
    # naming the field and every rank's value, nothing written, the ranks still in step.
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    f = getattr(hora, call)
    x = np.full((2 * n, 3), r + 1, dtype=np.float32)
    for field in ("prescale", "postscale"):
        with pytest.raises(hora.MismatchError, match=f"ranks disagree on {field}: ") as e:
            f(x, op=hora.Sum, **{f"{field}_factor": 1.0 + r})
        assert all(f"{1 + q:g} on rank {q}" in e.value.message for q in range(n)), e.value.message
        assert (x == r + 1).all()
    out = f(x, op=hora.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert (out == n * (n + 1) // 2).all()


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_alltoall(dtype):
    r, n = rank_size()
    x = rank_input(dtype, (2 * n, 3), r, 80)
    out = hora.alltoall(x)
    # Uneven splits: rank p sends (p + q) % 3 rows to rank q.
    splits = [(r + q) % 3 for q in range(n)]
    y = rank_input(dtype, (sum(splits), 2), r, 81)
    outv, recv_splits = hora.alltoall(y, splits=splits)
    want = np.concatenate([rank_input(dtype, (2 * n, 3), p, 80)[2 * r:2 * r + 2]
                           for p in range(n)])
    np.testing.assert_array_equal(out, want)
    parts = []
    for p in range(n):
        sp = [(p + q) % 3 for q in range(n)]
        src = rank_input(dtype, (sum(sp), 2), p, 81)
        parts.append(src[sum(sp[:r]):sum(sp[:r]) + sp[r]])
    np.testing.assert_array_equal(outv, np.concatenate(parts))
    np.testing.assert_array_equal(recv_splits, [(p + r) % 3 for p in range(n)])


def test_barrier_and_layout():
    r, n = rank_size()
    hora.barrier()
    ranks = hora.allgather(np.array([r, hora.local_rank(), hora.local_size(), hora.cross_rank(),
                                     hora.cross_size()], dtype=np.int64).reshape(1, 5))
    assert sorted(ranks[:, 0].tolist()) == list(range(n))
    assert 0 <= hora.local_rank() < hora.local_size() <= n
    assert 0 <= hora.cross_rank() < hora.cross_size() <= n
    # mpirun on one machine: one node, local layout equals the world's.
    assert (ranks[:, 4] == ranks[0, 4]).all()
    assert hora.is_initialized()
