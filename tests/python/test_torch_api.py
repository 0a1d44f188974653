"""hora.torch as horovod.torch (0.28): names, signatures, every collective's values against a
single-process torch reference, handles, autograd and errors, on every rank."""
import gc
import inspect
import os
import time
import warnings

import pytest

import hora
from conftest import rank_size

torch = pytest.importorskip("torch")
if not hasattr(hora, "allreduce_async_"):
    pytest.skip("libhora was built without the async engine", allow_module_level=True)
import hora.torch as hvd  # noqa: E402

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64]
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
G = "global"  # stands for the process_set default in SIGNATURES
SIGNATURES = {
    "allreduce": "tensor average=None name=None compression=C op=None prescale_factor=1.0 "
                 "postscale_factor=1.0 process_set=G",
    "allreduce_": "tensor average=None name=None op=None prescale_factor=1.0 "
                  "postscale_factor=1.0 process_set=G",
    "allreduce_async": "tensor average=None name=None op=None prescale_factor=1.0 "
                       "postscale_factor=1.0 process_set=G",
    "allreduce_async_": "tensor average=None name=None op=None prescale_factor=1.0 "
                        "postscale_factor=1.0 process_set=G",
    "grouped_allreduce": "tensors average=None name=None compression=C op=None "
                         "prescale_factor=1.0 postscale_factor=1.0 process_set=G",
    "grouped_allreduce_": "tensors average=None name=None op=None prescale_factor=1.0 "
                          "postscale_factor=1.0 process_set=G",
    "grouped_allreduce_async": "tensors average=None name=None op=None prescale_factor=1.0 "
                               "postscale_factor=1.0 process_set=G",
    "grouped_allreduce_async_": "tensors average=None name=None op=None prescale_factor=1.0 "
                                "postscale_factor=1.0 process_set=G",
    "allgather": "tensor name=None process_set=G",
    "allgather_async": "tensor name=None process_set=G",
    "grouped_allgather": "tensors name=None process_set=G",
    "grouped_allgather_async": "tensors name=None process_set=G",
    "broadcast": "tensor root_rank name=None process_set=G",
    "broadcast_": "tensor root_rank name=None process_set=G",
    "broadcast_async": "tensor root_rank name=None process_set=G",
    "broadcast_async_": "tensor root_rank name=None process_set=G",
    "alltoall": "tensor splits=None name=None process_set=G",
    "alltoall_async": "tensor splits=None name=None process_set=G",
    "reducescatter": "tensor name=None compression=C op=A process_set=G prescale_factor=1.0 "
                     "postscale_factor=1.0",
    "reducescatter_async": "tensor name=None op=A process_set=G prescale_factor=1.0 "
                           "postscale_factor=1.0",
    "grouped_reducescatter": "tensors name=None compression=C op=A process_set=G "
                             "prescale_factor=1.0 postscale_factor=1.0",
    "grouped_reducescatter_async": "tensors name=None op=A process_set=G prescale_factor=1.0 "
                                   "postscale_factor=1.0",
    "allgather_object": "obj name=None process_set=G",
    "broadcast_object": "obj root_rank=0 name=None process_set=G",
    "barrier": "process_set=G",
    "join": "device=-1",
    "poll": "handle",
    "synchronize": "handle",
    "DistributedOptimizer": "optimizer named_parameters=None compression=N "
                            "backward_passes_per_step=1 op=A gradient_predivide_factor=1.0 "
                            "num_groups=0 groups=None sparse_as_dense=False process_set=G",
}


