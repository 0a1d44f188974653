#!/usr/bin/env python3
"""Runs test_elastic_remote under mpirun and judges it by what every rank printed: after a peer
failure hora_finalize leaves MPI unfinalized (docs/design.md), so mpirun's own status says
"exited improperly" whatever happened. Every rank must print "test_elastic_remote: rank R ok",
none FAILED, and the job must end (no hang) within the bound.

    elastic_remote_test.py MPIEXEC PROGRAM NP [MPIEXEC_FLAGS...]
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from jobrun import run_job  # noqa: E402


def main():
    mpiexec, prog, np = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cmd = [mpiexec, *sys.argv[4:], "-np", str(np), prog]
    out, hung, wall, rc = run_job(cmd, dict(os.environ), 90)
    print(out)
    oks = {int(r) for r in re.findall(r"test_elastic_remote: rank (\d+) ok", out)}
    errors = []
    if hung:
        errors.append(f"the job still ran after {wall:.0f} s (a hang)")
    if oks != set(range(np)):
        errors.append(f"ranks that passed: {sorted(oks)}, want 0..{np - 1}")
    if "FAILED" in out:
        errors.append("a rank FAILED")
    print(f"wall {wall:.1f} s, mpirun status {rc}")
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
