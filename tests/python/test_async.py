"""Async handles through hora's engine: named allreduces submitted in a different order on every
rank, grouped allreduce, handle states, errors, join."""
import gc

import numpy as np
import pytest

import hora
from conftest import all_dtypes, rank_input, rank_size, tol
from test_collectives import assert_matches, reference

if not hasattr(hora, "allreduce_async"):
    pytest.skip("libhora was built without the async engine", allow_module_level=True)


@pytest.mark.parametrize("dtype", all_dtypes(), ids=str)
def test_named_allreduces_in_rank_dependent_order(dtype):
    r, n = rank_size()
    shapes = [(1,), (7, 3), (1000,), (0,), (33000,)]
    ops = [hora.Sum, hora.Average, hora.Max, hora.Min, hora.Sum]
    order = list(range(len(shapes)))
    order = order[r % len(order):] + order[:r % len(order)]  # each rank starts elsewhere
    handles = {}
    for i in order:
        x = rank_input(dtype, shapes[i], r, 300 + i)
        if i % 2:
            handles[i] = (hora.allreduce_async_(x, op=ops[i], name=f"t{i}"), x)
        else:
            handles[i] = (hora.allreduce_async(x, op=ops[i], name=f"t{i}"), None)
    results = {i: h.wait() for i, (h, _) in handles.items()}
    for i, (h, x) in handles.items():
        inputs = [rank_input(dtype, shapes[i], p, 300 + i) for p in range(n)]
        assert_matches(results[i], reference(inputs, ops[i], dtype), dtype, f"t{i}")
        if x is not None:
            assert results[i] is x  # in place: wait() returns the tensor itself
        assert h.done() and hora.poll(h)
        assert h.wait() is results[i]  # waiting again returns the same result


def test_scale_factors_and_unnamed_in_order():
    r, n = rank_size()
    xs = [rank_input(np.float32, (100,), r, 400 + i) for i in range(4)]
    hs = [hora.allreduce_async(x, op=hora.Average, prescale_factor=2.0, postscale_factor=0.5)
          for x in xs]
    outs = [hora.synchronize(h) for h in hs]
    for i, out in enumerate(outs):
        inputs = [rank_input(np.float32, (100,), p, 400 + i) for p in range(n)]
        np.testing.assert_allclose(out, reference(inputs, hora.Average, np.float32, 2.0, 0.5),
                                   rtol=tol(np.float32))


def test_grouped_allreduce():
    r, n = rank_size()
    xs = [rank_input(np.float64, s, r, 500 + i) for i, s in enumerate([(3,), (4, 5), (0,)])]
    outs = hora.grouped_allreduce(xs, op=hora.Sum, name="group")
    ys = [x.copy() for x in xs]
    same = hora.grouped_allreduce_(ys, op=hora.Max, name="group2")
    for i, (out, y) in enumerate(zip(outs, ys)):
        inputs = [rank_input(np.float64, xs[i].shape, p, 500 + i) for p in range(n)]
        assert_matches(out, reference(inputs, hora.Sum, np.float64), np.float64, f"g{i}")
        assert_matches(y, reference(inputs, hora.Max, np.float64), np.float64, f"g2 {i}")
    assert same is ys or list(same) == ys
    with pytest.raises(hora.InvalidArgumentError, match="one dtype"):
        hora.grouped_allreduce([np.ones(2, np.float32), np.ones(2, np.float64)])
    with pytest.raises(hora.InvalidArgumentError, match="empty"):
        hora.grouped_allreduce([])
    with pytest.raises(hora.InvalidArgumentError, match="tensors\\[1\\]"):
        hora.grouped_allreduce([np.ones(2, np.float32), None])