def _render(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.default is inspect.Parameter.empty:
            out.append(p.name)
            continue
        d = p.default
        if d is hvd.global_process_set:
            d = "G"
        elif d is hvd.Compression.none:
            d = "N"
        elif p.name == "op" and d == hvd.Average:
            d = "A"
        elif p.name == "compression" and d is None:
            d = "C"  # Compression.none, taken as None
        out.append(f"{p.name}={d}")
    return " ".join(out)


def test_names_and_signatures_are_horovods():
    for name, sig in SIGNATURES.items():
        want = sig.replace("compression=C", "compression=C")
        got = _render(getattr(hvd, name))
        if "compression=C" in want and "compression=N" in got:
            got = got.replace("compression=N", "compression=C")
        assert got == want, name
    for name in ["init", "shutdown", "is_initialized", "rank", "size", "local_rank",
                 "local_size", "cross_rank", "cross_size", "Sum", "Average", "Min", "Max",
                 "Product", "Adasum", "Compression", "ProcessSet", "global_process_set",
                 "add_process_set", "remove_process_set", "broadcast_parameters",
                 "broadcast_optimizer_state", "HorovodInternalError", "mpi_enabled",
                 "mpi_built", "gloo_enabled", "gloo_built", "nccl_built", "ddl_built",
                 "ccl_built", "cuda_built", "rocm_built", "mpi_threads_supported",
                 "start_timeline", "stop_timeline", "SyncBatchNorm", "is_homogeneous"]:
        assert hasattr(hvd, name), name
    assert len({hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product, hvd.Adasum}) == 6
    # Every node the same size here, one node or the emulated ones of tests/multinode (fake
    # nodes of other sizes: tests/mpi/test_call_check.c)
    assert hvd.is_homogeneous() is True
    assert hvd.cross_size() * hvd.local_size() == hvd.size()
    hosts = os.environ.get("HORA_MN_HOSTS")  # under tests/multinode/nodes.sh: one node per host
    if hosts:
        assert hvd.cross_size() == len(hosts.split(",")) > 1
    # Horovod's submodules, as programs import them.
    from hora.torch.mpi_ops import synchronize
    from hora.torch.compression import Compression
    import hora.torch.functions as functions
    assert synchronize is hvd.synchronize and Compression is hvd.Compression
    assert functions.broadcast_parameters is hvd.broadcast_parameters
    from hora.torch.compression import Compressor, FP16Compressor, NoneCompressor
    assert Compression.none is NoneCompressor and Compression.fp16 is FP16Compressor
    assert issubclass(FP16Compressor, Compressor)
    # Horovod's framework-independent modules, as elastic programs import them.
    from hora.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
    from hora.common.process_sets import ProcessSet, add_process_set, global_process_set
    import hora.common.process_sets
    assert HorovodInternalError is hvd.HorovodInternalError
    assert HostsUpdatedInterrupt is hvd.elastic.HostsUpdatedInterrupt
    assert (ProcessSet, add_process_set, global_process_set) == \
        (hvd.ProcessSet, hvd.add_process_set, hvd.global_process_set)
    assert hora.common.process_sets.remove_process_set is hvd.remove_process_set


def test_a_pytorch_older_than_2_1_is_named_at_import():
    """hora.torch on a PyTorch without Tensor.register_post_accumulate_grad_hook (before 2.1):
    ImportError naming the version needed, at the import (in a process of its own, rank 0 only:
    nothing collective)."""
    if rank_size()[0] != 0:
        return
    import subprocess
    import sys
    code = ("import torch\n"
            "del torch.Tensor.register_post_accumulate_grad_hook\n"
            "try:\n"
            "    import hora.torch\n"
            "except ImportError as e:\n"
            "    print('IMPORT ERROR:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "IMPORT ERROR: hora.torch needs PyTorch >= 2.1" in out.stdout, out.stdout
    assert f"this is torch {torch.__version__}" in out.stdout, out.stdout


def test_custom_compressor_subclass():
    """A program's own compressor, subclassing horovod.torch.compression.Compressor (here: the
    values travel doubled and come back halved), in allreduce and DistributedOptimizer."""
    from hora.torch.compression import Compressor
    r, n = rank_size()
    calls = []

    class Doubling(Compressor):
        @staticmethod
        def compress(tensor):
            calls.append("c")
            return tensor * 2, "ctx"

        @staticmethod
        def decompress(tensor, ctx):
            calls.append(ctx)
            return tensor / 2

    x = torch.arange(6, dtype=torch.float64) * (r + 1)
    out = hvd.allreduce(x, op=hvd.Sum, compression=Doubling, name="custom.compressor")
    lin = torch.nn.Linear(3, 1, bias=False).double()
    torch.nn.init.ones_(lin.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=1.0), compression=Doubling,
                                   named_parameters=lin.named_parameters(prefix="custom"))
    lin(torch.full((1, 3), float(r + 1), dtype=torch.float64)).sum().backward()
    opt.step()
    mean = sum(q + 1 for q in range(n)) / n
    assert out.tolist() == (torch.arange(6, dtype=torch.float64) * n * (n + 1) / 2).tolist()
    assert lin.weight.detach().tolist() == [[1.0 - mean] * 3]
    assert calls.count("c") == 2 and calls.count("ctx") == 2


def test_layout_and_info_calls():
    r, n = rank_size()
    assert (hvd.rank(), hvd.size(), hvd.is_initialized()) == (r, n, True)
    assert 0 <= hvd.local_rank() < hvd.local_size() <= n
    assert hvd.cross_size() * hvd.local_size() == n  # one node in CI
    assert hvd.mpi_built() is True and hvd.mpi_enabled() is True
    assert hvd.mpi_threads_supported() is True
    for f in (hvd.gloo_built, hvd.gloo_enabled, hvd.ddl_built, hvd.ccl_built, hvd.rocm_built):
        assert f() is False
    assert isinstance(hvd.cuda_built(), bool) and type(hvd.nccl_built()) is int
    assert not hvd.nccl_built() or hvd.cuda_built()  # NCCL only comes with CUDA
    # As Horovod: NCCL's version code (>= 2700 for every NCCL hora builds with), else 0.
    assert hvd.nccl_built() == 0 or hvd.nccl_built() >= 2700
    # start_timeline into a missing directory: rank 0 (which writes the file) raises an OSError
    # naming it; the other ranks never look at the path (horovod_env_check.py records for real).
    if r == 0:
        with pytest.raises(OSError, match="nonexistent"):
            hvd.start_timeline("/nonexistent/timeline.json")
    else:
        hvd.start_timeline("/nonexistent/timeline.json")
    hvd.stop_timeline()  # nothing recording
    ps = hvd.add_process_set([0])  # every rank, ranks outside the set too
    assert ps.process_set_id > 0 and ps.size() == 1 and ps.included() == (r == 0)
    assert hvd.remove_process_set(ps) is True and ps.process_set_id is None


def inp(dtype, shape, r, seed, lo=-5, hi=9):
    """The same small integers on every rank for (seed, r): exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 1000 + r)
    lo = 0 if dtype == torch.uint8 else lo
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


def ref_reduce(xs, op):
    s = torch.stack([x.double() for x in xs])
    if op in (hvd.Sum, hvd.Average):
        v = s.sum(0)
        return v / len(xs) if op == hvd.Average else v
    return {hvd.Min: s.min(0).values, hvd.Max: s.max(0).values, hvd.Product: s.prod(0)}[op]


def close(got, want, dtype, what):
    assert isinstance(got, torch.Tensor) and got.dtype == dtype, what
    if dtype in INTS:
        assert torch.equal(got.double(), want.double()), what
    else:
        tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
        torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allreduce_forms_and_ops(dtype):
    r, n = rank_size()
    shape = (5, 3)
    for i, op in enumerate([hvd.Sum, hvd.Min, hvd.Max, hvd.Product]):
        xs = [inp(dtype, shape, p, 10 + i, -2, 3) for p in range(n)]
        want = ref_reduce(xs, op)
        x = xs[r].clone()
        close(hvd.allreduce(x, op=op), want, dtype, f"allreduce {op}")
        assert torch.equal(x, xs[r])  # input untouched
        h = hvd.allreduce_async(x, name=f"ar.{dtype}.{op}", op=op)
        close(hvd.synchronize(h), want, dtype, f"allreduce_async {op}")
        assert hvd.poll(h)
        y = x.clone()
        assert hvd.allreduce_(y, op=op) is y
        close(y, want, dtype, f"allreduce_ {op}")
        y = x.clone()
        assert hvd.synchronize(hvd.allreduce_async_(y, op=op)) is y
        close(y, want, dtype, f"allreduce_async_ {op}")
    if dtype.is_floating_point:  # Average (default), and through the deprecated average=
        xs = [inp(dtype, shape, p, 20) for p in range(n)]
        close(hvd.allreduce(xs[r]), ref_reduce(xs, hvd.Average), dtype, "default average")
        with pytest.warns(DeprecationWarning):
            close(hvd.allreduce(xs[r], average=False), ref_reduce(xs, hvd.Sum), dtype,
                  "average=False")
        with pytest.warns(DeprecationWarning):
            close(hvd.allreduce(xs[r], average=True), ref_reduce(xs, hvd.Average), dtype,
                  "average=True")


def test_bool_is_or_and_and_moves_exactly():
    r, n = rank_size()
    xs = [inp(torch.int64, (64,), p, 15, 0, 1).to(torch.bool) for p in range(n)]
    s = torch.stack(xs)
    for op, want in ((hvd.Sum, s.any(0)), (hvd.Max, s.any(0)), (hvd.Min, s.all(0)),
                     (hvd.Product, s.all(0))):
        got = hvd.allreduce(xs[r], op=op)
        assert got.dtype == torch.bool and torch.equal(got, want), op
        y = xs[r].clone()
        assert torch.equal(hvd.allreduce_(y, op=op), want)
    assert torch.equal(hvd.broadcast(xs[r], n - 1), xs[n - 1])
    assert torch.equal(hvd.alltoall(torch.cat([xs[r]] * n)), torch.cat(xs))
    with pytest.raises(ValueError, match="bool"):
        hvd.allreduce(xs[r])  # Average
    import numpy as np  # the NumPy path of hora: np.bool_ and np.int16 as well
    got = hora.allreduce(xs[r].numpy(), op=hora.Max)
    assert got.dtype == np.bool_ and got.tolist() == s.any(0).tolist()
    i16 = [inp(torch.int16, (9,), p, 16).numpy() for p in range(n)]
    got = hora.allreduce(i16[r], op=hora.Sum)
    assert got.dtype == np.int16 and got.tolist() == sum(i16).tolist()
    with pytest.raises(hora.InvalidArgumentError, match="HORA_BOOL"):
        hora.allreduce(xs[r].numpy(), op=hora.Average)


def test_average_and_op_together_is_a_value_error():
    with pytest.raises(ValueError, match="supersedes"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def test_scale_factors_float_and_integer():
    r, n = rank_size()
    xs = [inp(torch.float32, (7,), p, 30) for p in range(n)]
    got = hvd.allreduce(xs[r], op=hvd.Average, prescale_factor=3.0, postscale_factor=0.25)
    close(got, ref_reduce([3.0 * x for x in xs], hvd.Average) * 0.25, torch.float32, "float")
    # Integers as Horovod scales them: through double, truncating toward zero; Average is a
    # postscale of 1/size.
    for dtype in (torch.int32, torch.int64, torch.int8):
        xs = [inp(dtype, (9,), p, 31) for p in range(n)]
        pre = [(x.double() * 1.5).trunc() for x in xs]
        want = (torch.stack(pre).sum(0) * (0.5 / n)).trunc()
        got = hvd.allreduce(xs[r], op=hvd.Average, prescale_factor=1.5, postscale_factor=0.5)
        close(got, want, dtype, f"int scale {dtype}")
        y = xs[r].clone()
        hvd.allreduce_(y, op=hvd.Sum, postscale_factor=0.5)
        close(y, (torch.stack(xs).double().sum(0) * 0.5).trunc(), dtype, f"int_ {dtype}")
        got = hvd.allreduce(xs[r])  # Average: (sum * (1/size)) truncated
        close(got, (torch.stack(xs).double().sum(0) * (1.0 / n)).trunc(), dtype, "int avg")


def test_async_of_torch_is_torch_on_first_use():
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out = hora.allreduce_async(x, op=hora.Sum, name="plain.first").wait()
    assert isinstance(out, torch.Tensor) and out.dtype == x.dtype and out.shape == x.shape
    assert torch.equal(out, x * hvd.size())
    out = hvd.allreduce_async(x.to(torch.bfloat16), op=hvd.Sum).wait()
    assert out.dtype == torch.bfloat16 and out.device == x.device


def test_grouped_allreduce_mixed_dtypes_and_in_place():
    r, n = rank_size()
    dts = [torch.float32, torch.int64, torch.float64, torch.float32]
    shapes = [(3,), (2, 2), (0,), (1000,)]
    xs = [[inp(d, s, p, 40 + i) for p in range(n)] for i, (d, s) in enumerate(zip(dts, shapes))]
    mine = [x[r] for x in xs]
    outs = hvd.grouped_allreduce(mine, op=hvd.Sum, name="grp")
    for i, o in enumerate(outs):
        close(o, ref_reduce(xs[i], hvd.Sum), dts[i], f"grouped {i}")
    ys = [m.clone() for m in mine]
    res = hvd.synchronize(hvd.grouped_allreduce_async_(ys, op=hvd.Max))
    assert all(a is b for a, b in zip(res, ys))
    for i, y in enumerate(ys):
        close(y, ref_reduce(xs[i], hvd.Max), dts[i], f"grouped_ {i}")
    fl = [m for m in mine if m.dtype.is_floating_point]
    outs = hvd.grouped_allreduce(fl, compression=hvd.Compression.fp16)
    assert [o.dtype for o in outs] == [f.dtype for f in fl]
    for o, i in zip(outs, [0, 2, 3]):  # the average travels (and is rounded) as float16
        assert o.dtype == dts[i]
        torch.testing.assert_close(o.double(), ref_reduce(xs[i], hvd.Average), rtol=1e-3,
                                   atol=1e-3, msg=f"fp16 grouped {i}")
    ys = [m.clone() for m in fl]
    assert hvd.grouped_allreduce_(ys, average=None, op=hvd.Sum)[0] is ys[0]
    h = hvd.grouped_allreduce_async(fl, op=hvd.Sum, name="grp.async")
    for o, y in zip(hvd.synchronize(h), ys):
        assert torch.equal(o, y)


def test_compression_none_fp16_bf16():
    r, n = rank_size()
    xs = [inp(torch.float32, (17,), p, 50) / 4 for p in range(n)]
    want = ref_reduce(xs, hvd.Sum)
    for comp, tol in ((hvd.Compression.none, 1e-6), (hvd.Compression.fp16, 1e-3),
                      (hvd.Compression.bf16, 1e-2)):
        got = hvd.allreduce(xs[r], op=hvd.Sum, compression=comp)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    t, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.float64))
    assert t.dtype == torch.float16 and hvd.Compression.fp16.decompress(t, ctx).dtype == \
        torch.float64
    t, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.int32))
    assert t.dtype == torch.int32  # integers pass unchanged


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int64, torch.float16,
                                   torch.float32, torch.bool], ids=str)
def test_allgather_uneven_async_grouped(dtype):
    r, n = rank_size()
    xs = [inp(dtype, (p + 1, 2, 3), p, 60) for p in range(n)]
    want = torch.cat(xs)
    close(hvd.allgather(xs[r]), want, dtype, "allgather")
    h = hvd.allgather_async(xs[r], name=f"ag.{dtype}")
    close(hvd.synchronize(h), want, dtype, "allgather_async")
    ys = [inp(dtype, (2, 4), p, 61) for p in range(n)]  # even
    outs = hvd.grouped_allgather([xs[r], ys[r]], name=f"gag.{dtype}")
    close(outs[0], want, dtype, "grouped 0")
    close(outs[1], torch.cat(ys), dtype, "grouped 1")
    outs = hvd.synchronize(hvd.grouped_allgather_async([ys[r]]))
    close(outs[0], torch.cat(ys), dtype, "grouped async")


@pytest.mark.parametrize("kind", ["allgather", "reducescatter", "allreduce"])
def test_grouped_calls_whose_ranks_group_other_tensors_raise_on_every_rank(kind):
    """The last rank's grouped call has a tensor more than the others': every rank gets a
    MismatchError naming the group within seconds (the members only the last rank submitted
    included; they used to wait forever, a hang with stall warnings), and the same names then
    work again with the values of one process. A member refused before submission (a 0-d
    tensor) leaves nothing behind on any rank."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    fn = {"allgather": hvd.grouped_allgather, "reducescatter": hvd.grouped_reducescatter,
          "allreduce": hvd.grouped_allreduce}[kind]
    kw = {} if kind == "allgather" else {"op": hvd.Sum}
    xs = [torch.full((2 * n, 3), float(r + 1)) for _ in range(3 if r == n - 1 else 2)]
    t0 = time.monotonic()
    with pytest.raises(hvd.MismatchError, match="the grouped call it belongs to"):
        fn(xs, name=f"gmis.{kind}", **kw)
    took = time.monotonic() - t0
    if kind != "allreduce":
        with pytest.raises(ValueError, match=r"tensors\[1\]"):
            fn([xs[0], torch.tensor(1.0)], name=f"gmis.{kind}", **kw)
    outs = fn(xs[:2], name=f"gmis.{kind}", **kw)
    total = n * (n + 1) / 2
    for o in outs:
        if kind == "allgather":
            want = torch.cat([torch.full((2 * n, 3), float(p + 1)) for p in range(n)])
        elif kind == "reducescatter":
            want = torch.full((2, 3), total)
        else:
            want = torch.full((2 * n, 3), total)
        torch.testing.assert_close(o, want)
    assert took < 5.0, took


