"""hora.torch on the tensors a Horovod GPU program passes: the same checks on CPU tensors and on
CUDA tensors of this rank's GPU. Every collective keeps its input's device and dtype and gives the
single-process reference's values; DistributedOptimizer on a model moved with `.cuda()` reaches
the weights of one process on the whole batch; SyncBatchNorm matches BatchNorm on the
concatenated batch.

The "cuda" cases skip where torch sees no GPU or libhora was built without CUDA (CI); the device
check's python step runs them on a lent GPU (tests/gpu/device-check.sh), at 1 rank (NCCL) and at
2 ranks sharing the GPU (the MPI-staged path, since NCCL refuses two ranks on one GPU)."""
import pytest

import hora
from conftest import rank_size

torch = pytest.importorskip("torch")
if not hasattr(hora, "allreduce_async_"):
    pytest.skip("libhora was built without the async engine", allow_module_level=True)
import hora.torch as hvd  # noqa: E402


def _cuda_reason():
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if not hvd.cuda_built():
        return "libhora was built without CUDA"
    return None


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(_cuda_reason() is not None,
                                                               reason=str(_cuda_reason())))]


def device_of(dev):
    """This rank's device, as a Horovod program picks it (torch.cuda.set_device(local_rank)): the
    GPU hora chose at init too (HORA_DEVICE, else local rank modulo the visible GPUs)."""
    if dev == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def rank_data(r, shape, dtype, seed=0):
    """Rank r's input, the same on every rank that asks for it (the references need all of them)."""
    g = torch.Generator().manual_seed(1000 * seed + r)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    return torch.randint(-20, 20, shape, generator=g, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32, torch.int64])
def test_allreduce_keeps_device_and_dtype(dev, dtype):
    r, n = rank_size()
    d = device_of(dev)
    xs = [rank_data(i, (3, 257), dtype, seed=1) for i in range(n)]
    x = xs[r].to(d)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    wide = torch.stack([v.to(torch.float64) for v in xs])
    for op, ref in ((hvd.Sum, wide.sum(0)), (hvd.Min, wide.min(0).values),
                    (hvd.Max, wide.max(0).values)):
        got = hvd.allreduce(x, op=op, name=f"cuda.ar.{dev}.{dtype}.{op}")
        assert got.device == d and got.dtype == dtype and got.shape == x.shape
        torch.testing.assert_close(got.cpu().to(torch.float64), ref, rtol=tol, atol=tol * n)
    if dtype.is_floating_point:
        got = hvd.allreduce(x, name=f"cuda.avg.{dev}.{dtype}")  # Horovod's default op: Average
        torch.testing.assert_close(got.cpu().to(torch.float64), wide.mean(0), rtol=tol, atol=tol)
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                            name=f"cuda.scale.{dev}.{dtype}")
        torch.testing.assert_close(got.cpu().to(torch.float64), wide.sum(0) * 1.5,
                                   rtol=tol, atol=tol * n * 2)
    # In place: the same memory, on the device.
    y = x.clone()
    ptr = y.data_ptr()
    out = hvd.allreduce_(y, op=hvd.Sum, name=f"cuda.inplace.{dev}.{dtype}")
    assert out is y and y.data_ptr() == ptr and y.device == d
    torch.testing.assert_close(y.cpu().to(torch.float64), wide.sum(0), rtol=tol, atol=tol * n)


@pytest.mark.parametrize("dev", DEVICES)
def test_async_grouped_and_compression(dev):
    r, n = rank_size()
    d = device_of(dev)
    shapes = [(5,), (64, 3), (1000,)]
    xs = [[rank_data(i, s, torch.float32, seed=10 + k) for k, s in enumerate(shapes)]
          for i in range(n)]
    mine = [t.to(d) for t in xs[r]]
    refs = [torch.stack([xs[i][k] for i in range(n)]).to(torch.float64).mean(0)
            for k in range(len(shapes))]
    handles = [hvd.allreduce_async(t, name=f"cuda.async.{dev}.{k}") for k, t in enumerate(mine)]
    outs = [hvd.synchronize(h) for h in handles]
    grouped = hvd.grouped_allreduce(mine, name=f"cuda.grouped.{dev}")
    inplace = [t.clone() for t in mine]
    hvd.synchronize(hvd.grouped_allreduce_async_(inplace, name=f"cuda.grouped_.{dev}"))
    fp16 = hvd.allreduce(mine[2], compression=hvd.Compression.fp16, name=f"cuda.fp16.{dev}")
    for k in range(len(shapes)):
        for got in (outs[k], grouped[k], inplace[k]):
            assert got.device == d and got.dtype == torch.float32
            torch.testing.assert_close(got.cpu().to(torch.float64), refs[k], rtol=1e-6, atol=1e-6)
    assert fp16.device == d and fp16.dtype == torch.float32
    torch.testing.assert_close(fp16.cpu().to(torch.float64), refs[2], rtol=2e-3, atol=2e-3)


