"""A rank of a Python program that crashes in native code after hora.init() says where:
Python's faulthandler prints the Python stack (hora.init() enables it), then hora's handler its
line and the C stack, and the process ends by the signal, so mpirun ends the job within a bound.

    python fatal_check.py MPIEXEC [mpiexec flags]   (the check: runs the 2-rank job below)
    python fatal_check.py --rank                    (one rank of that job)
"""
import os
import re
import sys
import time


def crash_in_native_code():
    import ctypes
    ctypes.string_at(0)  # strlen(NULL): SIGSEGV inside libc


def rank():
    import numpy as np

    import hora
    hora.init()
    total = hora.allreduce(np.ones(4, np.float32), op=hora.Sum)
    assert total.tolist() == [2.0] * 4, total
    if hora.rank() == 1:
        sys.stdout.flush()
        crash_in_native_code()
        print("fatal_check: rank 1 still alive", flush=True)
        return 1
    time.sleep(60)  # mpirun must end this rank once rank 1 dies
    return 0


def check(mpiexec, flags):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
    from jobrun import crash_checks, run_job
    bound = 40.0
    out, hung, wall, status = run_job([mpiexec, *flags, "-np", "2", sys.executable, os.path.abspath(__file__),
                                       "--rank"], dict(os.environ), bound + 20)
    print(out)
    errors, line, _ = crash_checks(out, hung, wall, bound, 11, "SIGSEGV")
    if out.count("Fatal Python error: Segmentation fault") != 1:
        errors.append("want one 'Fatal Python error: Segmentation fault' (Python's faulthandler)")
    py = re.search(r'File "[^"]*fatal_check\.py", line (\d+) in crash_in_native_code', out)
    if not py:
        errors.append("the Python stack does not name crash_in_native_code in fatal_check.py")
    if py and line and out.index(py.group(0)) > out.index(line):
        errors.append("hora's line came before the Python stack")
    print(f"fatal_check: wall {wall:.1f} s, exit {status}")
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(rank() if sys.argv[1:] == ["--rank"] else check(sys.argv[1], sys.argv[2:]))