def test_allgather_and_broadcast_objects():
    r, n = rank_size()
    objs = hvd.allgather_object({"rank": r, "t": torch.full((r + 1,), r)})
    assert [o["rank"] for o in objs] == list(range(n))
    assert all(o["t"].tolist() == [p] * (p + 1) for p, o in enumerate(objs))
    obj = hvd.broadcast_object({"from": r, "l": list(range(r + 3))}, root_rank=n - 1)
    assert obj == {"from": n - 1, "l": list(range(n + 2))}


def test_objects_that_only_cloudpickle_pickles():
    """Horovod pickles with cloudpickle: a lambda, a closure and a class defined in a function."""
    pytest.importorskip("cloudpickle")
    r, n = rank_size()

    class Local:
        def __init__(self, k):
            self.f = lambda x: x * k
            self.t = torch.full((2,), float(k))

    got = hvd.broadcast_object(Local(10 + r), root_rank=n - 1)
    assert got.f(2) == 2 * (10 + n - 1) and got.t.tolist() == [10.0 + n - 1] * 2
    fs = hvd.allgather_object(lambda x: x + r)
    assert [f(100) for f in fs] == [100 + q for q in range(n)]


def test_objects_that_do_not_pickle_raise_on_every_rank():
    """An object that does not pickle (a lock) raises pickle's error where it was passed and a
    ValueError naming that rank everywhere else, instead of leaving them waiting for its bytes;
    the names work again afterwards."""
    import threading
    r, n = rank_size()
    root = n - 1
    if r == root:
        with pytest.raises(TypeError, match="pickle"):
            hvd.broadcast_object(threading.Lock(), root_rank=root)
    else:
        with pytest.raises(ValueError, match=f"root rank {root} could not pickle"):
            hvd.broadcast_object(None, root_rank=root)
    if r == 1:
        with pytest.raises(TypeError, match="pickle"):
            hvd.allgather_object(threading.Lock())
    else:
        with pytest.raises(ValueError, match=r"rank\(s\) \[1\] could not pickle"):
            hvd.allgather_object(r)
    assert hvd.broadcast_object(r * 3, root_rank=root) == root * 3
    assert hvd.allgather_object(r) == list(range(n))


