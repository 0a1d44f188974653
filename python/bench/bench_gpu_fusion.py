"""ResNet-50 training steps on CUDA through hora.torch.DistributedOptimizer, to compare the async
engine with its device fusion (the default) against unfused device tensors
(HORA_FUSION_THRESHOLD=0, each gradient bucket's tensors reduced one collective at a time), and
the ready event that each async submission of CUDA tensors passes to the engine (the default)
against synchronizing torch's stream at each submission (`--ready sync`, hora.torch before the
ready event), and both against torch's optimizer alone (`--plain`: no hora collective, the
single-GPU step). Run it once per setting in the same job, alternating (tests/gpu/fusion-probe.sh
and tests/gpu/ready-probe.sh do):

    mpirun -np N python3 python/bench/bench_gpu_fusion.py [--batch-size 32] [--steps 20]
                 [--ready event|sync] [--plain]

Every rank uses GPU 0 when --shared-gpu is given (2 ranks on one GPU take the MPI-staged path,
as NCCL refuses two ranks on one GPU), else GPU local_rank. Synthetic images, SGD, float32.
Prints one table row on rank 0: the setting, ranks, median step ms (forward, backward with the
averaging overlapped, step), median ms that optimizer.step() waited for the averaging after
backward (exposed communication), images/s over all ranks.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

import hora.torch as hvd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    ap.add_argument("--steps", type=int, default=20, help="timed steps (after --warmup)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--shared-gpu", action="store_true", help="every rank on GPU 0")
    ap.add_argument("--image-size", type=int, default=224, help="height and width of an image")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of this script on a machine without a GPU")
    ap.add_argument("--ready", default="event", choices=["event", "sync"],
                    help="sync: synchronize torch's stream at each async submission instead of "
                         "passing a ready event (hora.torch before the ready event)")
    ap.add_argument("--plain", action="store_true",
                    help="torch's optimizer alone, no averaging (the baseline; 1 rank)")
    args = ap.parse_args()
    if args.ready == "sync":
        import hora._buffers
        hora._buffers.READY_EVENTS = False

    hvd.init()
    dev = args.device
    if dev == "cuda":
        torch.cuda.set_device(0 if args.shared_gpu else hvd.local_rank())
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if not args.plain:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=dev)
    target = torch.randint(0, 1000, (args.batch_size,), device=dev)

    steps, waits = [], []
    for i in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        sync()
        t1 = time.perf_counter()
        opt.step()
        sync()
        t2 = time.perf_counter()
        if i >= args.warmup:
            steps.append((t2 - t0) * 1e3)
            waits.append((t2 - t1) * 1e3)
    # The slowest rank's medians: every rank waits for it.
    med = torch.tensor([statistics.median(steps), statistics.median(waits)], dtype=torch.float64)
    med = hvd.allreduce(med, op=hvd.Max, name="bench_gpu_fusion.medians")
    if hvd.rank() == 0:
        setting = (f"HORA_FUSION_THRESHOLD={os.environ.get('HORA_FUSION_THRESHOLD', 'default')}"
                   f", ready {args.ready}")
        if args.plain:
            setting = "torch.optim.SGD alone (no averaging)"
        ips = args.batch_size * hvd.size() / (med[0].item() / 1e3)
        print(f"| {setting} | {hvd.size()} | {med[0].item():.1f} | "
              f"{med[1].item():.1f} | {ips:.0f} |", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
