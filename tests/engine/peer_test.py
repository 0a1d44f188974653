#!/usr/bin/env python3
"""Run test_engine_peer under mpirun and assert that every survivor fails within the peer timeout
plus a margin of the victim's stop (or death), and the job ends soon after, with a message naming
the dead (or stopped) rank; for the SIGSTOP modes the message must be hora's own HORA_ERR_REMOTE
(mpirun cannot see a stopped process).
usage: peer_test.py MPIEXEC BINARY NP MODE PEER_TIMEOUT_S [mpiexec flags...]"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

mpiexec, binary, np_, mode, timeout = sys.argv[1:6]
flags = sys.argv[6:]
timeout = float(timeout)
# Under the sanitizers (tests/run.sh's ASan pass), beside other tests on the same cores, a rank's
# heartbeat thread was once not run for longer than 3 s (and a 4-rank job took 25 s to fail at
# start-up instead of 2): 3x there, as tests/fault/fault_test.py does.
if "ASAN_OPTIONS" in os.environ:
    timeout *= 3
# HORA_LOG=INFO for the engine: each survivor logs, at the verdict, the longest stall of its
# heartbeat thread (heartbeat.c), which delays the verdict by as long.
env = dict(os.environ, HORA_PEER_TIMEOUT_S=str(timeout), HORA_LOG="INFO", HORA_LOG_SUBSYS="ENGINE")
victim = 0 if mode.startswith("stop0") else 1
if mode == "stopinit":
    # hora_init's watchdog (runtime/init/init.c) ends the survivors after 2 x this.
    env["HORA_INIT_TIMEOUT_S"] = str(timeout)
ckpt_dir = None
if mode in ("stop0save", "stopopen"):
    ckpt_dir = tempfile.mkdtemp(prefix="hora-peer-ckpt-")
    env["HORA_TEST_CKPT_DIR"] = ckpt_dir
# The detection, from the victim's stop (or death) to the last survivor's error, both on
# CLOCK_MONOTONIC (printed by the program as "at t=..."): the timeout, a heartbeat period and the
# survivors waking; under a loaded machine the 20 steps before the stop may take many seconds
# (CI's ASan pass: 25.5 s from the loop's start to the errors), which says nothing about hora.
detect_bound = timeout + 3.0
teardown_bound = 10.0  # from the last error to the job's end: mpirun killing the rest
hang_guard = 60 + timeout + 30  # the program's own loop gives up after 60 s
t0 = time.monotonic()
try:
    p = subprocess.run([mpiexec, *flags, "-np", np_, binary, mode], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=hang_guard)
    out = p.stdout.decode(errors="replace")
except subprocess.TimeoutExpired as e:
    print((e.stdout or b"").decode(errors="replace"))
    print(f"FAIL: the job hung (still running after {hang_guard:.0f} s)")
    sys.exit(1)
finally:
    if ckpt_dir:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
t_end = time.monotonic()
wall = t_end - t0
print(out)
# A heartbeat thread that the machine did not run delays the verdict by as long: that is the
# machine's delay, not hora's, so the detection bound grows by the longest stall a watcher
# logged. A late verdict without such a stall still fails.
stalls = [float(x) for x in re.findall(r"longest stall of this thread ([0-9.]+) s", out)]
if stalls:
    detect_bound += max(stalls)
errors = []
stop = re.search(rf"rank {victim}: raising \S+ (?:before \S+ )?at step \d+ at t=([0-9.]+)", out)
fails = {int(r): float(t) for r, t in re.findall(r"rank (\d+): step \d+: .* failed after [0-9.]+ s at t=([0-9.]+)", out)}
if not stop:
    errors.append(f"rank {victim} never printed its stop")
elif victim in fails:
    errors.append(f"the stopped rank {victim} printed an error")
# mpirun ends the job when the first survivor exits with its error, so a second survivor whose
# heartbeat thread is still stalled may be killed before it prints (CI's ASan pass: one watcher
# stalled 8.8 s): the first error bounds the detection, and every error printed must be right.
if stop and fails:
    detect = min(fails.values()) - float(stop.group(1))
    print(f"peer_test {mode} np={np_}: detection {detect:.1f} s after the stop (bound {detect_bound:.1f} s; "
          f"longest heartbeat-thread stall {max(stalls, default=0):.2f} s), job end {t_end - min(fails.values()):.1f} s "
          f"after the first error (bound {teardown_bound:.0f} s), wall {wall:.1f} s")
    if detect > detect_bound:
        errors.append(f"the first survivor failed {detect:.1f} s after the stop, bound {detect_bound:.1f} s")
    if t_end - min(fails.values()) > teardown_bound:
        errors.append(f"the job ended {t_end - min(fails.values()):.1f} s after the first error, bound {teardown_bound:.0f} s")
elif stop and mode == "stopinit":
    # The survivors are inside hora_init's start-up collectives: the watchdog ends them (no
    # "failed" line) 2 x HORA_INIT_TIMEOUT_S after hora_init began, and mpirun the job.
    end, bound = t_end - float(stop.group(1)), 2 * timeout + 3.0 + max(stalls, default=0) + teardown_bound
    print(f"peer_test stopinit np={np_}: job end {end:.1f} s after the stop (bound {bound:.1f} s), wall {wall:.1f} s")
    if end > bound:
        errors.append(f"the job ended {end:.1f} s after the stop, bound {bound:.1f} s")
    if "has not returned after" not in out:
        errors.append("no survivor printed hora_init's watchdog message")
    # The victim stopped before its hora_init: the survivors wait in its first collective.
    elif "the step it waits in: MPI_Comm_dup of the world communicator, for " not in out:
        errors.append("the watchdog's message does not name the step, MPI_Comm_dup of the world communicator")
elif stop and mode == "kill":
    # mpirun may end the job before any survivor prints: the job's end, from the death.
    end = t_end - float(stop.group(1))
    print(f"peer_test kill np={np_}: job end {end:.1f} s after the kill (bound "
          f"{detect_bound + teardown_bound:.1f} s), wall {wall:.1f} s")
    if end > detect_bound + teardown_bound:
        errors.append(f"the job ended {end:.1f} s after the kill, bound {detect_bound + teardown_bound:.1f} s")
elif mode != "kill":
    errors.append("no survivor printed its error")
if p.returncode == 0:
    errors.append("the job exited 0")
if "NOT DETECTED" in out:
    errors.append("a survivor never noticed the dead rank")
if mode == "stopinit":
    pass  # no heartbeat yet: the watchdog's message, checked above
elif mode == "kill":
    if f"rank {victim}" not in out:
        errors.append(f"no message names rank {victim}")
else:
    want = f"rank {victim} sent no heartbeat"
    if want not in out or "HORA_ERR_REMOTE" not in out:
        errors.append(f"no HORA_ERR_REMOTE message with '{want}'")
# The survivors were waiting in hora_should_stop (stopshould), in hora_barrier (stopbarrier), in
# hora_ckpt_save for rank 0's result (stop0save), in hora_ckpt_open's communicator (stopopen) or in the first blocking
# allreduce's shared window (stopwin): each that printed its error (at least one did, above)
# must have left that call at step 20 with the verdict.
# (call, what the verdict's message must say besides naming the victim, the survivors)
expect = {"stopshould": ("hora_should_stop", "hora_should_stop: ", (0, 2)),
          "stopbarrier": ("hora_barrier", "hora_barrier: ", (0, 2)),
          "stop0save": ("hora_ckpt_save", "hora_ckpt_save (waiting for the result from rank 0): ", (1, 2)),
          "stopopen": ("hora_ckpt_open", "hora_ckpt_open (duplicating the communicator): ", (0, 2)),
          "stopwin": ("hora_allreduce", "shm allreduce (creating the shared window): ", (0, 2))}
if mode in expect:
    call, what, survivors = expect[mode]
    for r in (r for r in survivors if r in fails):
        if f"rank {r}: step 20: {call} failed" not in out:
            errors.append(f"rank {r} did not leave {call} at step 20 with an error")
    if f"{what}rank {victim} sent no heartbeat" not in out:
        errors.append(f"no error says '{what}rank {victim} sent no heartbeat'")
for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
