"""Training-step throughput of hora.torch.DistributedOptimizer against averaging the gradients
after backward, on the MNIST convnet of examples/python/mnist_torch.py.

    mpirun -np N python3 python/bench/bench_optimizer.py [--steps 30] [--batch 128] [--repeat 3]

Modes, measured in the same run, interleaved, --repeat times each (median reported):
  blocking   loss.backward(); hora.allreduce_(p.grad) for every parameter; opt.step()
             (what a script without hooks does: no overlap; the baseline)
  grouped    loss.backward(); hora.grouped_allreduce_(all grads) through the engine (one fused
             request); opt.step()
  hooks      hora.torch.DistributedOptimizer: each gradient's allreduce_async_ starts from its
             hook during backward, step() waits (the overlap of Horovod and DDP)
Inputs are random tensors of MNIST's shape (the compute is what matters); --batch is global.
Rank 0 prints images/s per mode and the ratio to `blocking`.
"""
import argparse
import os
import runpy
import statistics
import time

import torch
import torch.nn.functional as F

import hora
import hora.torch as ht

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    hora.init()
    rank, size = hora.rank(), hora.size()
    example = runpy.run_path(os.path.join(HERE, os.pardir, os.pardir, "examples", "python",
                                          "mnist_torch.py"))
    ConvNet = example["ConvNet"]
    local = a.batch // size
    g = torch.Generator().manual_seed(rank)
    x = torch.rand(local, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (local,), generator=g)

    def run(mode):
        torch.manual_seed(0)
        model = ConvNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        if mode == "hooks":
            opt = ht.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        params = list(model.parameters())
        hora.barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            if mode == "blocking":
                for p in params:
                    hora.allreduce_(p.grad, op=hora.Average)
            elif mode == "grouped":
                hora.grouped_allreduce_([p.grad for p in params], op=hora.Average,
                                        name="grads")
            opt.step()
        dt = time.perf_counter() - t0
        return float(hora.allreduce(torch.tensor([dt], dtype=torch.float64), op=hora.Max)[0])

    modes = ["blocking", "grouped", "hooks"]
    for m in modes:  # warm-up: engine response cache, allocator
        a_steps, a.steps = a.steps, 3
        run(m)
        a.steps = a_steps
    times = {m: [] for m in modes}
    for _ in range(a.repeat):
        for m in modes:
            times[m].append(run(m))
    if rank == 0:
        base = statistics.median(times["blocking"])
        print(f"# DistributedOptimizer throughput: {size} ranks, global batch {a.batch}, "
              f"{a.steps} steps, {a.threads} torch thread(s) per rank, median of {a.repeat}")
        for m in modes:
            t = statistics.median(times[m])
            print(f"{m:>9}: {a.steps * a.batch / t:8.0f} images/s  ({base / t:.2f}x blocking)")
    hora.shutdown()


if __name__ == "__main__":
    main()
