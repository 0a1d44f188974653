"""A call that fails one rank's own checks fails on every rank, and leaves the ranks in step.

Horovod 0.28 raises such an error on the rank whose argument is bad and nowhere else: its peers
wait for a request that never comes, and, for a call without a name, the bad rank's later unnamed
calls are numbered one behind the peers', so that its next tensor is reduced with the peers'
current one. hora.torch submits a refusal under the call's name (hora_refuse_async): every value
here is asserted on every rank, and each case ends with an unnamed allreduce whose exact sum shows
that the ranks are still in step."""
import pytest

import hora
from conftest import rank_size

torch = pytest.importorskip("torch")
if not hasattr(hora, "allreduce_async_"):
    pytest.skip("libhora was built without the async engine", allow_module_level=True)
import hora.torch as hvd  # noqa: E402


def refused_by(k):
    return rf"failed its own argument checks on rank\(s\) {k},"


def assert_in_step(tag):
    """An unnamed allreduce of values unique to each rank: the exact sum on every rank."""
    r, n = rank_size()
    x = torch.arange(5, dtype=torch.float64) + 1000.0 * r + float(tag)
    got = hvd.allreduce(x, op=hvd.Sum)
    want = sum(torch.arange(5, dtype=torch.float64) + 1000.0 * p + float(tag) for p in range(n))
    assert torch.equal(got, want), (tag, got, want)


def noncontig(n=4):
    return torch.arange(2 * n, dtype=torch.float32)[::2]


# Each case: (bad argument's call, good call) -> the call of this rank; the bad one raises a
# ValueError of its own (the match), the good one a MismatchError naming the bad rank.
CASES = {
    "allreduce": (lambda nm: hvd.allreduce(noncontig(), name=nm),
                  lambda nm: hvd.allreduce(torch.ones(4), name=nm, op=hvd.Sum), "contiguous"),
    "allreduce_async_": (lambda nm: hvd.allreduce_async_(noncontig(), name=nm).wait(),
                         lambda nm: hvd.allreduce_async_(torch.ones(4), name=nm).wait(),
                         "contiguous"),
    # (grouped_allreduce makes its members contiguous, as Horovod's does; a dtype hora does not
    # take is found after the call took its name: the refusal goes under that name.)
    "grouped_allreduce": (lambda nm: hvd.grouped_allreduce([torch.ones(4, dtype=torch.complex64),
                                                            torch.ones(3)], name=nm),
                          lambda nm: hvd.grouped_allreduce([torch.ones(4), torch.ones(3)],
                                                           name=nm), "not supported"),
    "allgather": (lambda nm: hvd.allgather(torch.tensor(1.0), name=nm),
                  lambda nm: hvd.allgather(torch.ones(1), name=nm), "0-d"),
    "grouped_allgather": (lambda nm: hvd.grouped_allgather([torch.ones(2), torch.tensor(1.0)],
                                                           name=nm),
                          lambda nm: hvd.grouped_allgather([torch.ones(2), torch.ones(1)],
                                                           name=nm), "0-d"),
    "broadcast": (lambda nm: hvd.broadcast(torch.ones(3), root_rank=hvd.size(), name=nm),
                  lambda nm: hvd.broadcast(torch.ones(3), root_rank=0, name=nm), "root"),
    "reducescatter": (lambda nm: hvd.reducescatter(torch.tensor(1.0), name=nm),
                      lambda nm: hvd.reducescatter(torch.ones(2 * hvd.size()), name=nm), "0-d"),
    "grouped_reducescatter": (
        lambda nm: hvd.grouped_reducescatter([torch.ones(hvd.size()), torch.tensor(1.0)], name=nm),
        lambda nm: hvd.grouped_reducescatter([torch.ones(hvd.size())] * 2, name=nm), "0-d"),
    "alltoall": (lambda nm: hvd.alltoall(torch.tensor(1.0), name=nm),
                 lambda nm: hvd.alltoall(torch.ones(hvd.size()), name=nm), "0-d"),
}


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_one_rank_s_bad_argument_is_an_error_on_every_rank(kind, named):
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    bad_call, good_call, own = CASES[kind]
    for k in (n - 1, 0):  # the bad rank: the last one, then the coordinator
        nm = f"refused.{kind}.{k}" if named else None
        if r == k:
            with pytest.raises(ValueError, match=own):
                bad_call(nm)
        else:
            with pytest.raises(hora.MismatchError, match=refused_by(k)):
                good_call(nm)
        assert_in_step(k)
        if named:  # the name works again on every rank
            if kind == "allreduce":
                assert torch.equal(good_call(nm), torch.full((4,), float(n)))
            else:
                good_call(nm)
        assert_in_step(k + 100)