def test_broadcast_forms():
    r, n = rank_size()
    for root in range(n):
        x = torch.full((3, 2), float(r + 10 * root))
        want = torch.full((3, 2), float(root + 10 * root))
        assert torch.equal(hvd.broadcast(x, root), want)
        assert torch.equal(x, torch.full((3, 2), float(r + 10 * root)))  # input untouched
        assert torch.equal(hvd.synchronize(hvd.broadcast_async(x, root, name=f"b{root}")),
                           want)
        y = x.clone()
        assert hvd.broadcast_(y, root_rank=root) is y and torch.equal(y, want)
        y = x.clone()
        assert hvd.synchronize(hvd.broadcast_async_(y, root)) is y and torch.equal(y, want)


def test_alltoall_even_and_splits():
    r, n = rank_size()
    # Without splits, even: block p of rank q's input goes to rank p.
    xs = [torch.arange(2 * n * 3, dtype=torch.float32).reshape(2 * n, 3) + 100 * p
          for p in range(n)]
    got = hvd.alltoall(xs[r])
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, torch.cat([xs[p][2 * r:2 * r + 2] for p in range(n)]))
    out, rs = hvd.synchronize(hvd.alltoall_async(xs[r]))  # the handle yields both
    assert torch.equal(out, got) and rs.dtype == torch.int32 and rs.tolist() == [2] * n
    # With splits: rank p sends (p + q) % 3 rows to rank q; returns (output, received_splits).
    S = [[(p + q) % 3 for q in range(n)] for p in range(n)]
    xs = [torch.arange(sum(S[p]) * 2, dtype=torch.float64).reshape(-1, 2) + 1000 * p
          for p in range(n)]

    def block(p, q):
        off = sum(S[p][:q])
        return xs[p][off:off + S[p][q]]
    out, rs = hvd.alltoall(xs[r], splits=S[r])
    assert rs.tolist() == [S[p][r] for p in range(n)] and rs.dtype == torch.int32
    assert torch.equal(out, torch.cat([block(p, r) for p in range(n)]))
    out2, rs2 = hvd.alltoall(xs[r], splits=torch.tensor(S[r], dtype=torch.int32), name="a2a")
    assert torch.equal(out2, out) and torch.equal(rs2, rs)
    # Rows past sum(splits) are not sent (Horovod: only a sum above the first dimension errs).
    extra = torch.cat([xs[r], torch.full((2, 2), -1.0, dtype=torch.float64)])
    out3, rs3 = hvd.alltoall(extra, splits=S[r])
    assert torch.equal(out3, out) and torch.equal(rs3, rs)
    with pytest.raises(ValueError, match="number of workers"):
        hvd.alltoall(xs[r], splits=[1] * (n + 1))
    with pytest.raises(ValueError, match="greater than the first dimension"):
        hvd.alltoall(xs[r], splits=[S[r][0] + 1] + S[r][1:])
    # A float splits tensor is refused whatever its values (Horovod 0.28 reads splits as int32;
    # before, zeros here ran an empty alltoall); int64 is taken like int32.
    with pytest.raises(ValueError, match="splits is a torch.float32 tensor; expected int32"):
        hvd.alltoall(xs[r], splits=torch.zeros(n, dtype=torch.float32))
    out4, rs4 = hvd.alltoall(xs[r], splits=torch.tensor(S[r], dtype=torch.int64))
    assert torch.equal(out4, out) and torch.equal(rs4, rs)


