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
