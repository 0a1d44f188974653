"""Training throughput of a torchvision model on synthetic data, in the shape of Horovod's
PyTorch synthetic benchmark; a Horovod program unchanged but for its import line.

    mpirun -np 2 python3 examples/pytorch/pytorch_synthetic_benchmark.py \
        [--model resnet50] [--batch-size 32] [--num-iters 10] [--image-size 224]

Each rank trains `--model` (any name in torchvision.models) on one random batch that it keeps
for the whole run; the gradients are averaged across ranks by hvd.DistributedOptimizer. After
`--num-warmup-batches` untimed steps, `--num-iters` timings of `--num-batches-per-iter` steps
each are taken; rank 0 prints images/s per rank and in total (mean +- 1.96 standard deviations
over the iterations). `--image-size` and `--num-classes` (beyond Horovod's script) make small
runs possible on a CPU.
"""
import argparse
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim

import hora.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch synthetic benchmark",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="compress the gradients to float16 for the allreduce")
parser.add_argument("--model", type=str, default="resnet50",
                    help="model: a constructor name in torchvision.models")
parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
parser.add_argument("--num-warmup-batches", type=int, default=10,
                    help="untimed steps before the timings")
parser.add_argument("--num-batches-per-iter", type=int, default=10,
                    help="steps in one timing")
parser.add_argument("--num-iters", type=int, default=10, help="number of timings")
parser.add_argument("--image-size", type=int, default=224, help="height and width of an image")
parser.add_argument("--num-classes", type=int, default=1000, help="classes of the model's output")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="train on the CPU even where a GPU is present")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="combine the gradients with Adasum instead of averaging them")


def build_model(name, num_classes):
    try:
        from torchvision import models
    except ImportError:
        sys.exit("this benchmark takes its model from torchvision: pip install torchvision")
    ctor = getattr(models, name, None)
    if not callable(ctor):
        sys.exit(f"--model {name}: not a model of torchvision.models")
    return ctor(num_classes=num_classes)


def benchmark_step():
    optimizer.zero_grad()
    output = model(data)
    loss = F.cross_entropy(output, target)
    loss.backward()
    optimizer.step()


def log(s, nl=True):
    if hvd.rank() != 0:
        return
    print(s, end="\n" if nl else "", flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if args.cuda:
        # One GPU per process: the local rank's.
        torch.cuda.set_device(hvd.local_rank())
        torch.backends.cudnn.benchmark = True

    model = build_model(args.model, args.num_classes)
    # Adasum does not need the learning rate scaled by the number of ranks.
    lr_scaler = 1 if args.use_adasum else hvd.size()
    if args.cuda:
        model.cuda()
        if args.use_adasum and hvd.nccl_built():
            lr_scaler = hvd.local_size()
    optimizer = optim.SGD(model.parameters(), lr=0.01 * lr_scaler)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    try:
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.named_parameters(),
                                             compression=compression,
                                             op=hvd.Adasum if args.use_adasum else hvd.Average)
    except (NotImplementedError, ValueError) as e:
        # Every rank fails the same way here (before any collective), so none is left waiting:
        # Adasum needs a power-of-two number of ranks.
        sys.exit(f"--use-adasum: {e}; run without it")

    # Every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # One random batch per rank, reused for every step: the benchmark measures compute and
    # gradient averaging, not input loading.
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    target = torch.randint(0, args.num_classes, (args.batch_size,))
    if args.cuda:
        data, target = data.cuda(), target.cuda()

    device = "GPU" if args.cuda else "CPU"
    log(f"Model: {args.model}")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of {device}s: {hvd.size()}")

    log("Running warmup...")
    timeit.timeit(benchmark_step, number=args.num_warmup_batches)

    log("Running benchmark...")
    img_secs = []
    for x in range(args.num_iters):
        t = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
        img_sec = args.batch_size * args.num_batches_per_iter / t
        log(f"Iter #{x}: {img_sec:.1f} img/sec per {device}")
        img_secs.append(img_sec)

    img_sec_mean = np.mean(img_secs)
    img_sec_conf = 1.96 * np.std(img_secs)
    log(f"Img/sec per {device}: {img_sec_mean:.1f} +-{img_sec_conf:.1f}")
    log(f"Total img/sec on {hvd.size()} {device}(s): {hvd.size() * img_sec_mean:.1f} "
        f"+-{hvd.size() * img_sec_conf:.1f}")
