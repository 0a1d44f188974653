"""ResNet-50's gradients averaged per step by hora.torch.DistributedOptimizer against PyTorch's
DistributedDataParallel over gloo: the same model, batch, seed and ranks, in one run.

    mpirun --bind-to core -np N python3 python/bench/bench_ddp.py \
        [--model resnet50] [--image-size 32] [--batch-size 4] [--steps 6] [--repeat 3] \
        [--modes local,hora_opt,...] [--alone N] [--block K]

Bind the ranks (as hora's launcher and mpirun for up to 2 ranks do): unbound ranks that pause
may share one core through a whole allreduce (docs/benchmarks.md); with more ranks than cores,
add --oversubscribe (and --bind-to core:overload-allowed or none).

Modes, each with its own model built from the same seed, run interleaved: every repeat runs
--steps steps of each mode in turn (medians over the repeats reported):
  local          forward, backward, SGD step; no averaging (hora's compute baseline)
  hora_opt       hora.torch.DistributedOptimizer as a Horovod user runs it (hooks start each
                 gradient's allreduce during backward; opt.synchronize() waits, timed; the
                 wrapped SGD steps inside skip_synchronize())
  hora_opt_pertensor  the same, one allreduce request per gradient (Horovod's way, and
                 hora.torch's before its buckets): the optimizer layer before/after
  hora_opt_alone the optimizer of hora_opt with its gradient hooks removed: synchronize()
                 submits all the gradients after backward and waits (timed): the optimizer
                 layer's averaging alone, not overlapped with backward
  hora_grouped   forward, backward, one hora.torch.grouped_allreduce_ of all gradients (op
                 Average; timed), SGD step: the raw grouped allreduce, without the optimizer
  ddp            DistributedDataParallel over gloo (25 MB buckets, allreduce overlapped with
                 backward), SGD step
  ddp_nosync     the same DDP model inside no_sync(): DDP's compute baseline
  ddp_timed      DDP with a comm hook that runs each bucket's gloo allreduce to completion and
                 times it: gloo's averaging alone, not overlapped with backward
Communication per step is reported two ways:
  alone = the averaging timed by itself (hora_opt_alone's synchronize(), hora_grouped's call;
          ddp_timed's bucket allreduces): the figure the >= 5x goal is about
  cost  = step time with averaging - step time without (hora_opt - local; ddp - ddp_nosync):
          what the averaging adds to a training step, overlap included (noisy on a loaded host)
Step times are the slowest rank's; timed communication is the mean over ranks, and that of the
rank with the least (the one that arrived last, so without waiting for the others' backward).
Rank 0 prints a Markdown table and the ratios gloo / hora.

--alone N (with --modes "" to skip the training modes) then averages one backward's gradients N
times by each method in turn, without forward/backward between them (on a loaded host the
compute of the training modes swamps the communication): hora_opt (DistributedOptimizer's
synchronize() with its hooks removed: buckets), hora_opt_pertensor (one request per gradient),
hora_grouped (one grouped_allreduce_) and gloo_buckets (DDP's 25 MB buckets as flat buffers, one
gloo all_reduce each, then the division: gloo's part of a DDP step, without DDP's copies).
--block K (K > 1) runs them in blocks of K timed iterations per method, each block after one
untimed iteration of its method, instead of one by one: a method's buffers are then not just
evicted from the caches by another method's 102 MB (as they never are in training).
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import hora.torch as hvd
from hora import _torch_optim

MODES = ["local", "hora_opt", "hora_opt_pertensor", "hora_opt_alone", "hora_grouped", "ddp",
         "ddp_nosync", "ddp_timed"]


def build_model(name, num_classes):
    from torchvision import models
    return getattr(models, name)(num_classes=num_classes)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slowest(x):
    return float(hvd.allreduce(torch.tensor([x], dtype=torch.float64), op=hvd.Max,
                               name="bench.max")[0])


def least(x):
    return float(hvd.allreduce(torch.tensor([x], dtype=torch.float64), op=hvd.Min,
                               name="bench.min")[0])


def mean(x):
    return float(hvd.allreduce(torch.tensor([x], dtype=torch.float64), op=hvd.Average,
                               name="bench.mean")[0])


class Timed:
    """DDP comm hook state: each bucket's allreduce runs to completion inside the hook."""
    seconds = 0.0


def timed_hook(state, bucket):
    buf = bucket.buffer()
    t0 = time.perf_counter()
    dist.all_reduce(buf)
    buf.div_(dist.get_world_size())
    state.seconds += time.perf_counter() - t0
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