def test_the_same_named_call_failing_on_every_rank_again_and_again():
    """Every rank refuses the same name five times in a row: no refusal is left behind on any
    rank (each waits for the ranks to meet on its previous one), then the name runs."""
    r, n = rank_size()
    for i in range(5):
        with pytest.raises(ValueError, match="contiguous"):
            hvd.allreduce(noncontig(), name="again")
        with pytest.raises(ValueError, match="contiguous"):
            hvd.allreduce(noncontig())  # unnamed: a new number each time, as on the other ranks
    assert torch.equal(hvd.allreduce(torch.full((3,), 1.0 + r), name="again", op=hvd.Sum),
                       torch.full((3,), n * (n + 1) / 2))
    assert_in_step(7)


def test_a_bad_call_on_one_rank_alone_is_an_error_in_the_peers_next_call():
    """A collective that only one rank calls (with a bad argument) is refused under the number it
    took: the peers' next unnamed call meets that refusal and raises, the call after it is in
    step. Never another tensor's data."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    if r == 0:
        with pytest.raises(ValueError, match="contiguous"):
            hvd.allreduce(noncontig())
    else:
        with pytest.raises(hora.MismatchError, match=refused_by(0)):
            hvd.allreduce(torch.ones(4))
    assert_in_step(11)


def test_errors_found_by_the_engine_make_no_refusal():
    """A mismatch is found after every rank submitted: every rank raises it once, and nothing else
    is left to meet a later call."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(hora.MismatchError, match="disagree on count"):
        hvd.allreduce(torch.ones(2 + r))
    with pytest.raises(ValueError, match="already in flight"):
        h = hvd.allreduce_async(torch.ones(2), name="inflight")
        try:
            hvd.allreduce_async(torch.ones(2), name="inflight")  # the name is h's: no refusal
        finally:
            assert torch.equal(h.wait(), torch.ones(2))
    assert_in_step(13)


def test_refusals_inside_a_process_set():
    """The refusal goes to the set's ranks only, under the set's own unnamed numbers."""
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs two ranks")
    ps = hvd.add_process_set([0, 1])
    try:
        if r == 1:
            with pytest.raises(ValueError, match="contiguous"):
                hvd.allreduce(noncontig(), process_set=ps)
        elif r == 0:
            with pytest.raises(hora.MismatchError, match=refused_by(1)):
                hvd.allreduce(torch.ones(4), process_set=ps)
        if r in (0, 1):
            got = hvd.allreduce(torch.full((2,), 1.0 + r), op=hvd.Sum, process_set=ps)
            assert torch.equal(got, torch.full((2,), 3.0))
        # A rank outside the set refuses nothing (it is not in the call): the job stays in step.
        if r == n - 1 and n > 2:
            with pytest.raises(ValueError, match="not in the process set"):
                hvd.allreduce(torch.ones(2), process_set=ps)
        assert_in_step(17)
    finally:
        hvd.remove_process_set(ps)


def test_a_name_refused_on_one_rank_alone_is_not_taken_again_until_the_others_meet_it(
        monkeypatch):
    """Rank 0 fails a named call before the others make it, then makes it again, valid: that call
    waits for the refusal (here 0.2 s), then raises a ValueError that says why; a second bad call
    raises its own error and refuses nothing more; the others' call of the name then meets the one
    refusal, and the ranks are in step."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    import hora._async
    monkeypatch.setattr(hora._async, "REFUSAL_WAIT_S", 0.2)
    if r == 0:
        with pytest.raises(ValueError, match="contiguous"):
            hvd.allreduce(noncontig(), name="lone")
        with pytest.raises(ValueError, match="failed its checks on this rank"):
            hvd.allreduce(torch.ones(4), name="lone")
        with pytest.raises(ValueError, match="contiguous"):
            hvd.allreduce(noncontig(), name="lone")
    hvd.barrier()
    if r != 0:
        with pytest.raises(hora.MismatchError, match=refused_by(0)):
            hvd.allreduce(torch.ones(4), name="lone")
    assert_in_step(19)
    assert torch.equal(hvd.allreduce(torch.ones(2), name="lone", op=hvd.Sum),
                       torch.full((2,), float(n)))