def _late(t, src):
    """On CUDA: t becomes src only after the GPU has spun for about 0.2 s on torch's current
    stream (torch.cuda._sleep), so an async call submitted right after reads NaN unless it waits
    for the stream's work (Horovod's ready event; hora_set_call_ready). On the CPU: at once."""
    t.fill_(float("nan"))
    if t.is_cuda:
        torch.cuda._sleep(int(4e8))
    t.copy_(src)
    return t


@pytest.mark.parametrize("dev", DEVICES)
def test_async_waits_for_the_stream_that_writes_its_tensors(dev):
    r, n = rank_size()
    d = device_of(dev)
    xs = [rank_data(i, (4099,), torch.float32, seed=40) for i in range(n)]
    ys = [rank_data(i, (300, 7), torch.float32, seed=41) for i in range(n)]
    ref_x = torch.stack(xs).to(torch.float64).sum(0)
    ref_y = torch.stack(ys).to(torch.float64).sum(0)
    src_x, src_y = xs[r].to(d), ys[r].to(d)
    if d.type == "cuda":
        torch.cuda.synchronize()
    x = torch.empty_like(src_x)
    y = torch.empty_like(src_y)
    out = hvd.synchronize(hvd.allreduce_async(_late(x, src_x), op=hvd.Sum,
                                              name=f"ready.out.{dev}"))
    torch.testing.assert_close(out.cpu().to(torch.float64), ref_x, rtol=1e-6, atol=1e-5)
    hvd.synchronize(hvd.allreduce_async_(_late(x, src_x), op=hvd.Sum, name=f"ready.in.{dev}"))
    torch.testing.assert_close(x.cpu().to(torch.float64), ref_x, rtol=1e-6, atol=1e-5)
    _late(x, src_x)
    _late(y, src_y)
    hvd.synchronize(hvd.grouped_allreduce_async_([x, y], op=hvd.Sum, name=f"ready.grp.{dev}"))
    torch.testing.assert_close(x.cpu().to(torch.float64), ref_x, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(y.cpu().to(torch.float64), ref_y, rtol=1e-6, atol=1e-5)
    root = n - 1
    got = hvd.synchronize(hvd.broadcast_async_(_late(y, src_y), root, name=f"ready.bc.{dev}"))
    torch.testing.assert_close(got.cpu(), ys[root])


@pytest.mark.parametrize("dev", DEVICES)
def test_broadcast_allgather_alltoall_reducescatter(dev):
    r, n = rank_size()
    d = device_of(dev)
    root = 1 % n
    xs = [rank_data(i, (4, 6), torch.float32, seed=20) for i in range(n)]
    got = hvd.broadcast(xs[r].to(d), root_rank=root, name=f"cuda.bc.{dev}")
    assert got.device == d and torch.equal(got.cpu(), xs[root])
    y = xs[r].to(d)
    hvd.broadcast_(y, root_rank=root, name=f"cuda.bc_.{dev}")
    assert torch.equal(y.cpu(), xs[root])
    # allgather with a different first dimension on every rank
    parts = [rank_data(i, (i + 1, 3), torch.float64, seed=21) for i in range(n)]
    got = hvd.allgather(parts[r].to(d), name=f"cuda.ag.{dev}")
    assert got.device == d and torch.equal(got.cpu(), torch.cat(parts))
    # alltoall with splits: rank i sends (i + j) % 2 + 1 rows to rank j
    splits = [[(i + j) % 2 + 1 for j in range(n)] for i in range(n)]
    sends = [rank_data(i, (sum(splits[i]), 2), torch.int32, seed=22) for i in range(n)]
    out, received = hvd.alltoall(sends[r].to(d), splits=splits[r], name=f"cuda.a2a.{dev}")
    want = []
    for i in range(n):
        start = sum(splits[i][:r])
        want.append(sends[i][start:start + splits[i][r]])
    assert out.device == d and torch.equal(out.cpu(), torch.cat(want))
    assert received.tolist() == [splits[i][r] for i in range(n)]
    # reducescatter: rank r gets block r of the sum
    full = [rank_data(i, (2 * n, 5), torch.float32, seed=23) for i in range(n)]
    got = hvd.reducescatter(full[r].to(d), op=hvd.Sum, name=f"cuda.rs.{dev}")
    ref = torch.stack(full).to(torch.float64).sum(0)[2 * r:2 * r + 2]
    assert got.device == d
    torch.testing.assert_close(got.cpu().to(torch.float64), ref, rtol=1e-6, atol=1e-6)
    # with Horovod's scale factors, applied by libhora on the device path too
    got = hvd.reducescatter(full[r].to(d), op=hvd.Average, prescale_factor=2.0, postscale_factor=0.25,
                            name=f"cuda.rs.scaled.{dev}")
    torch.testing.assert_close(got.cpu().to(torch.float64), ref * 2.0 / n * 0.25, rtol=1e-6, atol=1e-6)


def _adasum_ref(vs):
    """Adasum of the vectors vs (float64), pairwise in the tree hora.h describes."""
    vs = [v.to(torch.float64).flatten() for v in vs]
    d = 1
    while d < len(vs):
        for k in range(0, len(vs), 2 * d):
            a, b = vs[k], vs[k + d]
            ab, aa, bb = float(a @ b), float(a @ a), float(b @ b)
            ca = 1.0 - ab / (2 * aa) if aa >= 1.4916681462400413e-154 else 1.0
            cb = 1.0 - ab / (2 * bb) if bb >= 1.4916681462400413e-154 else 1.0
            vs[k] = ca * a + cb * b
        d *= 2
    return vs[0]


@pytest.mark.parametrize("dev", DEVICES)
def test_adasum_on_device_is_horovods_gpu_adasum(dev):
    """op=Adasum: of CPU tensors the Adasum over the ranks; of GPU tensors Horovod 0.28's GPU
    Adasum (its NCCL builds): the average within each node, Adasum between the nodes, so on the
    one node of this test the average. Scale factors as Horovod applies them."""
    r, n = rank_size()
    if n & (n - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")
    d = device_of(dev)
    xs = [rank_data(i, (5, 7), torch.float32, seed=30) for i in range(n)]
    got = hvd.allreduce(xs[r].to(d), op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.5,
                        name=f"cuda.adasum.{dev}")
    if dev == "cuda" and hvd.cross_size() == 1:
        ref = torch.stack(xs).to(torch.float64).mean(0)  # 0.5 * (sum of 2x) / n
    else:
        ref = _adasum_ref([2.0 * x for x in xs]).reshape(5, 7) * 0.5
    assert got.device == d and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu().to(torch.float64), ref, rtol=1e-5, atol=1e-5)


class Net(torch.nn.Module):
    """A small convnet (convolution, pooling, dense): the layers of Horovod's MNIST example."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 3 * 3, 5)
        self.unused = torch.nn.Parameter(torch.ones(3))  # never in the graph

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


@pytest.mark.parametrize("dev", DEVICES)
def test_distributed_optimizer_on_device_matches_single_process(dev):
    """Horovod's GPU recipe: model.cuda(), lr scaled, broadcast_parameters and
    broadcast_optimizer_state from rank 0, DistributedOptimizer; float64 so that the comparison
    with one process on the whole batch is tight (no TF32)."""
    r, n = rank_size()
    d = device_of(dev)
    local = 3
    torch.manual_seed(500 + r)  # a different start on every rank until the broadcast
    model = Net().double().to(d)
    torch.manual_seed(500)
    ref = Net().double().to(d)  # rank 0's start: what the broadcast gives everyone
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(4):
        g = torch.Generator().manual_seed(77 + step)
        x = torch.randn(n * local, 1, 8, 8, generator=g, dtype=torch.float64).to(d)
        y = torch.randint(0, 5, (n * local,), generator=g).to(d)
        opt.zero_grad()
        mine = slice(r * local, (r + 1) * local)
        torch.nn.functional.cross_entropy(model(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device == d
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-9, atol=1e-11, msg=name)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    every = hvd.allgather(flat.reshape(1, -1), name=f"cuda.weights.{dev}")
    assert (every == every[0]).all()  # the same bits on every rank


@pytest.mark.parametrize("dev", DEVICES)
def test_sync_batch_norm_on_device(dev):
    r, n = rank_size()
    d = device_of(dev)
    local = 4
    g = torch.Generator().manual_seed(31)
    x = torch.randn(n * local, 3, 5, 5, generator=g, dtype=torch.float32) * 2 + 1
    w = torch.randn(n * local, 3, 5, 5, generator=g, dtype=torch.float32)
    bn = hvd.SyncBatchNorm(3).to(d)
    ref = torch.nn.BatchNorm2d(3).to(d)
    xm = x[r * local:(r + 1) * local].to(d).requires_grad_()
    xr = x.to(d).requires_grad_()
    out = bn(xm)
    (out * w[r * local:(r + 1) * local].to(d)).sum().backward()
    rout = ref(xr)
    (rout * w.to(d)).sum().backward()
    assert out.device == d
    torch.testing.assert_close(out, rout[r * local:(r + 1) * local], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xm.grad, xr.grad[r * local:(r + 1) * local], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(bn.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    # Each rank's weight gradient is its own batch's share: summed over the ranks, the total.
    gw = hvd.allreduce(bn.weight.grad, op=hvd.Sum, name=f"cuda.bn.gw.{dev}")
    torch.testing.assert_close(gw, ref.weight.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dev", DEVICES)
def test_join_with_uneven_data(dev):
    """Horovod's pattern for ranks with fewer batches: the last rank runs out first and calls
    hvd.join(); the others' allreduces of this device's tensors complete with zeros from it
    (Average still divides by the world size), then they join too."""
    r, n = rank_size()
    d = device_of(dev)
    xs = [rank_data(i, (2, 300), torch.float32, seed=40) for i in range(n)]
    if r == n - 1:
        last = hvd.join(hvd.local_rank() if dev == "cuda" else -1)
    else:
        got = hvd.allreduce(xs[r].to(d), name=f"cuda.join.avg.{dev}")
        total = hvd.allreduce(xs[r].to(d), op=hvd.Sum, name=f"cuda.join.sum.{dev}")
        last = hvd.join()
        want = torch.stack(xs[:n - 1]).to(torch.float64).sum(0)
        assert got.device == d and total.device == d
        torch.testing.assert_close(total.cpu().to(torch.float64), want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got.cpu().to(torch.float64), want / n, rtol=1e-6, atol=1e-6)
    lasts = hvd.allgather(torch.tensor([last]), name=f"cuda.join.last.{dev}")
    assert (lasts == lasts[0]).all()
    assert n == 1 or 0 <= int(lasts[0]) < n - 1


@pytest.mark.parametrize("dev", DEVICES)
def test_elastic_torch_state_on_device(dev, tmp_path):
    """hvd.elastic.TorchState of a model and optimizer on this device (Horovod's elastic GPU
    program): sync gives every rank rank 0's parameters, commit then restore brings back the
    committed parameters and momentum bit for bit, on the device."""
    r, n = rank_size()
    d = device_of(dev)
    torch.manual_seed(900 + r)  # every rank starts different
    model = Net().to(d)
    torch.manual_seed(900)
    ref = Net().to(d)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, hora_dir=str(tmp_path / f"el{r}"), epoch=0)
    state.sync()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.device == d and torch.equal(p, q), name

    def train(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(4, 1, 8, 8, generator=g).to(d)
        y = torch.randint(0, 5, (4,), generator=g).to(d)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    def snapshot():
        t = [p.detach().clone() for p in model.parameters()]
        t += [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()
              if opt.state[p].get("momentum_buffer") is not None]
        return t

    train(1)
    state.epoch = 1
    state.commit()
    committed = snapshot()
    train(2)
    assert not all(torch.equal(a, b) for a, b in zip(snapshot(), committed))
    state.restore()
    after = snapshot()
    assert len(after) == len(committed) and state.epoch == 1
    for a, b in zip(after, committed):
        assert a.device == d and torch.equal(a, b)