class Mode:
    """One mode's model and optimizer, built once (same seed for every mode); run() times
    `steps` training steps on this rank and the communication timed inside them."""

    def __init__(self, name, a, x, y):
        self.name, self.x, self.y = name, x, y
        torch.manual_seed(a.seed)
        model = build_model(a.model, a.num_classes)
        self.params = list(model.parameters())
        opt = torch.optim.SGD(self.params, lr=0.01)
        self.state = Timed()
        if name.startswith("hora_opt"):
            # hora_opt_pertensor: one request per gradient, as Horovod (and hora.torch before
            # its buckets) submits them.
            saved = _torch_optim._BUCKET_BYTES
            if name == "hora_opt_pertensor":
                _torch_optim._BUCKET_BYTES = 0
            try:
                opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                               groups=a.groups)
            finally:
                _torch_optim._BUCKET_BYTES = saved
            if name == "hora_opt_alone":
                # Without its gradient hooks, synchronize() submits every gradient itself (the
                # same path: names, compression, groups, engine fusion) and waits: the
                # optimizer's averaging alone, not overlapped with backward.
                for h in opt._hora_hooks.values():
                    h.remove()
        elif name.startswith("ddp"):
            model = DDP(model)
            if name == "ddp_timed":
                model.register_comm_hook(self.state, timed_hook)
        self.model, self.opt = model, opt

    def step(self):
        opt, comm = self.opt, 0.0
        opt.zero_grad()
        if self.name == "ddp_nosync":
            with self.model.no_sync():
                F.cross_entropy(self.model(self.x), self.y).backward()
        else:
            F.cross_entropy(self.model(self.x), self.y).backward()
        if self.name.startswith("hora_opt"):
            ts = time.perf_counter()
            opt.synchronize()
            comm = time.perf_counter() - ts
            with opt.skip_synchronize():
                opt.step()
            return comm
        if self.name == "hora_grouped":
            ts = time.perf_counter()
            hvd.grouped_allreduce_([p.grad for p in self.params], op=hvd.Average, name="grads")
            comm = time.perf_counter() - ts
        opt.step()
        return comm

    def run(self, steps):
        self.state.seconds = 0.0
        hvd.barrier()
        t0 = time.perf_counter()
        comm = sum(self.step() for _ in range(steps))
        dt = time.perf_counter() - t0
        return dt, (self.state.seconds if self.name == "ddp_timed" else comm)


