#!/usr/bin/env python3
"""The hang paths of issue 14: one rank leaves the others waiting without dying (it finalized
early, it is stopped before a process-set creation, it is stopped right after a late first
heartbeat, it never calls while alive on another node), and every rank must end in bounded time
with the error that names it. hang_probe.c says what each case does; this driver runs it once
under mpirun with a hard limit and checks every rank's result lines:

  finalize  every other rank: the allreduce fails with HORA_ERR_REMOTE saying the victim called
            hora_finalize, within a second; every rank, the victim too: hora_finalize returns
            within HORA_PEER_TIMEOUT_S plus a few seconds
  async     as finalize, with an async allreduce the victim never submits: HORA_ERR_SHUTDOWN
            naming the victim within a second, and a later submit fails with HORA_ERR_SHUTDOWN
  pset      every other rank: hora_process_set_create fails with HORA_ERR_REMOTE naming the victim
            within HORA_PEER_TIMEOUT_S plus a second and a half
  destroy   every other rank: hora_process_set_destroy of a set the (stopped) victim is in returns
            HORA_ERR_REMOTE within HORA_PEER_TIMEOUT_S plus 4 s, and hora_finalize after it
  early     every other rank: the allreduce fails with HORA_ERR_REMOTE naming the victim within
            HORA_PEER_TIMEOUT_S plus a second and a half (HORA_INIT_TIMEOUT_S is 120 s here)
  psetfin   as finalize, on a process set of all ranks: the message names the set too
  stall, psetstall (the same on a process set of all ranks)
            every other rank: the stall warning naming the victim after HORA_STALL_WARNING_S, then
            HORA_ERR_TIMEOUT naming it about HORA_STALL_SHUTDOWN_S into the call; the victim's
            late call fails (HORA_ERR_REMOTE or HORA_ERR_TIMEOUT) at once

usage: hang_test.py MPIEXEC PROBE NP CASE VICTIM [mpiexec flags...]"""
import os
import re
import sys

from jobrun import run_job

mpiexec, probe, np_, case, victim = sys.argv[1:6]
flags = sys.argv[6:]
np_, victim = int(np_), int(victim)
PEER_S, WARN_S, STOP_S = 2.0, 1.0, 3.0
env_extra = {"HORA_PEER_TIMEOUT_S": str(PEER_S), "HORA_INIT_TIMEOUT_S": "120"}
if case == "early":
    env_extra["HORA_TEST_FAULT"] = f"init:late:{victim}"
if case in ("stall", "psetstall"):
    env_extra.update(HORA_STALL_WARNING_S=str(WARN_S), HORA_STALL_SHUTDOWN_S=str(STOP_S))
env = dict(os.environ, **env_extra)
# Start-up on a loaded 2-core machine, the case (a few timeouts), the ranks' holds, teardown.
limit = 90.0
out, hung, wall, returncode = run_job([mpiexec, *flags, "-np", str(np_), probe, case, str(victim)], env, limit)
print(out)
errors = []
if hung:
    errors.append(f"the job hung: still running after {limit:.0f} s")
for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:", "double free", "corrupted"):
    if bad in out:
        errors.append(f"output contains '{bad}'")
lines = {}
for r, step, rc, secs, msg in re.findall(r"HANG_PROBE rank (\d+) (\w+) (\S+) in ([\d.]+) s: (.*)", out):
    lines[(int(r), step)] = (rc, float(secs), msg)
others = [r for r in range(np_) if r != victim]


def want(r, step, rc_names, max_s, pattern=None, min_s=0.0):
    got = lines.get((r, step))
    if got is None:
        errors.append(f"rank {r}: no '{step}' result (a hang, or it died)")
        return
    rc, secs, msg = got
    if rc not in rc_names:
        errors.append(f"rank {r} {step}: {rc}, want {'/'.join(rc_names)} ({msg})")
    if secs > max_s or secs < min_s:
        errors.append(f"rank {r} {step}: took {secs:.2f} s, want {min_s:.1f} .. {max_s:.1f} s")
    if pattern and not re.search(pattern, msg):
        errors.append(f"rank {r} {step}: message does not match '{pattern}': {msg}")


for r in range(np_):
    if (r, "warmup") in lines:
        errors.append(f"rank {r}: the warm-up allreduces failed: {lines[(r, 'warmup')]}")
names_victim = rf"\brank {victim}\b"
if case == "finalize":
    for r in others:
        want(r, "call", ["HORA_ERR_REMOTE"], 1.0, rf"rank {victim} called hora_finalize")
    for r in range(np_):
        want(r, "finalize", ["HORA_SUCCESS", "HORA_ERR_REMOTE"], PEER_S + 6.0)
elif case == "psetfin":
    for r in others:
        want(r, "call", ["HORA_ERR_REMOTE"], 1.0, rf"rank {victim} called hora_finalize.*process set")
    for r in range(np_):
        want(r, "finalize", ["HORA_SUCCESS", "HORA_ERR_REMOTE"], PEER_S + 6.0)
elif case == "async":
    for r in others:
        want(r, "call", ["HORA_ERR_SHUTDOWN"], 1.0, rf"rank {victim} called hora_finalize")
        want(r, "submit_after", ["HORA_ERR_SHUTDOWN"], 0.5, rf"after rank {victim} called hora_finalize")
    for r in range(np_):
        want(r, "finalize", ["HORA_SUCCESS", "HORA_ERR_REMOTE"], PEER_S + 6.0)
elif case == "destroy":
    for r in others:
        want(r, "call", ["HORA_ERR_REMOTE"], PEER_S + 4.0, rf"^hora_process_set_destroy: .*{names_victim}")
        want(r, "finalize", ["HORA_SUCCESS", "HORA_ERR_REMOTE"], 5.0)
elif case in ("pset", "early"):
    for r in others:
        want(r, "call", ["HORA_ERR_REMOTE"], PEER_S + 1.5, names_victim)
        want(r, "finalize", ["HORA_SUCCESS", "HORA_ERR_REMOTE"], 5.0)
elif case in ("stall", "psetstall"):
    for r in others:
        want(r, "call", ["HORA_ERR_TIMEOUT"], STOP_S + 1.5, rf"rank {victim}\b.*did not call", min_s=STOP_S - 0.2)
        want(r, "finalize", ["HORA_SUCCESS", "HORA_ERR_REMOTE", "HORA_ERR_TIMEOUT"], 5.0)
    want(victim, "late_call", ["HORA_ERR_REMOTE", "HORA_ERR_TIMEOUT"], 1.0)
    warned = re.findall(rf"\[(\d+)\] hora WARN .*hora_allreduce: waited \d+ s for rank {victim} to call it too", out)
    if sorted(set(int(w) for w in warned)) != others:
        errors.append(f"want the stall warning naming rank {victim} from ranks {others}, got it from {sorted(set(warned))}")
else:
    errors.append(f"unknown case {case}")
print(f"hang_test {case} np={np_} victim={victim}: wall {wall:.1f} s, exit {returncode}")
for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
