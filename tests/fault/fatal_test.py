#!/usr/bin/env python3
"""fatal_probe under mpirun (2 ranks): the crashing rank (1) must print exactly one line
`hora: rank 1 (... pid P, tid T, main thread): fatal signal N (NAME)...; the process ends now`,
die by that signal (mpirun reports it), with none of Open MPI's backtrace handler ("Process received
signal"), and the job must end within a bound. After the line, the crashing thread's stack: a
header line, then frames of which one is in the probe itself (for `call`, a jump through a NULL
function pointer, the call's own frame is printed first, since the unwinder cannot start at 0).
usage: fatal_test.py MPIEXEC PROBE hora-first|mpi-first segv|call|abort|fpe|bus|ill [mpiexec flags]"""
import os
import re
import sys

from jobrun import crash_checks, run_job

mpiexec, probe, order, kind = sys.argv[1:5]
flags = sys.argv[5:]
names = {"segv": (11, "SIGSEGV"), "call": (11, "SIGSEGV"), "abort": (6, "SIGABRT"), "fpe": (8, "SIGFPE"), "bus": (7, "SIGBUS"),
         "ill": (4, "SIGILL")}
num, name = names[kind]
env = dict(os.environ)
# Sanitizer builds install their own SIGSEGV/SIGBUS/SIGFPE handlers, which hora keeps: let hora's run.
env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0").lstrip(":")
bound = 40.0
out, hung, wall, returncode = run_job([mpiexec, *flags, "-np", "2", probe, order, kind], env, bound + 20)
print(out)
errors, _, stack = crash_checks(out, hung, wall, bound, num, name)
if kind in ("segv", "call") and not re.search(r"fatal signal 11 \(SIGSEGV\) at address 0x[0-9a-f]+, instruction 0x[0-9a-f]+;",
                                               out):
    errors.append("the line does not give the fault address and the faulting instruction")
if kind == "call" and not re.search(r"fatal signal 11 \(SIGSEGV\) at address 0x0, instruction 0x0;", out):
    errors.append("a call through NULL: want address 0x0 and instruction 0x0")
if stack is not None and not re.search(r"^(?:\S*/)?fatal_probe\(.*\)\[0x[0-9a-f]+\]$", stack, re.M):
    errors.append("the stack has no frame in fatal_probe")
if kind == "call" and stack is not None and not re.match(
        r"  \(a jump to a bad address, from the call at:\)\n(?:\S*/)?fatal_probe\(", stack):
    errors.append("a call through NULL: the caller's frame is not printed first")
if "Process received signal" in out:
    errors.append("Open MPI's backtrace handler ran")
print(f"fatal_test {order} {kind}: wall {wall:.1f} s, exit {returncode}")
for e in errors:
    print("FAIL:", e)
sys.exit(1 if errors else 0)
