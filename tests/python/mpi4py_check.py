"""hora.init(comm=...) with an mpi4py communicator: hora works on that group, leaves MPI to
mpi4py at shutdown, and can start again. Run alone, with 3 ranks."""
import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI")
import hora  # noqa: E402


def test_split_communicator_and_reinit():
    world = MPI.COMM_WORLD
    color = 0 if world.rank == 0 else 1  # 3 ranks: groups {0} and {1, 2}
    sub = world.Split(color, world.rank)
    hora.init(comm=sub)
    got = (hora.rank(), hora.size())
    s = hora.allreduce(np.array([world.rank], dtype=np.int64), op=hora.Sum)
    hora.shutdown()
    # MPI belongs to mpi4py, so hora can start again, this time on the whole world.
    assert not MPI.Is_finalized()
    hora.init()
    w = hora.allreduce(np.array([1], dtype=np.int32), op=hora.Sum)
    hora.shutdown()
    want = (sub.rank, sub.size)
    sub.Free()
    assert got == want and want == ((0, 1) if color == 0 else (world.rank - 1, 2))
    assert s.tolist() == [0 if color == 0 else 3]
    assert w.tolist() == [world.size]


def test_bad_comm():
    with pytest.raises(hora.InvalidArgumentError, match="mpi4py"):
        hora.init(comm="world")
    assert not hora.is_initialized()


def test_process_sets_from_communicators():
    """Horovod 0.28's init(process_sets=[ProcessSet(comm)]): every rank passes its own part of
    an MPI_Comm_split, and each distinct group becomes a set (3 ranks: {0, 2} and {1})."""
    torch = pytest.importorskip("torch")
    import hora.torch as hvd
    world = MPI.COMM_WORLD
    sub = world.Split(world.rank % 2, world.rank)
    ps = hvd.ProcessSet(sub)
    assert ps.mpi_comm is sub and ps.ranks is None and ps.process_set_id is None
    with pytest.raises(ValueError, match="mpi4py Comm"):
        hvd.ProcessSet(5)
    hvd.init(process_sets=[ps])
    try:
        evens = list(range(0, world.size, 2))
        odds = list(range(1, world.size, 2))
        mine, other = (evens, odds) if world.rank % 2 == 0 else (odds, evens)
        assert ps.ranks == mine and ps.process_set_id > 0
        assert ps.included() and ps.size() == len(mine) and ps.rank() == mine.index(world.rank)
        s = hvd.allreduce(torch.tensor([float(world.rank + 1)]), op=hvd.Sum, process_set=ps)
        assert s.item() == sum(r + 1 for r in mine)
        g = hvd.allgather(torch.tensor([world.rank]), process_set=ps)
        assert g.tolist() == mine
        # The other ranks' group was registered too, on every rank.
        with pytest.raises(ValueError, match="already registered"):
            hvd.add_process_set(other)
        # As in Horovod, a communicator's set is registered only by init.
        with pytest.raises(NotImplementedError, match="communicator"):
            hvd.add_process_set(hvd.ProcessSet(sub))
        hvd.barrier()
        assert hvd.remove_process_set(ps) is True and ps.process_set_id is None
    finally:
        hvd.shutdown()
    # A rank whose communicator is MPI.COMM_NULL: a ValueError on every rank, naming it.
    lone = world.Split(0 if world.rank == 0 else MPI.UNDEFINED, world.rank)
    try:
        with pytest.raises(ValueError, match="entry 0 on rank 1: .*COMM_NULL"):
            hvd.init(process_sets=[hvd.ProcessSet(lone)])
    finally:
        hvd.shutdown()
        sub.Free()
        if lone != MPI.COMM_NULL:
            lone.Free()
