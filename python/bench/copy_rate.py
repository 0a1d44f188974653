"""The copy and add rate of one core on a gradient-sized buffer, every rank at once: the floor
under hora's shared-memory allreduce on this machine (docs/benchmarks.md, "On a 16-core Xeon").

    mpirun -np N --bind-to core --map-by core python3 python/bench/copy_rate.py [--mb 102.2]

Each rank times `np.copyto` (reads and writes the buffer once: 2 x bytes) and an in-place
`np.add` (3 x bytes) of --mb megabytes of float32 (default: ResNet-50's 25,557,032 gradients),
7 times each after a barrier, and rank 0 prints every rank's best and median with the rate in
GB/s counting bytes read plus written (GB = 1e9 B). The ranks copy at the same moment, as they
do inside an allreduce, so the figures include their contention for memory bandwidth.
"""
import argparse
import time

import numpy as np
import torch

import hora.torch as hvd


def timed(fn, k):
    ts = []
    for _ in range(k):
        hvd.barrier()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[0], ts[k // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=102.228128, help="buffer size in MB (1e6 B)")
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    hvd.init()
    n = int(a.mb * 1e6) // 4
    rng = np.random.default_rng(hvd.rank())
    x = rng.random(n, dtype=np.float32)
    y = np.empty_like(x)
    z = rng.random(n, dtype=np.float32)
    cp = timed(lambda: np.copyto(y, x), a.repeat)
    ad = timed(lambda: np.add(x, z, out=x), a.repeat)
    rows = hvd.allgather(torch.tensor([[cp[0], cp[1], ad[0], ad[1]]], dtype=torch.float64),
                         name="copy_rate")
    if hvd.rank() == 0:
        print("# %d ranks, %.1f MB float32, best / median of %d (ms), GB/s of bytes read + written"
              % (hvd.size(), n * 4 / 1e6, a.repeat))
        print("| rank | copy best | copy median | copy GB/s | add best | add median | add GB/s |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r, (cb, cm, ab, am) in enumerate(rows.tolist()):
            print("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |"
                  % (r, cb * 1e3, cm * 1e3, 2 * n * 4 / cb / 1e9, ab * 1e3, am * 1e3, 3 * n * 4 / ab / 1e9))


if __name__ == "__main__":
    main()
