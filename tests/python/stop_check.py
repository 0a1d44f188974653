"""A stopped peer in a blocking call from Python: hora.RemoteError (a hora.HorovodInternalError, a
RuntimeError) naming it, within HORA_PEER_TIMEOUT_S plus a second; then hora.shutdown() returns.
Run alone under mpirun with 2 ranks and HORA_PEER_TIMEOUT_S=1.5: rank 1 stops itself (SIGSTOP)
between two allreduces, rank 0 is then inside the next one; rank 0 kills rank 1 at the end.
Exit status 0 when every check holds (rank 1 never exits by itself: it is killed)."""
import os
import signal
import sys
import threading
import time

import numpy as np

import hora

stalls = []  # (from, to): intervals in which this process was not run


def stall_meter():
    """Records each 10 ms sleep that came back over 50 ms late: time a loaded machine did not run
    this process (the C stop tests' stall meter, tests/fault/stop_probe.c). The bounds below do
    not count it; a rank that runs and does not return still fails them."""
    last = time.monotonic()
    while True:
        time.sleep(0.01)
        now = time.monotonic()
        if now - last > 0.06:
            stalls.append((last + 0.01, now))
        last = now


def stalled(t0, t1):
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in list(stalls))


threading.Thread(target=stall_meter, daemon=True).start()
hora.init()
me, n = hora.rank(), hora.size()
assert n == 2, "run with 2 ranks"
timeout_s = float(os.environ["HORA_PEER_TIMEOUT_S"])
pids = hora.allgather(np.array([os.getpid()], dtype=np.int64)).tolist()
x = np.full(1000, me + 1, dtype=np.float32)
for _ in range(20):
    assert hora.allreduce(x, op=hora.Sum).tolist() == [3.0] * 1000
# Let the heartbeats flow first: a peer never heard from is watched with HORA_INIT_TIMEOUT_S
# (300 s), not HORA_PEER_TIMEOUT_S (hora.h), and 20 small allreduces can take less than one
# heartbeat period.
time.sleep(1.0)
hora.barrier()
errors = []
if me == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # hangs here until rank 0 kills it
    sys.exit(3)
time.sleep(0.2)  # rank 1 has stopped itself by now (or is about to: the bound below still holds)
t0 = time.monotonic()
try:
    hora.allreduce(x, op=hora.Sum)
    errors.append("allreduce returned with its peer stopped")
except hora.RemoteError as e:
    t1 = time.monotonic()
    took, lost = t1 - t0, stalled(t0, t1)
    if not isinstance(e, hora.HorovodInternalError) or not isinstance(e, RuntimeError):
        errors.append(f"RemoteError is not a HorovodInternalError/RuntimeError: {type(e).__mro__}")
    if "rank 1" not in str(e):
        errors.append(f"the message does not name rank 1: {e}")
    if took - lost > timeout_s + 1.0:
        errors.append(f"RemoteError after {took:.2f} s ({lost:.2f} s of them not run), bound "
                      f"{timeout_s + 1.0:.1f} s")
    print(f"rank 0: hora.RemoteError after {took:.2f} s ({lost:.2f} s of them not run): {e}", flush=True)
try:
    hora.barrier()
    errors.append("barrier after the failure returned")
except hora.RemoteError:
    pass
t0 = time.monotonic()
try:
    hora.shutdown()
except hora.HoraError:
    pass  # shutdown reports the failure; it must return
t1 = time.monotonic()
if t1 - t0 - stalled(t0, t1) > 5.0:
    errors.append(f"hora.shutdown took {t1 - t0:.1f} s ({stalled(t0, t1):.2f} s of them not run)")
for e in errors:
    print("ERROR:", e, flush=True)
os.kill(pids[1], signal.SIGKILL)
print("OK" if not errors else "FAILED", flush=True)
os._exit(1 if errors else 0)
