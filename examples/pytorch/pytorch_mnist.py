"""A typical Horovod PyTorch MNIST training script, unchanged but for its import line.

    mpirun -np 2 python3 examples/pytorch/pytorch_mnist.py --data-dir DIR --epochs 1

DIR holds the MNIST (or Fashion-MNIST) IDX files, gzipped or not (Debian's
dataset-fashion-mnist installs them in /usr/share/datasets/fashion-mnist). Everything below the
import is the shape of Horovod's own examples/pytorch/pytorch_mnist.py: DistributedSampler
shards, learning rate scaled by the world size, broadcast of parameters and optimizer state,
DistributedOptimizer with optional fp16 compression, and metrics averaged with hvd.allreduce.
Where torch sees a GPU it trains there, each rank on the GPU of its local rank, as Horovod's
script does (--no-cuda: on the CPU).
"""
import argparse
import gzip
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import hora.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--test-batch-size", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=50)
parser.add_argument("--fp16-allreduce", action="store_true", default=False)
parser.add_argument("--use-adasum", action="store_true", default=False)
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
parser.add_argument("--limit", type=int, default=0, help="use only the first N training images")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="train on the CPU even where a GPU is visible")


def read_idx(path):
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            with (gzip.open if p.endswith(".gz") else open)(p, "rb") as f:
                data = f.read()
            ndim = data[3]
            dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise FileNotFoundError(f"{path}[.gz] not found (pass --data-dir)")


def dataset(data_dir, split, limit=0):
    x = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte"))
    y = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    x = (torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1) - 0.1307) / 0.3081
    return torch.utils.data.TensorDataset(x, torch.from_numpy(y.astype(np.int64)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        if args.cuda:
            data, target = data.cuda(), target.cuda()
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                epoch, batch_idx * len(data), len(train_sampler),
                100. * batch_idx / len(train_loader), loss.item()), flush=True)


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test():
    model.eval()
    test_loss, test_accuracy = 0., 0.
    with torch.no_grad():
        for data, target in test_loader:
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).float().sum().item()
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")
    if hvd.rank() == 0:
        print("\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n".format(
            test_loss, 100. * test_accuracy), flush=True)
    return test_loss, test_accuracy


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    hvd.init()
    torch.manual_seed(args.seed)
    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset = dataset(args.data_dir, "train", args.limit)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_dataset = dataset(args.data_dir, "t10k", args.limit // 5 if args.limit else 0)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1
    if args.cuda:
        model.cuda()
        # If using GPU Adasum allreduce, scale learning rate by local_size.
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    for epoch in range(1, args.epochs + 1):
        train(epoch)
        loss, acc = test()
    # Every rank ends with the same weights.
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    gathered = hvd.allgather(w.reshape(1, -1))
    assert (gathered == gathered[0]).all(), "ranks diverged"
    if hvd.rank() == 0:
        print(f"final accuracy {acc:.4f}", flush=True)
