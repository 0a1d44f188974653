"""A Horovod program's timeline (HOROVOD_TIMELINE) survives the job's end that is not a shutdown:
the file is a complete JSON array holding every request that finished before the end.

    python timeline_end_check.py MPIEXEC [mpiexec flags]   (the check: runs the jobs below)
    python timeline_end_check.py --rank MODE               (one rank of a 2-rank job)

Modes (rank 0 holds the timeline):
  raise  rank 0 raises an uncaught exception right after its requests (hora's exception hook
         saves the timeline; mpirun then ends rank 1)
  kill   rank 0 is killed (SIGKILL) 2 s after its requests, as by the launcher or scancel: no code
         of the program runs, and the file holds what the engine flushed (at most 1 s old)
Before, both left nothing under the file's name (it appeared only at shutdown).
"""
import json
import os
import signal
import sys
import tempfile
import time

N = 5


def rank(mode):
    import torch

    import hora.torch as hvd
    hvd.init()
    for i in range(N):
        out = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1)), name=f"before.end.{i}", op=hvd.Sum)
        assert out.tolist() == [3.0] * 4, out
    if hvd.rank() == 0:
        if mode == "raise":
            raise RuntimeError("timeline_end_check: the program fails here on purpose")
        time.sleep(2.0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # mpirun ends this rank once rank 0 is gone
    return 0


def check(mpiexec, flags):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
    from jobrun import run_job
    errors = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("HORA_BINARY_DIR")) as tmp:
        for mode in ("raise", "kill"):
            path = os.path.join(tmp, f"timeline-{mode}.json")
            env = dict(os.environ, HOROVOD_TIMELINE=path)
            out, hung, wall, status = run_job([mpiexec, *flags, "-x", "HOROVOD_TIMELINE", "-np", "2",
                                               sys.executable, os.path.abspath(__file__), "--rank", mode],
                                              env, 60)
            print(out)
            print(f"timeline_end_check {mode}: wall {wall:.1f} s, exit {status}")
            if hung:
                errors.append(f"{mode}: the job did not end within 60 s")
            if status == 0:
                errors.append(f"{mode}: the job succeeded, want a failure")
            if not os.path.exists(path):
                errors.append(f"{mode}: no file {path} (files: {os.listdir(tmp)})")
                continue
            try:
                with open(path) as f:
                    events = json.load(f)
            except ValueError as e:
                errors.append(f"{mode}: {path} is not one JSON array: {e}")
                continue
            rows = {e["args"]["name"] for e in events
                    if e.get("name") == "thread_name" and "args" in e}
            want = {f"allreduce.before.end.{i}" for i in range(N)}
            if not want <= rows:
                errors.append(f"{mode}: rows missing from the timeline: {sorted(want - rows)}")
            spans = [e for e in events if e.get("ph") == "X" and e.get("name") == "ALLREDUCE"]
            if len(spans) < N:
                errors.append(f"{mode}: {len(spans)} ALLREDUCE spans, want at least {N}")
            stray = [n for n in os.listdir(tmp) if n.startswith(".tmp-")]
            if stray:
                errors.append(f"{mode}: temporary files left: {stray}")
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        sys.exit(rank(sys.argv[2]))
    sys.exit(check(sys.argv[1], sys.argv[2:]))