def test_handle_errors_never_crash():
    r, n = rank_size()
    with pytest.raises(hora.InvalidArgumentError, match="name"):
        hora.allreduce_async(np.ones(2, np.float32), name="")
    with pytest.raises(hora.InvalidArgumentError, match="name"):
        hora.allreduce_async(np.ones(2, np.float32), name=5)
    with pytest.raises(hora.InvalidArgumentError, match="not C-contiguous"):
        hora.allreduce_async(np.ones((4, 4), np.float32)[:, 1])
    # A float32 view at an odd byte offset: refused, never reduced through a misaligned pointer.
    odd = np.zeros(4 * 8 + 1, np.uint8)[1:].view(np.float32)
    assert not odd.flags.aligned
    with pytest.raises(hora.InvalidArgumentError, match="not aligned to its 4-byte elements"):
        hora.allreduce_async(odd)
    with pytest.raises(hora.InvalidArgumentError, match="not aligned"):
        hora.allreduce(odd)
    with pytest.raises(hora.InvalidArgumentError):
        hora.synchronize("not a handle")
    # A handle dropped before completion completes in its finalizer; the engine keeps working.
    h = hora.allreduce_async(np.ones(1000, np.float32), op=hora.Sum, name="dropped")
    del h
    gc.collect()
    out = hora.allreduce_async(np.full(3, 2, np.int32), op=hora.Sum, name="after").wait()
    assert out.tolist() == [2 * n] * 3


def test_dropped_handle_finalized_while_the_thread_holds_the_handle_table_lock():
    """The garbage collector runs a dropped handle's finalizer inside whatever its thread is
    doing, also while that thread holds the lock of the table of live handles (an allocation
    while a new handle registers). The finalizer used to take that lock: the thread deadlocked,
    and every later submission in every thread after it (seen as a hang of the Python suite at 3
    ranks). Reproduced deterministically: the last reference is dropped while this thread holds
    the lock, in a helper thread so that a regression fails here instead of hanging the suite;
    then both handles complete with the sums."""
    import faulthandler
    import os
    import sys
    import threading

    from hora import _async
    r, n = rank_size()
    kept = []

    def body():
        pending = hora.allreduce_async(np.ones(8, np.float32), op=hora.Sum, name="fin.pending")
        done = hora.allreduce_async(np.ones(8, np.float32), op=hora.Sum, name="fin.done")
        done.wait()
        with _async._live_lock:
            del pending, done  # both finalizers run here, under the lock
        after = hora.allreduce_async(np.full(3, 2, np.int32), op=hora.Sum, name="fin.after")
        kept.append(after.wait())

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # deadlocked: say where, and end this rank rather than hang the suite
        faulthandler.dump_traceback(file=sys.stderr)
        sys.stderr.write("test_dropped_handle_finalized...: the finalizer deadlocked\n")
        sys.stderr.flush()
        os._exit(1)
    gc.collect()
    assert kept and kept[0].tolist() == [2 * n] * 3
    hora.allreduce(np.zeros(1, np.float32))  # the dropped ones are reaped by later calls


def test_mismatch_reported_through_the_handle():
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    # Same name, different counts on different ranks: every rank's handle fails.
    h = hora.allreduce_async(np.ones(r + 1, np.float32), name="mismatch")
    with pytest.raises(hora.MismatchError):
        h.wait()
    with pytest.raises(hora.MismatchError):
        h.wait()  # the error is kept
    assert h.done()
    ok = hora.allreduce(np.ones(2, np.float32), op=hora.Sum)
    assert ok.tolist() == [n, n]


@pytest.mark.parametrize("kind", ["allreduce_async", "allreduce_async_", "grouped_allreduce",
                                  "broadcast_async", "reducescatter_async", "alltoall_async"])
