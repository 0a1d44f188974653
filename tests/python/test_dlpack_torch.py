"""Objects with __dlpack__: PyTorch CPU tensors of every hora dtype, without copies."""
import numpy as np
import pytest

import hora
from conftest import rank_input, rank_size

torch = pytest.importorskip("torch")

TORCH_DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64]


def t_input(dtype, shape, r, seed, like=None):
    """rank_input as a torch tensor of `dtype`, with the value range of dtype `like`."""
    lo = 0 if (like or dtype) == torch.uint8 else -5
    return torch.from_numpy(rank_input(np.float64, shape, r, seed, lo, 9)).to(dtype)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_allreduce_every_dtype(dtype):
    r, n = rank_size()
    x = t_input(dtype, (17, 3), r, 90)
    out = hora.allreduce(x, op=hora.Sum)
    mx = hora.allreduce(x, op=hora.Max)
    ga = hora.allgather(x)
    bc = hora.broadcast(x, root_rank=n - 1)
    want = sum(t_input(torch.float64, (17, 3), p, 90, dtype) for p in range(n))
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == (17, 3)
    torch.testing.assert_close(out.to(torch.float64), want, rtol=0, atol=0)
    torch.testing.assert_close(
        mx.to(torch.float64),
        torch.stack([t_input(torch.float64, (17, 3), p, 90, dtype) for p in range(n)]).amax(0))
    assert ga.shape == (17 * n, 3) and ga.dtype == dtype
    torch.testing.assert_close(ga, torch.cat([t_input(dtype, (17, 3), p, 90) for p in range(n)]))
    torch.testing.assert_close(bc, t_input(dtype, (17, 3), n - 1, 90))


def test_in_place_is_zero_copy():
    r, n = rank_size()
    # A tensor sharing memory with a NumPy array: the in-place allreduce must write into that
    # very memory (a hidden copy would leave `base` unchanged).
    base = np.full((4, 4), r + 1, dtype=np.float32)
    t = torch.from_numpy(base)
    ptr = t.data_ptr()
    ret = hora.allreduce_(t, op=hora.Sum)
    # And a view at an offset (DLPack byte_offset / data pointer of a row slice).
    big = torch.zeros(10, dtype=torch.int64)
    view = big[3:6]
    view.fill_(r + 1)
    hora.allreduce_(view, op=hora.Sum)
    assert ret is t and t.data_ptr() == ptr
    assert (base == n * (n + 1) / 2).all()
    assert big.tolist() == [0, 0, 0] + [n * (n + 1) // 2] * 3 + [0] * 4


def test_torch_errors():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with pytest.raises(hora.InvalidArgumentError, match="not contiguous"):
        hora.allreduce(x.t())
    with pytest.raises(hora.InvalidArgumentError, match="not supported"):
        hora.allreduce(torch.zeros(3, dtype=torch.complex64))
    # An unsigned dtype hora lacks (torch.uint16 exists from torch 2.3; requirements say >= 2.1).
    for name in ("uint16", "uint32"):
        if hasattr(torch, name):
            with pytest.raises(hora.InvalidArgumentError, match="not supported"):
                hora.allreduce(torch.zeros(3, dtype=getattr(torch, name)))
    # hora's ops are not differentiable: a tensor that requires grad is read, the output is not
    # part of the graph.
    g = hora.allreduce(torch.ones(3, requires_grad=True), op=hora.Sum)
    assert not g.requires_grad and g.tolist() == [hora.size()] * 3
    with pytest.raises(hora.InvalidArgumentError, match="not supported"):
        hora.allreduce(torch.zeros(3).to_sparse())
    out = hora.allreduce(x.t().contiguous(), op=hora.Min)
    assert out.shape == (4, 3)


class OnlyDLPack:
    """A producer that offers nothing but the DLPack protocol (like a foreign array library)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_generic_dlpack_producer_zero_copy(dtype):
    r, n = rank_size()
    big = t_input(dtype, (5, 6), r, 95)
    inner = big[1:4]  # rows 1..3: a non-zero data offset into `big`
    hora.allreduce_(OnlyDLPack(inner), op=hora.Sum)
    out = None
    if dtype != torch.bfloat16:  # NumPy (the fallback output) has no bfloat16
        out = hora.allreduce(OnlyDLPack(t_input(dtype, (2, 2), r, 96)), op=hora.Max)
    want = sum(t_input(torch.float64, (5, 6), p, 95, dtype) for p in range(n))
    torch.testing.assert_close(big[1:4].to(torch.float64), want[1:4], rtol=0, atol=0)
    torch.testing.assert_close(big[0], t_input(dtype, (5, 6), r, 95)[0], rtol=0, atol=0)
    torch.testing.assert_close(big[4], t_input(dtype, (5, 6), r, 95)[4], rtol=0, atol=0)
    if out is not None:
        assert isinstance(out, np.ndarray) and out.shape == (2, 2)
        want = torch.stack([t_input(torch.float64, (2, 2), p, 96, dtype) for p in range(n)])
        np.testing.assert_array_equal(out.astype(np.float64), want.amax(0).numpy())


def test_generic_dlpack_non_contiguous():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with pytest.raises(hora.InvalidArgumentError, match="not contiguous"):
        hora.allreduce_(OnlyDLPack(x.t()))
    with pytest.raises(hora.InvalidArgumentError, match="not supported"):
        hora.allreduce_(OnlyDLPack(torch.zeros(2, dtype=torch.complex64)))
