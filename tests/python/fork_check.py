"""A rank that forks (os.fork, a PyTorch DataLoader's workers) at 2 ranks, run under mpirun.

1. os.fork() after hvd.init(), the child ending with sys.exit() (Python's exit handlers run):
   before, the exit handler's hora shutdown waited forever in the child for the engine thread it
   does not have, and the parent waited for the child. Now the child reads rank and size, its
   collectives raise NotInitializedError naming the fork, its exit is prompt, and the parent's
   collectives go on.
2. A DataLoader worker iterating a RecordReader that the Dataset opened in __init__ (before the
   workers were forked): before, it waited forever for the parent's prefetch thread. Now the
   worker's error names the fix, and the fix (open the reader in __iter__, shard by worker) gives
   every record of this rank's share exactly once across the workers.
Every wait here is bounded, so a regression fails instead of hanging.
"""
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import hora
import hora.torch as hvd

FILES, PER_FILE, WORKERS = 4, 500, 2


def wait_child(pid, limit_s):
    """The child's exit status; the child is killed and the check fails after limit_s."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"rank {hvd.rank()}: the fork() child did not end within {limit_s} s")


def refused(call, exc, word):
    """True when call() raises exc with `word` in its message."""
    try:
        call()
    except exc as e:
        return word in str(e)
    return False


def check_os_fork():
    r, n = hvd.rank(), hvd.size()
    pending = hvd.allreduce_async(torch.full((3,), float(r + 1)), name="in.flight", op=hvd.Sum) \
        if r == 0 else None
    sys.stdout.flush()
    sys.stderr.flush()
    layout = (r, n, hvd.local_rank())
    pid = os.fork()
    if pid == 0:
        checks = [
            # the layout is readable in the child, as in Horovod (a DataLoader worker shards by it)
            (hvd.rank(), hvd.size(), hvd.local_rank()) == layout and hvd.is_initialized(),
            refused(lambda: hvd.allreduce(torch.ones(2), name="child"), hora.NotInitializedError,
                    "fork() child"),  # also a ValueError, as Horovod's before init
            refused(hvd.barrier, hora.NotInitializedError, "hora_barrier"),
            pending is None or refused(pending.wait, hora.NotSupportedError, "fork() child"),
        ]
        failed = [i for i, ok in enumerate(checks) if not ok]
        sys.exit(10 + failed[0] if failed else 0)  # runs Python's exit handlers, hora's included
    t0 = time.monotonic()
    code = wait_child(pid, 20)
    took = time.monotonic() - t0
    assert code == 0, f"rank {r}: the fork() child failed its check {code - 10} (exit status {code})"
    assert took < 10, f"rank {r}: the fork() child took {took:.1f} s to end"
    if r != 0:
        pending = hvd.allreduce_async(torch.full((3,), float(r + 1)), name="in.flight", op=hvd.Sum)
    got = pending.wait()
    want = float(n * (n + 1) // 2)
    assert got.tolist() == [want] * 3, f"rank {r}: allreduce after the fork gave {got.tolist()}"
    assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item() == n


class OpenedTooEarly(IterableDataset):
    def __init__(self, files):
        self.reader = hora.RecordReader(files, shard=True, prefetch=4)

    def __iter__(self):
        for rec in self.reader:
            yield int(rec.split(b" ")[1])


class OpenedInIter(IterableDataset):
    """The documented pattern: each worker opens its own reader, one shard per (rank, worker)."""

    def __init__(self, files):
        self.files = files

    def __iter__(self):
        w = get_worker_info()
        wid, nw = (w.id, w.num_workers) if w else (0, 1)
        shard = (hvd.rank() * nw + wid, hvd.size() * nw)
        for rec in hora.RecordReader(self.files, shard=shard, prefetch=4):
            yield int(rec.split(b" ")[1])


def check_dataloader(tmp):
    r, n = hvd.rank(), hvd.size()
    files = []
    for f in range(FILES * n * WORKERS):
        p = os.path.join(tmp, f"part-{f:03d}.tfrecord")
        files.append(p)
        if r == 0:
            with hora.RecordWriter(p) as w:
                for i in range(PER_FILE):
                    w.write(b"record %d" % (f * PER_FILE + i))
    hvd.barrier()
    try:
        list(DataLoader(OpenedTooEarly(files), num_workers=WORKERS, batch_size=None, timeout=30))
        raise AssertionError(f"rank {r}: a reader opened before the fork gave records in a worker")
    except RuntimeError as e:  # DataLoader re-raises the worker's error with its text
        text = str(e)
        assert "fork() child" in text and "in __iter__" in text, f"rank {r}: worker error: {text}"
    got = sorted(DataLoader(OpenedInIter(files), num_workers=WORKERS, batch_size=None, timeout=30))
    # file i goes to shard i % (n * WORKERS); rank r's shards are r*WORKERS .. r*WORKERS+WORKERS-1
    want = sorted(f * PER_FILE + i for f in range(len(files)) if f % (n * WORKERS) // WORKERS == r
                  for i in range(PER_FILE))
    assert got == want, f"rank {r}: the workers gave {len(got)} records, want {len(want)}" \
        f" (first differences: {[x for x in got if x not in set(want)][:5]})"
    everyone = hvd.allgather_object(len(got))
    assert sum(everyone) == len(files) * PER_FILE, f"rank {r}: {everyone} records over all ranks"


def main():
    hvd.init()
    check_os_fork()
    with tempfile.TemporaryDirectory(dir=os.environ.get("HORA_BINARY_DIR")) as tmp:
        tmp = hvd.broadcast_object(tmp, root_rank=0)
        check_dataloader(tmp)
        hvd.barrier()
    if hvd.rank() == 0:
        print("OK fork_check")


if __name__ == "__main__":
    main()
