"""Runs examples/pytorch/pytorch_synthetic_benchmark.py unchanged on every rank (through runpy,
with a tiny model and image size) and checks what it must show:

- rank 0 printed a positive total throughput ("Total img/sec on N CPU(s): X +-Y");
- after training every rank holds the same parameters, bit for bit, although each rank trained
  on its own random batch (so the gradients were averaged, not merely started equal);
- the parameters moved away from rank 0's initial weights (so the steps were applied).

    mpirun -np 2 python3 tests/python/synthetic_benchmark_check.py [example args...]

Every rank counts its errors, the counts are summed, and every rank exits with the same code
(77 when torch or torchvision is missing).
"""
import contextlib
import io
import os
import re
import runpy
import sys

try:
    import torch
    import torchvision  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

import hora.torch as hvd

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, os.pardir, os.pardir, "examples", "pytorch",
                       "pytorch_synthetic_benchmark.py")
SEED = 1234
ARGS = ["--model", "mobilenet_v3_small", "--image-size", "32", "--num-classes", "10",
        "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
        "--num-iters", "2", "--no-cuda"]


def main():
    extra = sys.argv[1:]
    hvd.init()
    rank = hvd.rank()
    errors = 0
    # Different seeds per rank: different initial weights (the broadcast must fix them) and
    # different data (the averaging must keep the weights equal).
    torch.manual_seed(SEED + rank)
    torch.set_num_threads(1)
    out = io.StringIO()
    sys.argv = [EXAMPLE] + ARGS + extra
    with contextlib.redirect_stdout(out):
        g = runpy.run_path(EXAMPLE, run_name="__main__")
    sys.stdout.write(out.getvalue())
    sys.stdout.flush()

    if rank == 0:
        m = re.search(r"^Total img/sec on (\d+) CPU\(s\): ([0-9.]+) \+-([0-9.]+)$",
                      out.getvalue(), re.M)
        if not m:
            print("FAIL: rank 0 printed no 'Total img/sec on N CPU(s): X +-Y' line")
            errors += 1
        elif int(m.group(1)) != hvd.size() or not float(m.group(2)) > 0:
            print(f"FAIL: throughput line {m.group(0)!r}: wanted {hvd.size()} CPUs and > 0 img/s")
            errors += 1

    model = g["model"]
    names = [n for n, _ in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    root = hvd.broadcast(flat, root_rank=0, name="check.params")
    diff = (flat - root).abs().max().item()
    if diff != 0.0:
        print(f"FAIL: rank {rank}: parameters differ from rank 0's by up to {diff:g} "
              f"({len(names)} tensors)")
        errors += 1
    data = g["data"].reshape(-1)
    data0 = hvd.broadcast(data, root_rank=0, name="check.data")
    if rank != 0 and torch.equal(data, data0):
        print(f"FAIL: rank {rank} trained on rank 0's batch: the check would prove nothing")
        errors += 1
    if rank == 0:
        # Rank 0's initial weights: the same constructor under the same seed.
        torch.manual_seed(SEED)
        init = g["build_model"](g["args"].model, g["args"].num_classes)
        w0 = torch.cat([p.detach().reshape(-1) for p in init.parameters()])
        moved = (flat - w0).abs().max().item()
        if not moved > 0:
            print("FAIL: the parameters are rank 0's initial weights: no step was applied")
            errors += 1
        else:
            print(f"parameters equal on all {hvd.size()} ranks ({len(names)} tensors, "
                  f"{flat.numel()} values), moved by up to {moved:.3g} from the initial weights")
    total = int(hvd.allreduce(torch.tensor([errors]), op=hvd.Sum, name="check.errors")[0])
    if rank == 0:
        print("PASS" if total == 0 else f"FAIL: {total} error(s) over all ranks")
    hvd.shutdown()
    sys.exit(0 if total == 0 else 1)


if __name__ == "__main__":
    main()
