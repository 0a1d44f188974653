"""A Horovod program's environment settings (HOROVOD_*) and dynamic timeline, end to end (run
alone under mpirun with 2 ranks: init, shutdown and the environment are the process's own).

The program sets its HOROVOD_* variables in os.environ before hvd.init(), as Horovod's own
test_torch.py does, and checks, on every rank: the HORA_* settings they became; the warning of
HOROVOD_AUTOTUNE on rank 0 only; HOROVOD_STALL_SHUTDOWN_TIME_SECONDS failing a request that one
rank never submits, after that long and not much later; HOROVOD_TIMELINE recording from init to
stop_timeline() without cycle markers (Horovod's default), and start_timeline(mark_cycles=True)
recording its own interval into a second file; a missing directory refused on rank 0; ValueError
after shutdown; a HORA_* setting that contradicts its HOROVOD_* counterpart refused at init,
naming both. Exit status 0 when every check holds."""
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

# In the build tree under ctest: a rank that mpirun kills (after its peer failed) leaves nothing
# in /tmp.
tmp = tempfile.mkdtemp(prefix="hora-hvdenv-", dir=os.environ.get("HORA_BINARY_DIR"))
atexit.register(shutil.rmtree, tmp, True)  # also when a check fails
tl_init = os.path.join(tmp, "timeline-init.json")
os.environ.update({
    "HOROVOD_FUSION_THRESHOLD": "33554432",
    "HOROVOD_CYCLE_TIME": "2.5",
    "HOROVOD_CACHE_CAPACITY": "64",
    "HOROVOD_TIMELINE": tl_init,
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "3",
    "HOROVOD_LOG_LEVEL": "warning",
    "HOROVOD_AUTOTUNE": "1",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",  # ignored: no warning
})
for v in ("HORA_FUSION_THRESHOLD", "HORA_CYCLE_TIME_MS", "HORA_CACHE_CAPACITY", "HORA_TIMELINE",
          "HORA_TIMELINE_MARK_CYCLES", "HORA_STALL_WARNING_S", "HORA_STALL_SHUTDOWN_S", "HORA_LOG"):
    os.environ.pop(v, None)

import torch  # noqa: E402

import hora.torch as hvd  # noqa: E402

errors = []


def expect(cond, what):
    if not cond:
        errors.append(what)


try:
    hvd.rank()
    errors.append("rank() before init() did not raise")
except ValueError as e:  # Horovod's type; hora's NotInitializedError is one
    expect(isinstance(e, hvd.NotInitializedError), f"rank() before init: {type(e).__mro__}")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    hvd.init()
me, n = hvd.rank(), hvd.size()
assert n == 2, "run with 2 ranks"
autotune = [str(w.message) for w in caught if "HOROVOD_AUTOTUNE" in str(w.message)]
expect(len(autotune) == (1 if me == 0 else 0), f"rank {me}: HOROVOD_AUTOTUNE warnings {autotune}")
expect(not [w for w in caught if "HIERARCHICAL" in str(w.message)], "a warning for an ignored switch")
want = {"HORA_FUSION_THRESHOLD": "33554432", "HORA_CYCLE_TIME_MS": "2.5",
        "HORA_CACHE_CAPACITY": "64", "HORA_TIMELINE": tl_init, "HORA_TIMELINE_MARK_CYCLES": "0",
        "HORA_STALL_WARNING_S": "1", "HORA_STALL_SHUTDOWN_S": "3", "HORA_LOG": "WARN"}
for k, v in want.items():
    expect(os.environ.get(k) == v, f"{k}={os.environ.get(k)!r}, want {v!r}")

x = torch.arange(1000, dtype=torch.float32) + me
for i in range(3):
    out = hvd.allreduce(x, name=f"env/init/{i}", op=hvd.Sum)
    expect(torch.equal(out, 2 * torch.arange(1000, dtype=torch.float32) + 1), "allreduce sum")

# HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3: rank 1's request that rank 0 never submits fails.
if me == 1:
    t0 = time.monotonic()
    h = hvd.allreduce_async(torch.ones(4), name="env/stalled")
    try:
        hvd.synchronize(h)
        errors.append("a request only rank 1 submitted completed")
    except hvd.HorovodInternalError as e:
        took = time.monotonic() - t0
        expect("env/stalled" in str(e), f"stall error does not name the tensor: {e}")
        expect(2.5 <= took <= 8, f"stalled request failed after {took:.1f} s, want about 3 s")
else:
    time.sleep(5)  # a barrier entered now would itself stall 3 s waiting for rank 1, and fail
hvd.barrier()

hvd.stop_timeline()  # the HOROVOD_TIMELINE recording ends here and is saved at once
hvd.allreduce(x, name="env/between")
tl_dyn = os.path.join(tmp, "timeline-dyn.json")
hvd.start_timeline(tl_dyn, mark_cycles=True)
for i in range(2):
    hvd.allreduce(x, name=f"env/dyn/{i}")
hvd.stop_timeline()
hvd.stop_timeline()  # nothing recording: no error, as Horovod
hvd.barrier()


def rows(path):
    with open(path) as f:
        ev = json.load(f)
    names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    cycles = sum(1 for e in ev if e.get("name") == "CYCLE_START")
    return names, cycles


if me == 0:
    names, cycles = rows(tl_init)
    # Rows are named as Horovod's: "allreduce.<name>".
    expect({"allreduce.env/init/0", "allreduce.env/init/1", "allreduce.env/init/2"} <= names,
           f"{tl_init}: rows {sorted(names)}")
    expect(not any(s.startswith(("allreduce.env/dyn", "allreduce.env/between")) for s in names),
           f"{tl_init} records past stop_timeline: {sorted(names)}")
    expect(cycles == 0, f"{tl_init}: {cycles} cycle markers without HOROVOD_TIMELINE_MARK_CYCLES")
    names, cycles = rows(tl_dyn)
    expect(names == {"allreduce.env/dyn/0", "allreduce.env/dyn/1"}, f"{tl_dyn}: rows {sorted(names)}")
    expect(cycles >= 1, f"{tl_dyn}: no cycle markers with mark_cycles=True")
    try:
        hvd.start_timeline(os.path.join(tmp, "no-such-dir", "t.json"))
        errors.append("start_timeline into a missing directory did not raise on rank 0")
    except OSError as e:
        expect("no-such-dir" in str(e), f"missing directory error: {e}")
else:
    hvd.start_timeline(os.path.join(tmp, "no-such-dir", "t.json"))  # only rank 0 opens it
    expect(not os.path.exists(os.path.join(tmp, "no-such-dir")), "rank 1 made the directory")
hvd.shutdown()

try:
    hvd.start_timeline(tl_dyn)
    errors.append("start_timeline after shutdown did not raise")
except ValueError:
    pass

# A HORA_* setting that contradicts its HOROVOD_* counterpart: refused before MPI is touched.
os.environ["HORA_CYCLE_TIME_MS"] = "7"
try:
    hvd.init()
    errors.append("init() took HORA_CYCLE_TIME_MS=7 beside HOROVOD_CYCLE_TIME=2.5")
except ValueError as e:
    expect("HOROVOD_CYCLE_TIME" in str(e) and "HORA_CYCLE_TIME_MS=7" in str(e), f"conflict: {e}")
expect(not hvd.is_initialized(), "initialized after a refused init()")

if errors:
    print(f"rank {me}: FAILED:\n  " + "\n  ".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"rank {me}: horovod_env_check passed")
