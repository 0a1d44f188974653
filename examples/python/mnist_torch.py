"""The Keras MNIST convnet in PyTorch, trained data-parallel with hora.torch.DistributedOptimizer.

    build/bin/launch -np 4 python3 examples/python/mnist_torch.py --data DIR
    # in an sbatch script:  srun --mpi=pmix hora-launch -- python3 mnist_torch.py --data DIR

DIR holds the four MNIST (or Fashion-MNIST) IDX files, gzipped or not:
train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
Each rank trains on its shard of every epoch's shuffled training set (the same permutation on all
ranks, from --seed), gradients are averaged by hora (an async allreduce starts from each
parameter's gradient hook during backward; step() waits), and rank 0 prints the loss and the test
accuracy, evaluated over all ranks' shards of the test set.

Model (as in keras.io/examples/vision/mnist_convnet): conv 32 3x3 relu, maxpool 2, conv 64 3x3
relu, maxpool 2, flatten, dropout 0.5, dense 10 (softmax in the loss). Adam with the learning
rate scaled by the world size, as Horovod recommends.
"""
import argparse
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hora
import hora.torch as ht


def read_idx(path):
    """An IDX file (yann.lecun.com/exdb/mnist format: magic 0x0000 08 <ndim>, big-endian dims,
    then uint8 data) as a NumPy array."""
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            opener = gzip.open if p.endswith(".gz") else open
            with opener(p, "rb") as f:
                raw = f.read()
            break
    else:
        raise FileNotFoundError(f"{path}[.gz] not found")
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data for dims {dims}")
    return data.reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    if len(x) != len(y):
        raise ValueError(f"{split}: {len(x)} images but {len(y)} labels")
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)  # [N, 1, 28, 28]
    return x, torch.from_numpy(y.astype(np.int64))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(64 * 5 * 5, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder with the MNIST IDX files")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128, help="global batch (all ranks)")
    ap.add_argument("--lr", type=float, default=1e-3, help="learning rate of one rank")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: keep)")
    a = ap.parse_args()

    hora.init()
    rank, size = hora.rank(), hora.size()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.batch_size % size:
        raise SystemExit(f"--batch-size {a.batch_size} must divide by the world size {size}")
    local_batch = a.batch_size // size
    torch.manual_seed(a.seed + rank)  # dropout differs per rank; weights come from rank 0

    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "test")
    model = ConvNet()
    opt = torch.optim.Adam(model.parameters(), lr=a.lr * size)
    opt = ht.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    ht.broadcast_parameters(model.state_dict(), root_rank=0)
    ht.broadcast_optimizer_state(opt, root_rank=0)

    gen = torch.Generator().manual_seed(a.seed)
    steps = len(xtr) // a.batch_size
    for epoch in range(a.epochs):
        model.train()
        perm = torch.randperm(len(xtr), generator=gen)  # same on every rank
        t0, loss_sum = time.perf_counter(), 0.0
        for s in range(steps):
            idx = perm[s * a.batch_size + rank * local_batch:][:local_batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        dt = time.perf_counter() - t0
        # Mean training loss over ranks, and test accuracy over every rank's test shard.
        mean_loss = hora.allreduce(np.array([loss_sum / steps]), op=hora.Average)[0]
        model.eval()
        with torch.no_grad():
            part = slice(rank, len(xte), size)
            correct = (model(xte[part]).argmax(1) == yte[part]).sum().item()
        total = hora.allreduce(np.array([correct, len(yte[part])], dtype=np.int64), op=hora.Sum)
        if rank == 0:
            print(f"epoch {epoch + 1}/{a.epochs}: loss {mean_loss:.4f}, test accuracy "
                  f"{total[0] / total[1]:.4f} ({total[0]}/{total[1]}), {dt:.1f} s, "
                  f"{steps * a.batch_size / dt:.0f} images/s on {size} ranks", flush=True)
    hora.shutdown()


if __name__ == "__main__":
    main()
