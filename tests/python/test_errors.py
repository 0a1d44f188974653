"""Bad input raises hora.HoraError subclasses that say what was wrong; nothing crashes, and the
context keeps working afterwards. Every rank passes the same bad input, except in the last test,
where one rank alone does: its call is refused (hora_refuse) and the others raise instead of
waiting."""
import numpy as np
import pytest

import hora
from conftest import rank_size


@pytest.mark.parametrize("bad", [None, [1.0, 2.0], 3.0, "abc", object()],
                         ids=["None", "list", "float", "str", "object"])
def test_not_an_array(bad):
    with pytest.raises(hora.InvalidArgumentError, match="expected a NumPy array"):
        hora.allreduce(bad)
    with pytest.raises(hora.InvalidArgumentError):
        hora.broadcast_(bad, 0)
    with pytest.raises(hora.InvalidArgumentError):
        hora.allgather(bad)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.complex64, np.float128,
                                   np.dtype(">f4"), np.dtype("U3")], ids=str)
def test_unsupported_dtype(dtype):
    x = np.zeros(4, dtype=dtype)
    with pytest.raises(hora.InvalidArgumentError, match="not supported") as e:
        hora.allreduce(x)
    assert str(np.dtype(dtype)) in str(e.value)
    if np.dtype(dtype) == np.dtype(">f4"):
        assert "byte order" in str(e.value)


def test_non_contiguous_is_an_error_that_says_so():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    for view in (x[:, ::2], x.T, x[::2]):
        with pytest.raises(hora.InvalidArgumentError, match="not C-contiguous"):
            hora.allreduce(view)
        with pytest.raises(hora.InvalidArgumentError, match="not C-contiguous"):
            hora.allreduce_(view)


def test_read_only_in_place():
    x = np.ones(3, dtype=np.float32)
    x.flags.writeable = False
    with pytest.raises(hora.InvalidArgumentError, match="read-only"):
        hora.allreduce_(x)
    out = hora.allreduce(x, op=hora.Sum)  # out of place only reads it
    assert (out == hora.size()).all()


@pytest.mark.parametrize("op", [7, -1, "sum", None, True, 1.5])
def test_bad_op(op):
    with pytest.raises(hora.InvalidArgumentError, match="op"):
        hora.allreduce(np.ones(2, dtype=np.float32), op=op)


def test_bad_root_and_scale():
    r, n = rank_size()
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(hora.InvalidArgumentError, match="root"):
        hora.broadcast(x, root_rank=n)
    with pytest.raises(hora.InvalidArgumentError, match="root"):
        hora.broadcast_(x, root_rank=-1)
    with pytest.raises(hora.InvalidArgumentError, match="root_rank must be an int"):
        hora.broadcast(x, root_rank="0")
    with pytest.raises(hora.InvalidArgumentError, match="integer dtype"):
        hora.allreduce(np.ones(3, dtype=np.int32), prescale_factor=2.0)
    with pytest.raises(hora.InvalidArgumentError, match="postscale_factor must be a number"):
        hora.allreduce(x, postscale_factor="x")


def test_shape_errors():
    r, n = rank_size()
    with pytest.raises(hora.InvalidArgumentError, match="0-d"):
        hora.allgather(np.ones((), dtype=np.float32))
    with pytest.raises(hora.InvalidArgumentError, match="0-d"):
        hora.allgather(np.float32(1.0))  # a NumPy scalar reads as a 0-d array
    if n > 1:
        with pytest.raises(hora.InvalidArgumentError, match="does not divide"):
            hora.alltoall(np.ones(n + 1, dtype=np.float32))
    with pytest.raises(hora.InvalidArgumentError, match="splits"):
        hora.alltoall(np.ones(4, dtype=np.float32), splits=[4] + [1] * (n - 1) + [1])
    with pytest.raises(hora.InvalidArgumentError, match="splits"):
        hora.alltoall(np.ones(4, dtype=np.float32), splits=[-1] * n)


def test_error_classes_carry_code_and_c_message():
    assert issubclass(hora.MismatchError, hora.HoraError)
    assert issubclass(hora.InvalidArgumentError, ValueError)
    assert issubclass(hora.IOError, OSError)
    assert issubclass(hora.NotFoundError, LookupError)
    try:
        hora.allreduce(np.ones(3, dtype=np.int64), prescale_factor=0.5)
    except hora.InvalidArgumentError as e:
        assert e.code == 1 and e.name == "HORA_ERR_INVALID_ARGUMENT"
        # The message comes from the C library (hora_last_error) and names the call.
        assert "hora_allreduce" in e.message
    else:
        pytest.fail("no error raised")


def test_context_still_works_after_errors():
    r, n = rank_size()
    out = hora.allreduce(np.full(5, r, dtype=np.int64), op=hora.Sum)
    assert (out == n * (n - 1) // 2).all()


BLOCKING = {  # (this rank's bad call, the others' good call, the bad rank's own error)
    "allreduce": (lambda: hora.allreduce(np.ones((4, 2), np.float32)[:, 0]),
                  lambda: hora.allreduce(np.ones(4, np.float32)), "C-contiguous"),
    "allreduce_": (lambda: hora.allreduce_(np.ones(4, np.complex64)),
                   lambda: hora.allreduce_(np.ones(4, np.float32)), "not supported"),
    "broadcast": (lambda: hora.broadcast(np.ones(4, np.float32), hora.size()),
                  lambda: hora.broadcast(np.ones(4, np.float32), 0), "root"),
    "allgather": (lambda: hora.allgather(np.float32(1)),
                  lambda: hora.allgather(np.ones(1, np.float32)), "0-d"),
    "reducescatter": (lambda: hora.reducescatter(np.float32(1)),
                      lambda: hora.reducescatter(np.ones(2 * hora.size(), np.float32)), "0-d"),
    "alltoall": (lambda: hora.alltoall(np.ones(hora.size() + 1, np.float32)),
                 lambda: hora.alltoall(np.ones(hora.size(), np.float32)), "divide"),
}


@pytest.mark.parametrize("kind", sorted(BLOCKING))
def test_one_rank_s_bad_argument_fails_the_blocking_call_on_every_rank(kind):
    """Only the last rank's argument is bad, and the Python layer finds it before libhora: that
    rank raises its own error and takes part in the call check as "invalid arguments"
    (hora_refuse); the others raise MismatchError naming it instead of waiting, or meeting its
    next call (a sum of another array, without an error). The sums after it are exact."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    bad, good, own = BLOCKING[kind]
    if r == n - 1:
        with pytest.raises(hora.InvalidArgumentError, match=own):
            bad()
    else:
        with pytest.raises(hora.MismatchError, match=f"invalid arguments on rank {n - 1}"):
            good()
    x = np.arange(3, dtype=np.float64) + 100.0 * r
    want = sum(np.arange(3, dtype=np.float64) + 100.0 * p for p in range(n))
    assert hora.allreduce(x, op=hora.Sum).tolist() == want.tolist()
