#!/usr/bin/env python3
"""Fault injection on the real test Slurm cluster: tests/fault's probe started the way jobs start,
`srun --mpi=pmix launch -- fault_probe DIR`, on 2 nodes x 2 ranks, with HORA_TEST_FAULT:

    test_fault_slurm.py CASE        CASE: step:mute, step:segv, restore:kill, reader:exit

Each job must end within a bound, with no heap error and no process left behind on any node;
step:mute must show HORA_ERR_REMOTE naming the silent rank on the others, step:segv exactly one
fatal-signal line from the crashing rank and no Open MPI backtrace.
Environment (set by ctest): SLURM_CONF, CLUSTER_SH, LAUNCH, FAULT_PROBE, WORK_DIR. Exits 77 when
the cluster is not running."""
import os
import re
import subprocess
import sys
import tempfile
import time


def main():
    case = sys.argv[1]
    if subprocess.run(["bash", os.environ["CLUSTER_SH"], "status"], capture_output=True).returncode != 0:
        print("SKIP: the test Slurm cluster is not running")
        return 77
    stage, kind = case.split(":")
    victim = 3
    os.makedirs(os.environ["WORK_DIR"], exist_ok=True)
    work = tempfile.mkdtemp(dir=os.environ["WORK_DIR"], prefix=f"fault-{stage}-{kind}-")
    steps = "600 50" if kind == "mute" else "20 0"
    script = (f"#!/bin/bash\nexport HORA_TEST_FAULT={stage}:{kind}:{victim} HORA_PEER_TIMEOUT_S=3\n"
              f"srun --mpi=pmix {os.environ['LAUNCH']} -- {os.environ['FAULT_PROBE']} {work}/probe {steps}\n")
    path = os.path.join(work, "job.sh")
    with open(path, "w") as f:
        f.write(script)
    out = os.path.join(work, "out.txt")
    bound = 90.0
    t0 = time.time()
    sub = subprocess.run(["sbatch", "--parsable", "--time=4", "-N2", "--ntasks-per-node=2", "-o", out,
                          "--chdir", work, path], capture_output=True, text=True)
    if sub.returncode != 0:
        print(sub.stderr)
        print("FAIL: sbatch")
        return 1
    job = sub.stdout.strip().split(";")[0]
    state = ""
    while time.time() - t0 < bound + 60:
        info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
        m = re.search(r"JobState=(\S+)", info)
        state = m.group(1) if m else ""
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.3)
    wall = time.time() - t0
    subprocess.run(["scancel", job], capture_output=True)
    # A process still exiting when the job's state changes (killed ranks, launch, on a loaded
    # machine) is not left behind: one still there 15 s later is.
    t_end = time.time()
    while True:
        left = subprocess.run(["pgrep", "-f", f"{work}/probe"], capture_output=True, text=True).stdout.split()
        if not left or time.time() - t_end > 15:
            break
        time.sleep(0.5)
    for pid in left:  # leave nothing running even when the test fails
        subprocess.run(["kill", "-9", pid], capture_output=True)
    text = open(out).read() if os.path.exists(out) else ""
    print(text)
    errors = []
    if wall > bound:
        errors.append(f"the job took {wall:.0f} s (bound {bound:.0f} s), ended {state}")
    if state == "COMPLETED":
        errors.append("the job COMPLETED after a fault")
    if left:
        errors.append(f"processes left behind after the job ended: {left}")
    for bad in ("AddressSanitizer", "runtime error:", "malloc():", "free():", "double free", "corrupted",
                "Process received signal"):
        if bad in text:
            errors.append(f"output contains '{bad}'")
    if f"injecting '{kind}' at {stage} on rank {victim}" not in text:
        errors.append("the fault was not injected")
    if kind == "mute" and not re.search(rf"rank {victim} sent no heartbeat", text):
        errors.append(f"no HORA_ERR_REMOTE message names rank {victim}")
    if kind == "segv":
        n = len(re.findall(rf"hora: rank {victim} \(node n2, .*fatal signal 11 \(SIGSEGV\)", text))
        if n != 1:
            errors.append(f"want one fatal-signal line from rank {victim} on n2, got {n}")
    print(f"fault on Slurm {case}: job {job} {state} in {wall:.1f} s")
    for e in errors:
        print("FAIL:", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
