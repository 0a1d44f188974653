#!/usr/bin/env python3
"""A frozen machine is not a dead peer: every rank of a job is stopped at the same moment (SIGSTOP
to all of them, as when a virtual machine's vCPUs or a whole node stall) for 2.5 x
HORA_PEER_TIMEOUT_S, then resumed together. No rank may then declare another dead: while its own
heartbeat thread was not running it heard nothing, and nothing was sent to it either. (Before the
heartbeat measured silences on its own clock, every rank declared every other dead on waking.)

The job is `hora-bench allreduce` over the shared-memory and ring algorithms, whose every result
element is checked: it must exit 0 with "#wrong total: 0", and its log must hold no
HORA_ERR_REMOTE. The freeze lands while the ranks are inside a timed loop of allreduces.

usage: freeze_test.py MPIEXEC HORA_BENCH NP [mpiexec flags...]"""
import os
import re
import signal
import subprocess
import sys
import time

mpiexec, bench, np_ = sys.argv[1:4]
flags = sys.argv[4:]
np_ = int(np_)
PEER_S = 2.0
FREEZE_S = 2.5 * PEER_S
LIMIT_S = 120.0
env = dict(os.environ, HORA_PEER_TIMEOUT_S=str(PEER_S), HORA_LOG="INFO", HORA_LOG_SUBSYS="ENGINE")
# About 3 s of timed allreduces per algorithm on an idle machine: long enough for the freeze to land inside.
cmd = [mpiexec, *flags, "-np", str(np_), bench, "allreduce", "--algo", "shm,ring", "--min-bytes", "64K",
       "--max-bytes", "64K", "--iters", "60000", "--warmup", "10"]
p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
errors = []
lines = []
# The ranks print the table header once every rank runs (after hora_init): then freeze them.
pids = []
t_start = time.monotonic()
for line in p.stdout:
    lines.append(line)
    if "size(B)" in line:
        break
time.sleep(0.3)  # inside the first algorithm's warm-up or timed loop
out = subprocess.run(["pgrep", "-f", "-P", str(p.pid), os.path.basename(bench)], capture_output=True, text=True).stdout
pids = [int(x) for x in out.split()]
if len(pids) != np_:
    errors.append(f"want {np_} rank processes under mpirun, found {pids}")
for pid in pids:
    os.kill(pid, signal.SIGSTOP)
t_freeze = time.monotonic()
time.sleep(FREEZE_S)
for pid in pids:
    os.kill(pid, signal.SIGCONT)
print(f"freeze_test: froze ranks {pids} for {time.monotonic() - t_freeze:.2f} s "
      f"(HORA_PEER_TIMEOUT_S={PEER_S})", flush=True)
try:
    rest, _ = p.communicate(timeout=LIMIT_S)
except subprocess.TimeoutExpired:
    os.killpg(p.pid, signal.SIGKILL)
    rest, _ = p.communicate()
    errors.append(f"the job hung: still running {LIMIT_S:.0f} s after the freeze")
text = "".join(lines) + rest
print(text)
if p.returncode != 0:
    errors.append(f"the job exited with {p.returncode}")
if "#wrong total: 0" not in text:
    errors.append("no '#wrong total: 0' line")
for bad in ("HORA_ERR_REMOTE", "sent no heartbeat", "AddressSanitizer", "runtime error:"):
    if bad in text:
        errors.append(f"output contains '{bad}'")
# Every rank's heartbeat saw the freeze as its own stall (the margins line at finalize).
stalls = [float(x) for x in re.findall(r"longest stall of this thread ([\d.]+) s", text)]
if len(stalls) != np_ or min(stalls, default=0) < FREEZE_S - 0.5:
    errors.append(f"want every rank's heartbeat to report a stall of about {FREEZE_S:.1f} s, got {stalls}")
for e in errors:
    print("FAIL:", e)
print(f"freeze_test np={np_}: {'FAILED' if errors else 'passed'}")
sys.exit(1 if errors else 0)