def test_alltoall_uneven_without_splits_is_a_value_error_on_every_rank():
    """Horovod 0.28: alltoall without splits of a first dimension that the number of ranks does
    not divide raises ValueError (at the call); a peer whose own tensor divides evenly raises
    too (at synchronize) instead of waiting, and the ranks stay in step."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    for blocking in (True, False):
        with pytest.raises(ValueError, match="not an even multiple of the number of workers"):
            if blocking:
                hvd.alltoall(torch.ones(n + 1, 2))
            else:
                hvd.alltoall_async(torch.ones(n + 1, 2), name="uneven")
    # Only rank 0's tensor is uneven: it raises at the call, every other rank at synchronize.
    x = torch.ones(n + 1 if r == 0 else 2 * n)
    if r == 0:
        with pytest.raises(ValueError, match="not an even multiple"):
            hvd.alltoall_async(x, name="uneven.0")
    else:
        h = hvd.alltoall_async(x, name="uneven.0")
        with pytest.raises(ValueError, match=r"failed its own argument checks on rank\(s\) 0,"):
            hvd.synchronize(h)
    # The next alltoall runs: no rank was left waiting in the refused one.
    xs = [torch.arange(2 * n, dtype=torch.int32) + 100 * p for p in range(n)]
    got = hvd.alltoall(xs[r])
    assert torch.equal(got, torch.cat([xs[p][2 * r:2 * r + 2] for p in range(n)]))


@pytest.mark.parametrize("rows_extra", [0, 1])
def test_reducescatter_even_uneven_scaled_grouped(rows_extra):
    r, n = rank_size()
    rows = 2 * n + rows_extra
    sp = [rows // n + (1 if q < rows % n else 0) for q in range(n)]
    start = sum(sp[:r])
    xs = [inp(torch.float64, (rows, 3), p, 70) for p in range(n)]
    for op in (hvd.Sum, hvd.Average, hvd.Max):
        want = ref_reduce(xs, op)[start:start + sp[r]]
        close(hvd.reducescatter(xs[r], op=op), want, torch.float64, f"rs {op}")
    got = hvd.reducescatter(xs[r], op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)
    close(got, ref_reduce(xs, hvd.Average)[start:start + sp[r]], torch.float64, "scaled")
    ints = [inp(torch.int32, (rows,), p, 71) for p in range(n)]
    got = hvd.synchronize(hvd.reducescatter_async(ints[r], name=f"rsi.{rows}"))
    want = (torch.stack(ints).double().sum(0) * (1.0 / n)).trunc()[start:start + sp[r]]
    close(got, want, torch.int32, "int average")
    outs = hvd.grouped_reducescatter([xs[r], ints[r]], op=hvd.Sum)
    close(outs[0], ref_reduce(xs, hvd.Sum)[start:start + sp[r]], torch.float64, "g0")
    close(outs[1], ref_reduce(ints, hvd.Sum)[start:start + sp[r]], torch.int32, "g1")


def test_autograd_of_collectives():
    r, n = rank_size()
    x = torch.full((4, 2), float(r + 1), requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum)
    (y * (r + 1)).sum().backward()
    # d/dx_r of sum_q (q+1) * sum_p x_p = sum_q (q+1)
    assert torch.equal(x.grad, torch.full((4, 2), float(sum(range(1, n + 1)))))
    x = torch.ones(r + 1, 2, requires_grad=True)
    hvd.allgather(x).sum().backward()  # Horovod: allreduce(Average) of grad, own slice
    assert torch.equal(x.grad, torch.ones(r + 1, 2))
    x = torch.ones(3, requires_grad=True)
    (hvd.broadcast(x, 0) * (r + 1)).sum().backward()
    want = sum(range(1, n + 1)) / n if r == 0 else 0.0  # Horovod: averaged, root only
    assert torch.allclose(x.grad, torch.full((3,), want))
    x = torch.ones(2 * n, 2, requires_grad=True)
    (hvd.alltoall(x) * (r + 1)).sum().backward()
    assert torch.equal(x.grad, torch.cat([torch.full((2, 2), float(p + 1)) for p in range(n)]))
    # Horovod 0.28's HorovodReducescatter.backward: the incoming gradient times the set size for
    # Sum (not divided for Average), times prescale and postscale, then allgathered.
    x = torch.ones(n, 2, requires_grad=True)
    (hvd.reducescatter(x, op=hvd.Sum) * (r + 1)).sum().backward()
    assert torch.equal(x.grad, torch.cat([torch.full((1, 2), float(n * (p + 1))) for p in range(n)]))
    x = torch.ones(n, 2, requires_grad=True)
    (hvd.reducescatter(x, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5)
     * (r + 1)).sum().backward()
    assert torch.equal(x.grad, torch.cat([torch.full((1, 2), 1.5 * (p + 1)) for p in range(n)]))


def test_autograd_of_grouped_allgather_and_reducescatter():
    """Horovod 0.28's HorovodGroupedAllgather and HorovodGroupedReducescatter: each member's
    gradient as for the single call."""
    r, n = rank_size()
    a = torch.ones(r + 1, 2, requires_grad=True)
    b = torch.ones(2 * r + 1, requires_grad=True)
    ga, gb = hvd.grouped_allgather([a, b])
    assert ga.shape == (sum(p + 1 for p in range(n)), 2)
    assert gb.shape == (sum(2 * p + 1 for p in range(n)),)
    ((ga * (r + 1)).sum() + (gb * 2 * (r + 1)).sum()).backward()
    mean = sum(range(1, n + 1)) / n  # the average over ranks of the incoming (r + 1)
    assert torch.allclose(a.grad, torch.full((r + 1, 2), mean))
    assert torch.allclose(b.grad, torch.full((2 * r + 1,), 2 * mean))
    a = torch.ones(2 * n, 3, requires_grad=True)
    b = torch.ones(n, requires_grad=True)
    ra, rb = hvd.grouped_reducescatter([a, b], op=hvd.Sum)
    assert ra.shape == (2, 3) and rb.shape == (1,)
    ((ra * (r + 1)).sum() + (rb * 10 * (r + 1)).sum()).backward()
    assert torch.equal(a.grad, torch.cat([torch.full((2, 3), float(n * (p + 1)))
                                          for p in range(n)]))
    assert torch.equal(b.grad, torch.tensor([10.0 * n * (p + 1) for p in range(n)]))
    a = torch.ones(2 * n, requires_grad=True)
    (ra,) = hvd.grouped_reducescatter([a], op=hvd.Average, postscale_factor=2.0)
    (ra * (r + 1)).sum().backward()
    assert torch.equal(a.grad, torch.cat([torch.full((2,), 2.0 * (p + 1)) for p in range(n)]))


def test_reducescatter_shapes_that_differ_with_one_count_are_an_error_on_every_rank():
    """Horovod's test_horovod_reducescatter_error: [17, 1311] on rank 0 against [17, 23, 57]
    elsewhere (the same number of elements) is an error on every rank, not a result."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = torch.ones((17, 23 * 57) if r == 0 else (17, 23, 57))
    with pytest.raises(hvd.MismatchError, match="shape") as e:
        hvd.reducescatter(x, name="rs.shape")
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, ValueError)
    assert "this rank's tensor has shape " + str(tuple(x.shape)) in str(e.value)
    with pytest.raises(hvd.MismatchError, match="shape"):
        hvd.grouped_reducescatter([torch.ones(2 * n), x], name="rs.gshape")
    # Scale factors that differ between ranks (Horovod: "Mismatched prescale and/or postscale
    # factors"): floats in the engine's own fields, every rank's value named; integers (which
    # hora.torch scales itself) in the shape fingerprint, this rank's value named.
    y = torch.ones(2 * n)
    for field in ("prescale", "postscale"):
        with pytest.raises(hvd.MismatchError, match=f"disagree on {field}") as e:
            hvd.reducescatter(y, name=f"rs.{field}.f", **{f"{field}_factor": 1.0 + r})
        assert all(f"{1 + q:g} on rank {q}" in str(e.value) for q in range(n)), str(e.value)
    y = torch.ones(2 * n, dtype=torch.int32)
    with pytest.raises(hvd.MismatchError, match=f"prescale_factor {1 + r:g}"):
        hvd.reducescatter(y, name="rs.pre.i", prescale_factor=1.0 + r)
    with pytest.raises(hvd.MismatchError, match=f"postscale_factor {1 + r:g}"):
        hvd.reducescatter(y, name="rs.post.i", postscale_factor=1.0 + r)
    # and on the op, which becomes a Sum around hora.torch's own scaling for integers
    with pytest.raises(hvd.MismatchError, match="op Average" if r == 0 else "op Sum"):
        hvd.reducescatter(y, name="rs.op.i", op=hvd.Average if r == 0 else hvd.Sum)
    y = torch.ones(2 * n, 3)  # the next call is unaffected
    assert torch.equal(hvd.reducescatter(y, op=hvd.Sum, name="rs.after"), torch.full((2, 3), float(n)))