def test_one_rank_s_bad_argument_is_an_error_on_every_rank(kind):
    """A call that fails one rank's own checks is refused under its name (hora_refuse_async): the
    other ranks' call of that name raises MismatchError naming the rank instead of waiting, and
    the unnamed numbers stay in step (the sums after it are exact)."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    bad_rows = np.ones((4, 4), np.float32)[:, 1]  # not C-contiguous
    calls = {
        "allreduce_async": lambda x: hora.allreduce_async(x, op=hora.Sum).wait(),
        "allreduce_async_": lambda x: hora.allreduce_async_(x, op=hora.Sum).wait(),
        "grouped_allreduce": lambda x: hora.grouped_allreduce([np.ones(3, np.float32), x]),
        "broadcast_async": lambda x: hora.broadcast_async(x, 0).wait(),
        "reducescatter_async": lambda x: hora.reducescatter_async(np.resize(x, 4 * n)).wait()
        if x.flags.c_contiguous else hora.reducescatter_async(np.float32(1)).wait(),
        "alltoall_async": lambda x: hora.alltoall_async(np.resize(x, 4 * n)).wait()
        if x.flags.c_contiguous else hora.alltoall_async(np.float32(1)).wait(),
    }
    for k in (n - 1, 0):
        if r == k:
            with pytest.raises(hora.InvalidArgumentError, match="C-contiguous|0-d"):
                calls[kind](bad_rows)
        else:
            with pytest.raises(hora.MismatchError,
                               match=rf"failed its own argument checks on rank\(s\) {k},"):
                calls[kind](np.ones(4, np.float32))
        x = np.arange(5, dtype=np.float64) + 1000.0 * r
        want = sum(np.arange(5, dtype=np.float64) + 1000.0 * p for p in range(n))
        assert hora.allreduce_async(x, op=hora.Sum).wait().tolist() == want.tolist()


def test_join():
    r, n = rank_size()
    if r == 0:
        last = hora.join()
        got = None
    else:
        # Rank 0 has joined: it contributes zeros.
        got = hora.allreduce_async(np.ones(4, np.float32), op=hora.Sum, name="join.sum").wait()
        last = hora.join()
    lasts = hora.allgather(np.array([last], dtype=np.int64))
    assert (lasts == lasts[0]).all() and 0 <= last < n
    if n > 1:
        assert last != 0
    if got is not None:
        assert got.tolist() == [n - 1] * 4


def test_broadcast_async():
    r, n = rank_size()
    xs = [np.full(5, r + 10 * i, dtype=np.int64) for i in range(3)]
    hs = [hora.broadcast_async_(x, root_rank=i % n, name=f"bcast{i}")
          for i, x in reversed(list(enumerate(xs)))]  # submitted in reverse order
    assert all(h.wait() is x for h, x in zip(hs, reversed(xs)))
    for i, x in enumerate(xs):
        assert x.tolist() == [i % n + 10 * i] * 5
    with pytest.raises(hora.InvalidArgumentError, match="root"):
        hora.broadcast_async_(xs[0], root_rank=n)


@pytest.mark.parametrize("dtype", [np.int32, np.float64], ids=str)
def test_broadcast_reducescatter_alltoall_async(dtype):
    r, n = rank_size()
    x = rank_input(dtype, (2 * n, 3), r, 600)
    # Submitted in a rank-dependent order; matched by name.
    subs = [("rs", lambda: hora.reducescatter_async(x, op=hora.Sum, name="rs")),
            ("a2a", lambda: hora.alltoall_async(x, name="a2a")),
            ("bc", lambda: hora.broadcast_async(x, root_rank=n - 1, name="bc"))]
    if r % 2:
        subs.reverse()
    hs = {k: f() for k, f in subs}
    got = {k: h.wait() for k, h in hs.items()}
    inputs = [rank_input(dtype, (2 * n, 3), p, 600) for p in range(n)]
    np.testing.assert_array_equal(got["rs"], sum(i.astype(np.float64) for i in inputs)
                                  [2 * r:2 * r + 2].astype(dtype))
    np.testing.assert_array_equal(got["a2a"], np.concatenate([i[2 * r:2 * r + 2]
                                                              for i in inputs]))
    np.testing.assert_array_equal(got["bc"], inputs[n - 1])
    np.testing.assert_array_equal(x, inputs[r])  # inputs untouched
    if n > 1:
        with pytest.raises(hora.InvalidArgumentError, match="does not divide"):
            hora.reducescatter_async(np.ones(n + 1, dtype))
        with pytest.raises(hora.InvalidArgumentError, match="does not divide"):
            hora.alltoall_async(np.ones(n + 1, dtype))
