"""Shared by fatal_test.py and fault_test.py: run an mpirun job in its own process group, kill the
whole group when it outlives its limit, and say how long it took."""
import os
import signal
import subprocess
import time


def run_job(cmd, env, timeout_s):
    """(output text, hung, wall seconds, exit status) of `cmd`; a job still running after
    timeout_s seconds is killed with its whole process group (hung = True)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        hung = True
    return out.decode(errors="replace"), hung, time.monotonic() - t0, p.returncode
