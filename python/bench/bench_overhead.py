"""Per-call cost of hora's Python allreduce against the same call from C and against mpi4py.

    mpirun -np 2 python3 python/bench/bench_overhead.py [--repeat 5] [--sizes 16,1M,4M,16M]

In one run, on the same float32 NumPy arrays (op Sum), it times:
  C loop       hora_allreduce called from a C loop (a tiny C function compiled here with cffi
               against the same libhora): the baseline without Python.
  hora_        hora.allreduce_(x): in place, what a training loop calls.
  hora         hora.allreduce(x): out of place (allocates the output).
  mpi4py       comm.Allreduce(MPI.IN_PLACE, x) of mpi4py on the same Open MPI.
Every (size, method) is measured --repeat times, interleaved, and the median is reported; each
measurement is the slowest rank's mean time per call. Rank 0 prints one row per size with the
added Python cost (hora_ - C loop) and, for sizes >= 1 MiB, algbw (bytes / time, GB = 1e9 B)
and the ratio to mpi4py. See docs/benchmarks.md ("Python").
"""
import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from mpi4py import MPI  # initializes MPI (thread level MULTIPLE by default); hora dups the world

import hora
from hora import _core

HERE = os.path.dirname(os.path.abspath(__file__))

C_LOOP = r"""
#include <time.h>
#include <hora.h>
/* iters calls of hora_allreduce in place; returns seconds, *rc the first error. */
static double loop(uintptr_t ctx, void *buf, size_t count, int iters, int *rc) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < iters; i++) {
    hora_result_t r = hora_allreduce((hora_ctx_t *)ctx, buf, buf, count, HORA_FLOAT32, HORA_SUM,
                                     1.0, 1.0, HORA_DEVICE_HOST);
    if (r != HORA_SUCCESS) { *rc = (int)r; break; }
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}
"""


def build_c_loop():
    sys.path.insert(0, os.path.join(HERE, os.pardir))
    import hora_build
    from cffi import FFI

    incs, libs = hora_build.find_hora()
    ffi = FFI()
    ffi.cdef("double loop(uintptr_t ctx, void *buf, size_t count, int iters, int *rc);")
    ffi.set_source("_hora_bench_loop", C_LOOP, include_dirs=incs, library_dirs=libs,
                   runtime_library_dirs=libs, libraries=["hora"], extra_compile_args=["-O2"])
    tmp = tempfile.mkdtemp(prefix="hora-bench-")
    so = ffi.compile(tmpdir=tmp)
    spec = importlib.util.spec_from_file_location("_hora_bench_loop", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16,1M,4M,16M", help="bytes per rank (K/M suffixes)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--small-iters", type=int, default=2000)
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    hora.init()
    me, n = hora.rank(), hora.size()
    cmod = build_c_loop()
    ctx_addr = int(_core.ffi.cast("uintptr_t", _core._state.ctx))
    rc = cmod.ffi.new("int *")

    def timed(fn, iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fn(iters)
        dt = (time.perf_counter() - t0) / iters
        return comm.allreduce(dt, op=MPI.MAX)

    rows = []
    for size in [parse_size(s) for s in a.sizes.split(",")]:
        count = max(1, size // 4)
        x = np.ones(count, dtype=np.float32)
        buf = cmod.ffi.from_buffer(x)
        iters = a.small_iters if size < (64 << 10) else max(5, int(200e6 // max(size, 1)))

        def c_loop(k):
            cmod.lib.loop(ctx_addr, buf, count, k, rc)
            if rc[0]:
                raise RuntimeError(f"hora_allreduce failed with {rc[0]}")

        def py_inplace(k):
            f = hora.allreduce_
            for _ in range(k):
                f(x, op=hora.Sum)

        def py_out(k):
            f = hora.allreduce
            for _ in range(k):
                f(x, op=hora.Sum)

        def mpi(k):
            f = comm.Allreduce
            for _ in range(k):
                f(MPI.IN_PLACE, x, op=MPI.SUM)

        methods = {"C loop": c_loop, "hora_": py_inplace, "hora": py_out, "mpi4py": mpi}
        for fn in methods.values():  # warm-up (connections, caches); values overflow harmlessly
            fn(3)
        samples = {k: [] for k in methods}
        for _ in range(a.repeat):
            for k, fn in methods.items():
                x.fill(1.0)
                samples[k].append(timed(fn, iters))
        rows.append((count * 4, {k: statistics.median(v) for k, v in samples.items()}))

    if me == 0:
        print(f"# hora Python allreduce overhead: {n} ranks, float32 sum, median of {a.repeat}, "
              f"time per call in us (slowest rank)")
        print(f"{'bytes':>10} {'C loop':>9} {'hora_':>9} {'hora':>9} {'mpi4py':>9} "
              f"{'added':>7} {'hora_/C':>8} {'mpi4py/hora_':>12} {'algbw hora_':>11} "
              f"{'algbw mpi4py':>12}")
        for nbytes, m in rows:
            us = {k: v * 1e6 for k, v in m.items()}
            bw = (f"{nbytes / m['hora_'] / 1e9:11.3f} {nbytes / m['mpi4py'] / 1e9:12.3f}"
                  if nbytes >= (1 << 20) else f"{'':>11} {'':>12}")
            print(f"{nbytes:>10} {us['C loop']:9.2f} {us['hora_']:9.2f} {us['hora']:9.2f} "
                  f"{us['mpi4py']:9.2f} {us['hora_'] - us['C loop']:7.2f} "
                  f"{m['hora_'] / m['C loop']:8.3f} {m['mpi4py'] / m['hora_']:12.3f} {bw}")
    hora.shutdown()


if __name__ == "__main__":
    main()