def alone(a, x, y, iters):
    """The averaging alone, without forward/backward, interleaved (less exposed to the load than
    the training modes): the gradients of one backward, averaged `iters` times by each method,
    in turn iteration by iteration (a.block 1; the order turns each round) or in blocks of
    a.block timed iterations, each block after one untimed iteration of the same method
    (a.block > 1: each method's time without the other methods' memory traffic just before it,
    which evicts its buffers from the caches). Returns {method: [seconds per iteration, slowest
    rank]}."""
    torch.manual_seed(a.seed)
    model = build_model(a.model, a.num_classes)
    params = list(model.parameters())
    F.cross_entropy(model(x), y).backward()
    opts = {}
    for name, cap in (("hora_opt", None), ("hora_opt_pertensor", 0)):
        saved = _torch_optim._BUCKET_BYTES
        if cap is not None:
            _torch_optim._BUCKET_BYTES = cap
        try:
            opts[name] = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.01),
                                                  named_parameters=model.named_parameters())
        finally:
            _torch_optim._BUCKET_BYTES = saved
        for h in opts[name]._hora_hooks.values():
            h.remove()
    # gloo: DDP's buckets (25 MB, reverse order) as flat buffers, one all_reduce each.
    buckets, cur, used = [], [], 0
    for p in reversed(params):
        if cur and used + p.numel() * 4 > 25 * 1024 * 1024:
            buckets.append(torch.cat(cur))
            cur, used = [], 0
        cur.append(p.grad.reshape(-1))
        used += p.numel() * 4
    buckets.append(torch.cat(cur))

    def gloo():
        for b in buckets:
            dist.all_reduce(b)
            b.div_(dist.get_world_size())
    methods = {
        "hora_opt": lambda: opts["hora_opt"].synchronize(),
        "hora_opt_pertensor": lambda: opts["hora_opt_pertensor"].synchronize(),
        "hora_grouped": lambda: hvd.grouped_allreduce_([p.grad for p in params], op=hvd.Average,
                                                       name="grads"),
        "gloo_buckets": gloo,
    }
    out = {m: [] for m in methods}
    block = max(1, a.block)
    rounds = (iters + block - 1) // block
    names = list(methods)
    for r in range(rounds + (block == 1)):
        # The order turns each round: the hora methods average the same .grad tensors, so the one
        # right after gloo (whose 102 MB of buckets evict them) would always pay for it.
        for m in names[r % len(names):] + names[:r % len(names)]:
            f = methods[m]
            for it in range(block + (block > 1)):
                hvd.barrier()
                t0 = time.perf_counter()
                f()
                dt = slowest(time.perf_counter() - t0)
                # block 1: the first round warms up; blocks: the first iteration of each
                if (block == 1 and r) or (block > 1 and it):
                    out[m].append(dt)
    return out, len(buckets)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet50", help="a torchvision.models constructor")
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=4, help="images per rank per step")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per mode and repeat")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per mode first")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--groups", type=int, default=None,
                    help="DistributedOptimizer's groups= (default: None, Horovod's default)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--alone", type=int, default=0,
                    help="then N interleaved iterations of the averaging alone (no compute)")
    ap.add_argument("--block", type=int, default=1,
                    help="--alone's interleaving: 1 = method by method each iteration; K > 1 = "
                         "blocks of K timed iterations per method, each after one untimed one")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    torch.set_num_threads(a.threads)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0, name="port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(a.batch_size, 3, a.image_size, a.image_size, generator=g)
    y = torch.randint(0, a.num_classes, (a.batch_size,), generator=g)

    probe = build_model(a.model, a.num_classes)
    n_tensors = len(list(probe.parameters()))
    n_values = sum(p.numel() for p in probe.parameters())
    del probe
    runs = {m: Mode(m, a, x, y) for m in modes}
    for m in modes:
        runs[m].run(a.warmup)
    step = {m: [] for m in modes}
    comm = {m: [] for m in modes}
    comm_min = {m: [] for m in modes}
    for _ in range(a.repeat):
        for m in modes:
            dt, c = runs[m].run(a.steps)
            step[m].append(slowest(dt) / a.steps)
            comm[m].append(mean(c) / a.steps)
            comm_min[m].append(least(c) / a.steps)
    if a.alone:
        times, nb = alone(a, x, y, a.alone)
    dist.destroy_process_group()
    if rank == 0 and modes:
        report(a, size, modes, step, comm, comm_min, n_tensors, n_values)
    if rank == 0 and a.alone:
        g = statistics.median(times["gloo_buckets"])
        print(f"# averaging alone: {a.model}'s {n_tensors} gradients ({n_values * 4 / 1e6:.1f} "
              f"MB) on {size} ranks, {len(times['gloo_buckets'])} iterations interleaved "
              f"{'one by one' if a.block <= 1 else f'in blocks of {a.block} (+1 untimed)'}, "
              f"slowest rank, median; "
              f"gloo: {nb} flat 25 MB buckets (DDP's), one all_reduce each; load average "
              f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
        print("| method | ms (median) | gloo / method | iterations (ms) |")
        print("|---|---:|---:|---|")
        for m, v in times.items():
            med = statistics.median(v)
            print(f"| {m} | {med * 1e3:.1f} | {g / med:.2f}x | "
                  f"{' '.join(f'{t * 1e3:.0f}' for t in v)} |")
    hvd.shutdown()


def report(a, size, modes, step, comm, comm_min, n_tensors, n_values):
    med = {m: statistics.median(step[m]) * 1e3 for m in modes}
    cmed = {m: statistics.median(comm[m]) * 1e3 for m in modes}
    # The rank with the least timed communication arrived last: its figure holds no waiting for
    # the other ranks' backward to finish (which the mean over ranks does).
    lmed = {m: statistics.median(comm_min[m]) * 1e3 for m in modes}
    print(f"# {a.model}: {n_tensors} gradient tensors, {n_values} values "
          f"({n_values * 4 / 1e6:.1f} MB fp32); {size} ranks, batch {a.batch_size} per rank, "
          f"{a.image_size}x{a.image_size} images, {a.threads} torch thread(s) per rank, "
          f"{a.steps} steps x {a.repeat} repeats (median); load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("| mode | step ms | images/s | timed comm ms/step (mean) | (rank arriving last) | runs (step ms) |")
    print("|---|---:|---:|---:|---:|---|")
    for m in modes:
        runs = " ".join(f"{v * 1e3:.0f}" for v in step[m])
        print(f"| {m} | {med[m]:.1f} | {size * a.batch_size * 1e3 / med[m]:.1f} | "
              f"{cmed[m]:.1f} | {lmed[m]:.1f} | {runs} |")

    def ratio(num, den):
        return f"{num / den:.2f}x" if den > 0 else "n/a"
    if {"hora_opt", "local", "ddp", "ddp_nosync"} <= set(modes):
        dc = med["ddp"] - med["ddp_nosync"]
        for m in ("hora_opt", "hora_opt_pertensor"):
            if m in modes:
                hc = med[m] - med["local"]
                print(f"cost (step - step without averaging): {m} {hc:.1f} ms, gloo DDP "
                      f"{dc:.1f} ms; gloo / hora = {ratio(dc, hc)}")
    if "ddp_timed" in modes:
        for m in ("hora_opt_alone", "hora_grouped"):
            if m in modes:
                print(f"alone: {m} {cmed[m]:.1f} ms, gloo DDP buckets {cmed['ddp_timed']:.1f} "
                      f"ms; gloo / hora = {ratio(cmed['ddp_timed'], cmed[m])}; rank arriving "
                      f"last: {lmed[m]:.1f} against {lmed['ddp_timed']:.1f} ms, "
                      f"{ratio(lmed['ddp_timed'], lmed[m])}")
    for m in ("hora_opt", "hora_opt_pertensor"):
        if m in modes:
            print(f"{m} (hooks): {cmed[m]:.1f} ms/step waiting in synchronize() after "
                  "backward")

if __name__ == "__main__":
    main()