def test_same_name_twice_in_flight_is_a_value_error_on_every_rank():
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = torch.ones(4)
    errors = 0
    # Rank 0 holds "dup1" pending (the others submit it only after the barrier); the others
    # hold "dup2" pending (rank 0 submits it only after the second barrier).
    if r == 0:
        h1 = hvd.allreduce_async(x, name="dup1")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async(x, name="dup1")
        errors += 1
    hvd.barrier()
    if r != 0:
        h1 = hvd.allreduce_async(x, name="dup1")
        h2 = hvd.allreduce_async(x, name="dup2")
        with pytest.raises(ValueError, match="already in flight"):
            hvd.allreduce_async_(x.clone(), name="dup2")
        errors += 1
    hvd.barrier()
    if r == 0:
        h2 = hvd.allreduce_async(x, name="dup2")
    assert torch.equal(hvd.synchronize(h1), x) and torch.equal(hvd.synchronize(h2), x)
    # Once completed, the name may be used again.
    assert torch.equal(hvd.allreduce(x, name="dup1"), x)
    assert errors == 1


def test_one_name_on_different_collectives_at_once():
    """Horovod names a request "<op>.<name>" (GetOpName): an allreduce, an allgather and a
    broadcast may carry the same name at the same time; a second allreduce of it may not."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = torch.full((3,), float(r + 1))

    def submit():
        return (hvd.allreduce_async(x, name="shared", op=hvd.Sum),
                hvd.allgather_async(x, name="shared"), hvd.broadcast_async(x, 0, name="shared"))
    # Rank 0 submits first; the others only after the barrier, so its requests are still
    # pending when it submits the name a second time.
    if r == 0:
        ha, hg, hb = submit()
        with pytest.raises(ValueError, match="'shared' is already in flight"):
            hvd.allreduce_async(x, name="shared")
    hvd.barrier()
    if r != 0:
        ha, hg, hb = submit()
    assert hvd.synchronize(ha).tolist() == [n * (n + 1) / 2] * 3
    assert hvd.synchronize(hg).tolist() == [float(k + 1) for k in range(n) for _ in range(3)]
    assert hvd.synchronize(hb).tolist() == [1.0] * 3


def test_dropped_handle_keeps_its_name_until_done_on_every_rank():
    """Horovod's duplicate-name tests drop the first handle (fire-and-forget): its name stays
    claimed until the request completes, for allreduce, allgather and broadcast alike."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = torch.ones(6)
    submit = {"allreduce": lambda nm: hvd.allreduce_async(x, name=nm),
              "allgather": lambda nm: hvd.allgather_async(x, name=nm),
              "broadcast": lambda nm: hvd.broadcast_async(x, 0, name=nm)}
    errors = 0
    for kind, f in submit.items():
        nm = f"dropped.dup.{kind}"
        if r == 0:
            f(nm)  # dropped at once, pending until the other ranks submit after the barrier
            try:
                f(nm)
            except ValueError as e:
                errors += "already in flight" in str(e)
        hvd.barrier()
        if r != 0:
            hvd.synchronize(f(nm))  # completes rank 0's dropped request
    total = hvd.allreduce(torch.tensor([errors]), op=hvd.Sum, name="dropped.dup.count")
    assert int(total[0]) == len(submit)


