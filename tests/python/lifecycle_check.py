"""init/shutdown order, use before init and after shutdown (run alone: one process lifetime).
Tests run in file order; each needs the state the previous one left."""
import numpy as np
import pytest

import hora


def test_1_use_before_init_raises():
    assert not hora.is_initialized()
    for call in (hora.rank, hora.size, hora.barrier,
                 lambda: hora.allreduce(np.ones(2, dtype=np.float32))):
        with pytest.raises(hora.NotInitializedError, match=r"call hora.init\(\) first"):
            call()


def test_2_init_is_idempotent():
    hora.init()
    hora.init()  # a second init while running does nothing, as in Horovod
    assert hora.is_initialized() and hora.size() == 2
    out = hora.allreduce(np.full(3, hora.rank() + 1, dtype=np.int32), op=hora.Sum)
    assert out.tolist() == [3, 3, 3]


def test_3_use_after_shutdown_raises():
    x = np.ones(4, dtype=np.float64)
    reader_state = hora.allgather(np.array([hora.rank()], dtype=np.int64))
    # A handle still pending at shutdown is completed by it, and stays usable afterwards.
    pending = None
    if hasattr(hora, "allreduce_async"):
        pending = hora.allreduce_async(np.full(5, 3.0), op=hora.Sum, name="pending")
    hora.shutdown()
    if pending is not None:
        assert pending.done() and pending.wait().tolist() == [6.0] * 5
    hora.shutdown()  # no-op
    assert not hora.is_initialized()
    calls = [hora.rank, hora.local_size, hora.barrier, lambda: hora.allreduce(x),
             lambda: hora.allreduce_(x), lambda: hora.broadcast(x, 0),
             lambda: hora.allgather(x), lambda: hora.reducescatter(x),
             lambda: hora.alltoall(x), lambda: hora.RecordReader("*")]
    if hasattr(hora, "join"):
        calls += [lambda: hora.allreduce_async(x), lambda: hora.join()]
    for call in calls:
        with pytest.raises(hora.NotInitializedError, match="shut down.*started before hora.*mpi4py"):
            call()
    assert reader_state.tolist() == [0, 1]


def test_4_reinit_after_hora_finalized_mpi_is_an_error_not_a_crash():
    # hora started MPI in test 2, so shutdown finalized it, and MPI cannot start twice.
    # The message says why and what to do instead.
    with pytest.raises(hora.MPIError, match="already finalized.*cannot start twice.*mpi4py"):
        hora.init()
    assert not hora.is_initialized()
