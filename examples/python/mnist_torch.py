"""The Keras MNIST convnet in PyTorch, trained data-parallel with hora.torch.DistributedOptimizer.

    build/bin/launch -np 4 python3 examples/python/mnist_torch.py --data DIR
    # in an sbatch script:  srun --mpi=pmix hora-launch -- python3 mnist_torch.py --data DIR

DIR holds the four MNIST (or Fashion-MNIST) IDX files, gzipped or not:
train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte.
Each rank trains on its shard of every epoch's shuffled training set (the same permutation on all
ranks, from --seed), gradients are averaged by hora (an async allreduce starts from each
parameter's gradient hook during backward; step() waits), and rank 0 prints the loss and the test
accuracy, evaluated over all ranks' shards of the test set.

With --ckpt-dir (node-local) and optionally --persist-dir, the model and optimizer are saved
after every epoch through hora.Checkpoint and restored at start (resume after preemption): on
SIGUSR1/SIGTERM from Slurm every rank stops at the same step boundary, saves, and exits with
hora.EXIT_REQUEUE so that the sbatch script can requeue the job.

Model (as in keras.io/examples/vision/mnist_convnet): conv 32 3x3 relu, maxpool 2, conv 64 3x3
relu, maxpool 2, flatten, dropout 0.5, dense 10 (softmax in the loss). Adam with the learning
rate scaled by the world size, as Horovod recommends.
"""
import argparse
import gzip
import os
import struct
import sys
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
    ap.add_argument("--ckpt-dir", help="node-local checkpoint folder (enables save/resume)")
    ap.add_argument("--persist-dir", help="persistent folder the checkpoints are copied to")
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

    # Checkpoint: model weights and optimizer state as flat arrays, restored on every rank.
    ck, start_epoch = None, 0
    if a.ckpt_dir:
        ck = hora.Checkpoint(a.ckpt_dir, a.persist_dir, keep=2)
        hora.stop_on_signal()
        opt.step()  # creates the optimizer state (zero gradients: Adam leaves weights unchanged)
        state = checkpoint_state(model, opt)
        # None: no checkpoint yet (a fresh start). Checkpoints that exist but are all corrupt
        # raise hora.CorruptError, which stops the run instead of silently starting over.
        epoch_done = ck.restore(state)
        if epoch_done is not None:
            start_epoch = epoch_done
            if rank == 0:
                print(f"resumed after epoch {epoch_done} from {ck.source()}", flush=True)

    gen = torch.Generator().manual_seed(a.seed)
    steps = len(xtr) // a.batch_size
    for epoch in range(a.epochs):
        perm = torch.randperm(len(xtr), generator=gen)  # same on every rank, every run
        if epoch < start_epoch:
            continue  # done before the restart: only the permutation is replayed
        model.train()
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
        if ck is not None:
            ck.save(epoch + 1, checkpoint_state(model, opt), meta={"epoch": str(epoch + 1)})
            if hora.should_stop():  # Slurm asked us to stop: make the save durable, requeue
                ck.close()
                hora.shutdown()
                sys.exit(hora.EXIT_REQUEUE)
    if ck is not None:
        ck.close()
    hora.shutdown()


def checkpoint_state(model, opt):
    """name -> tensor views of everything to save and restore (weights, Adam moments, steps)."""
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        for k, v in opt.state[p].items():
            if torch.is_tensor(v):
                state[f"opt.{i}.{k}"] = v.reshape(1) if v.dim() == 0 else v
    return state


if __name__ == "__main__":
    main()
