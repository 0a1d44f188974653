#!/usr/bin/env python3
"""The PyTorch baseline of examples/mnist: the same Keras MNIST convnet (conv32 3x3 relu,
maxpool 2, conv64 3x3 relu, maxpool 2, flatten, dropout 0.5, dense 10), the same optimizer
(Adam) and batch size per rank, on the CPU (or with --device cuda on the GPUs, one per rank),
data parallel over --ranks processes with torch.distributed (gloo on the CPU, nccl on GPUs) and
DistributedDataParallel, as a PyTorch user would write it.

Prints one line `torch_images_per_s=<n> ranks=<n> threads_per_rank=<n>`: training images per
second over all ranks, timed over --steps steps after --warmup steps (forward, backward,
gradient allreduce, optimizer step; the batches come from tensors already in host memory and,
with --device cuda, are copied to the GPU each step, as examples/mnist does; the clock stops
after torch.cuda.synchronize()).

  python3 examples/mnist/bench_torch.py --data DIR [--ranks N] [--batch-size B] [--steps S]
                                        [--device cpu|cuda]

DIR holds MNIST-format IDX files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]).
Needs torch (the CPU wheel, or a CUDA build for --device cuda) and numpy.
"""
import argparse
import glob
import gzip
import os
import sys
import time


def load_idx(path):
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(dir_, prefix):
    hits = sorted(glob.glob(os.path.join(dir_, prefix + "*")))
    if not hits:
        sys.exit(f"bench_torch: no {prefix}* in {dir_}")
    return hits[0]


def worker(rank, args, result):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    threads = max(1, args.cores // args.ranks)
    torch.set_num_threads(threads)
    if args.ranks > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank,
                                world_size=args.ranks)
    dev = torch.device("cpu")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench_torch: --device cuda: this torch sees no GPU")
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    torch.manual_seed(args.seed)
    images = load_idx(find(args.data, "train-images"))
    labels = load_idx(find(args.data, "train-labels"))
    x = torch.from_numpy(images[rank::args.ranks].copy()).float().div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels[rank::args.ranks].copy()).long()
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.5), nn.Linear(1600, 10)).to(dev)
    if args.ranks > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lossf = nn.CrossEntropyLoss()
    B = args.batch_size
    nb = x.shape[0] // B
    model.train()

    def step(i):
        j = (i % nb) * B
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(x[j:j + B].to(dev)), y[j:j + B].to(dev))
        loss.backward()
        opt.step()

    for i in range(args.warmup):
        step(i)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    if args.ranks > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(args.warmup + i)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    if args.ranks > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        result.put((args.steps * B * args.ranks / dt, threads))
    if args.ranks > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args()
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    if args.ranks == 1:
        worker(0, args, result)
    else:
        mp.spawn(worker, args=(args, result), nprocs=args.ranks, join=True)
    ips, threads = result.get()
    print(f"torch_images_per_s={ips:.0f} ranks={args.ranks} threads_per_rank={threads}")


if __name__ == "__main__":
    main()
