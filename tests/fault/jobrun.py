"""Shared by fatal_test.py, fault_test.py and tests/python/fatal_check.py: run an mpirun job in its
own process group, kill the whole group when it outlives its limit, and say how long it took; the
checks of a job whose rank crashed."""
import os
import re
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


def crash_checks(out, hung, wall, bound, num, name):
    """The checks every fatal-signal test makes of a 2-rank job whose rank 1 crashed by signal
    `num` (`name`) on its main thread: the job ended within `bound` s, rank 1 printed exactly one
    hora fatal-signal line, naming the main thread, and then its stack (a header and at least one
    frame), mpirun reports the signal, and the rank did not go on ("still alive"). Returns
    (errors, the crash line or "", the stack's text after its header, or None)."""
    errors = []
    if hung or wall > bound:
        errors.append(f"the job took {wall:.0f} s (bound {bound:.0f} s){' and hung' if hung else ''}")
    lines = re.findall(rf"hora: rank 1 \(.*pid \d+, tid \d+(?:, [^)]*)?\): fatal signal {num} \({name}\).*; the process ends now",
                       out)
    if len(lines) != 1:
        errors.append(f"want exactly one hora fatal-signal line for rank 1 and {name}, got {len(lines)}")
    elif ", main thread): fatal signal" not in lines[0]:
        errors.append(f"the line does not name the crashing thread as the main thread: {lines[0]}")
    m = re.search(r"hora: rank 1 \(.*pid \d+, tid \d+\): the stack, innermost frame first:\n((?:.*\n)*)", out)
    stack = m.group(1) if m else None
    if stack is None:
        errors.append("no stack header after the line")
    elif not re.search(r"\[0x[0-9a-f]+\]$", stack, re.M):
        errors.append("the stack has no frame")
    if not re.search(rf"signal {num}\b", out.replace(lines[0] if lines else "", "")):
        errors.append(f"mpirun does not report rank 1 ended by signal {num}")
    if "still alive" in out:
        errors.append("the rank survived its crash")
    return errors, lines[0] if lines else "", stack