@pytest.mark.parametrize("op", ["Average", "Sum"])
def test_sparse_allreduce_async_matches_the_dense_reference(op):
    r, n = rank_size()

    def dense(q):
        t = torch.rand(12, 5, generator=torch.Generator().manual_seed(70 + q))
        t[t < 0.7] = 0
        return t
    handle = hvd.sparse_allreduce_async(dense(r).to_sparse(), name=f"sparse.{op}",
                                        op=getattr(hvd, op))
    out = handle()
    ref = sum(dense(q) for q in range(n)) / (n if op == "Average" else 1)
    assert out.is_sparse and out.shape == (12, 5)
    torch.testing.assert_close(out.to_dense(), ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="sparse"):
        hvd.sparse_allreduce_async(dense(r), name="sparse.bad", op=hvd.Sum)


def test_shape_mismatch_with_equal_counts_raises_on_every_rank():
    # 12 elements on every rank, shaped (3, 4) on the last rank and (4, 3) on the others.
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    x = torch.full((3, 4) if r == n - 1 else (4, 3), float(r + 1))
    with pytest.raises(hora.MismatchError, match="tensor 'allreduce.w.grad'.*shape") as e:
        hvd.allreduce(x, name="w.grad")
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="shape"):
        hvd.broadcast_(x.clone(), root_rank=0, name="w.bcast")
    y = hvd.allreduce(torch.full((4, 3), float(r + 1)), name="w.grad", op=hvd.Sum)
    assert torch.equal(y, torch.full((4, 3), float(n * (n + 1) // 2)))


def test_grouped_allreduce_members_whose_shapes_differ_raise_on_every_rank():
    """Horovod checks every member of a grouped allreduce like a single tensor: a member shaped
    (3, 4) on the last rank and (4, 3) elsewhere is a MismatchError on every rank (it was summed
    as if the shapes agreed), naming this rank's member shapes; the next call is unaffected."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    xs = [torch.ones(5), torch.full((3, 4) if r == n - 1 else (4, 3), float(r + 1))]
    with pytest.raises(hora.MismatchError, match="disagree on shape") as e:
        hvd.grouped_allreduce(xs, name="gshape", op=hvd.Sum)
    assert f"[1] {tuple(xs[1].shape)}" in str(e.value)
    out = hvd.grouped_allreduce([torch.ones(5), torch.ones(4, 3)], name="gshape", op=hvd.Sum)
    assert all(torch.equal(o, torch.full_like(o, float(n))) for o in out)


@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
def test_integer_allreduce_op_and_scale_factors_that_differ_raise_on_every_rank(grouped):
    """hora.torch scales integer tensors itself (Horovod's way, through double) around a plain
    Sum, so the engine cannot see their op and factors: ranks passing Average and Sum, or other
    factors, got silently different results (rank 0 prescale 1, rank 1 prescale 2: 10 + 20 on
    both). Now a MismatchError on every rank naming this rank's values (Horovod: "Mismatched
    prescale and/or postscale factors"); the next call is unaffected."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    t = torch.full((4,), 10, dtype=torch.int32)

    def call(name, **kw):
        if grouped:
            return hvd.grouped_allreduce([t, t], name=name, **kw)[0]
        return hvd.allreduce(t, name=name, **kw)
    cases = [("op", dict(op=hvd.Average if r == 0 else hvd.Sum), "op Average" if r == 0 else "op Sum"),
             ("pre", dict(op=hvd.Sum, prescale_factor=1.0 + r), f"prescale_factor {1 + r:g}"),
             ("post", dict(op=hvd.Sum, postscale_factor=1.0 + r), f"postscale_factor {1 + r:g}")]
    for tag, kw, mine in cases:
        with pytest.raises(hora.MismatchError, match="disagree on shape") as e:
            call(f"int.{tag}", **kw)
        assert "also covers the op and the scale factors" in str(e.value) and mine in str(e.value)
    # agreeing ranks: Horovod's integer scaling, through double, truncated
    got = call("int.ok", op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.equal(got, torch.full((4,), 3 * 5 * n, dtype=torch.int32))


def test_errors_are_horovods_classes_on_every_rank():
    r, n = rank_size()
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert issubclass(hora.RemoteError, hvd.HorovodInternalError)
    assert issubclass(hora.MismatchError, hvd.HorovodInternalError)
    assert issubclass(hora.InvalidArgumentError, ValueError)
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce(torch.ones(4, 4).t())
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), op=17)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(torch.ones(2), process_set=hvd.ProcessSet([0]))
    if n == 1:
        return
    with pytest.raises(hvd.HorovodInternalError):  # shapes differ between ranks
        hvd.allreduce(torch.ones(r + 1), name="bad.shape")
    with pytest.raises(hvd.HorovodInternalError):  # roots differ
        hvd.broadcast(torch.ones(2), root_rank=r, name="bad.root")
    with pytest.raises(hvd.HorovodInternalError, match="trailing shape"):
        hvd.allgather(torch.ones(2, r + 1), name="bad.gather")
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def test_dropped_handle_never_blocks():
    r, n = rank_size()
    for k in range(n):
        if r == k:  # pending until the other ranks submit it after the barrier
            h = hvd.allreduce_async(torch.ones(1000), op=hvd.Sum, name=f"dropped.{k}")
            h2 = hora.allreduce_async(torch.ones(10), op=hora.Sum, name=f"dropped.raw.{k}")
            t0 = time.monotonic()
            del h, h2  # refcount zero: the finalizers run here and must return at once
            dt = time.monotonic() - t0
            gc.collect()
            assert dt < 0.5, f"dropping pending handles took {dt:.3f} s"
        hvd.barrier()
        if r != k:
            hvd.synchronize(hvd.allreduce_async(torch.ones(1000), op=hvd.Sum,
                                                name=f"dropped.{k}"))
            hora.allreduce_async(torch.ones(10), op=hora.Sum, name=f"dropped.raw.{k}").wait()
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))


def test_unnamed_collectives_from_two_threads_warn(monkeypatch):
    """Unnamed requests are numbered in arrival order; from two threads at once that order can
    differ between ranks and pair one thread's tensor with another's. hora warns (once per
    process) where it sees two threads' unnamed requests in flight. Here rank 0's first request
    stays in flight (the other ranks submit theirs only after a named broadcast that rank 0
    makes once its second thread has submitted): rank 0 warns; the results are right because
    each rank's order is the same here."""
    import threading
    from hora import _torch_ops
    monkeypatch.setattr(_torch_ops, "_unnamed_warned", [False])
    r, n = rank_size()
    out = {}

    def second():
        out["b"] = hvd.allreduce(torch.full((2,), 10.0 * (r + 1)), op=hvd.Sum)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        go = torch.zeros(1)
        if r != 0:
            hvd.broadcast_(go, 0, name="unnamed.threads.go")
        h = hvd.allreduce_async(torch.full((4,), float(r + 1)), op=hvd.Sum)
        t = threading.Thread(target=second)
        t.start()
        if r == 0:
            deadline = time.monotonic() + 30
            while not _torch_ops._unnamed_warned[0] and time.monotonic() < deadline:
                time.sleep(0.01)
            hvd.broadcast_(go, 0, name="unnamed.threads.go")
        t.join()
        a = hvd.synchronize(h)
    ours = [w for w in seen if issubclass(w.category, RuntimeWarning) and "two threads" in
            str(w.message)]
    total = n * (n + 1) / 2
    assert a.tolist() == [total] * 4 and out["b"].tolist() == [10 * total] * 2
    if r == 0:
        assert len(ours) == 1 and "Give them names" in str(ours[0].message)


def test_join_returns_the_last_rank():
    r, n = rank_size()
    if r == n - 1:
        time.sleep(0.2)
    assert hvd.join() == n - 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hvd.join(device=-1) in range(n)


def test_unnamed_requests_are_numbered_per_process_set():
    """Rank 0 makes three unnamed allreduces on its own set, the others one on theirs (Horovod's
    test_horovod_broadcast_grad_process_sets at 3 ranks: even and odd sets of different sizes);
    the next unnamed calls on the global set still match (with one number for all sets they
    waited for each other for ever), and so do the sets' own."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    a = hvd.add_process_set([0])
    b = hvd.add_process_set(list(range(1, n)))
    try:
        mine = a if r == 0 else b
        for _ in range(3 if r == 0 else 1):
            got = hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=mine)
            assert got.tolist() == [float(mine.size())] * 2
        got = hvd.allreduce(torch.full((2,), float(r)), op=hvd.Sum)
        assert got.tolist() == [float(sum(range(n)))] * 2
        assert hvd.broadcast(torch.tensor([r]), n - 1).tolist() == [n - 1]
        got = hvd.allgather(torch.tensor([r]), process_set=mine)
        assert got.tolist() == ([0] if r == 0 else list(range(1, n)))
    finally:
        hvd.remove_process_set(a)
        hvd.remove_process_set(b)


def test_unnamed_requests_match_again_after_join():
    """Unnamed requests are numbered per process ("allreduce.noname.<n>", as Horovod names
    them). The joined rank does not make the unnamed allreduces the others make meanwhile, so
    its numbers fall behind; join() brings every rank to the same number, and the next
    unnamed calls match instead of waiting for each other for ever. Also Horovod's
    test_horovod_join_allgather at 3 ranks: a refused allgather, then join, by each rank in turn."""
    r, n = rank_size()
    if n == 1:
        pytest.skip("needs two ranks")
    if r != n - 1:  # the last rank has run out of data; the others take two more steps
        for k in range(2):
            got = hvd.allreduce(torch.ones(3), op=hvd.Sum)
            assert got.tolist() == [float(n - 1)] * 3  # the joined rank adds zeros
            hvd.allreduce_(torch.ones(2), op=hvd.Sum)
    assert hvd.join() in range(n - 1)  # the last rank joined first
    got = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum)
    assert got.tolist() == [float(sum(range(n)))] * 3
    assert hvd.allgather(torch.tensor([r])).tolist() == list(range(n))
    for first in range(n):
        if r != first:
            with pytest.raises(ValueError, match="have joined"):
                hvd.allgather(torch.ones(2, 2))
        assert hvd.join() != first
        assert hvd.allgather_object(r) == list(range(n))


@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 5, 3)], ids=["1d", "2d"])
def test_sync_batch_norm_matches_one_process_on_the_whole_batch(shape):
    r, n = rank_size()
    g = torch.Generator().manual_seed(77)
    xs = [torch.randn((shape[0] + p,) + shape[1:], generator=g, dtype=torch.float64) * 3 + 1
          for p in range(n)]  # uneven local batches
    cs = [torch.randn((shape[0] + p,) + shape[1:], generator=g, dtype=torch.float64)
          for p in range(n)]
    torch.manual_seed(1)
    ref = torch.nn.BatchNorm1d(4) if len(shape) == 2 else torch.nn.BatchNorm2d(4)
    ref = ref.double()
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-1, 1)
    bn = hvd.SyncBatchNorm(4).double()
    bn.load_state_dict(ref.state_dict())
    x = xs[r].clone().requires_grad_(True)
    y = bn(x)
    (y * cs[r]).sum().backward()
    xa = torch.cat(xs).requires_grad_(True)
    ya = ref(xa)
    (ya * torch.cat(cs)).sum().backward()
    start = sum(x.shape[0] for x in xs[:r])
    rows = slice(start, start + xs[r].shape[0])
    torch.testing.assert_close(y, ya[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xa.grad[rows], rtol=1e-5, atol=1e-5)
    gw = hvd.allreduce(torch.cat([bn.weight.grad, bn.bias.grad]), op=hvd.Sum)
    torch.testing.assert_close(gw, torch.cat([ref.weight.grad, ref.bias.grad]), rtol=1e-5,
                               atol=1e-5)
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=1e-5, atol=1e-5)
    bn.eval()
    ref.eval()
    torch.testing.assert_close(bn(xs[r]), ref(xs[r]), rtol=1e-5, atol=1e-5)
