#!/usr/bin/env python3
"""examples/mnist/job.sbatch exactly as the README and docs/mnist.md show it: `sbatch
examples/mnist/job.sbatch` from a directory holding build/bin (launch, mnist) and the Fashion-MNIST
record shards in build/mnist-demo/fashion, with no variable set (no LAUNCH_ARGS: launch binds each
node's ranks to that node's CPUs, which cluster.sh gives every fake node, as real nodes have).
The job must train to the result line, end COMPLETED, and no rank may be declared dead.

Environment (set by ctest): SLURM_CONF, CLUSTER_SH, HORA_BIN, JOB_SBATCH, WORK_DIR; EPOCHS is
passed through when set (the script's default, 10 epochs, takes minutes on a 2-core machine).
Exits 77 when the cluster is not running or Fashion-MNIST (Debian's dataset-fashion-mnist) is
missing."""
import os
import re
import subprocess
import sys
import tempfile
import time

FASHION = "/usr/share/datasets/fashion-mnist"


def main():
    if subprocess.run(["bash", os.environ["CLUSTER_SH"], "status"], capture_output=True).returncode != 0:
        print("SKIP: the test Slurm cluster is not running")
        return 77
    if not os.path.isdir(FASHION):
        print(f"SKIP: no Fashion-MNIST at {FASHION}")
        return 77
    bin_dir = os.path.abspath(os.environ["HORA_BIN"])
    os.makedirs(os.environ["WORK_DIR"], exist_ok=True)
    work = tempfile.mkdtemp(dir=os.environ["WORK_DIR"], prefix="mnist-job-")
    # The layout the script's defaults expect, relative to the submit directory.
    os.makedirs(os.path.join(work, "build"))
    os.symlink(bin_dir, os.path.join(work, "build", "bin"))
    data = os.path.join(work, "build", "mnist-demo", "fashion")
    os.makedirs(data)
    for split, shards in (("train", "8"), ("test", "2")):
        subprocess.run([os.path.join(bin_dir, "hora-records"), "convert-idx", FASHION, "--split", split,
                        "--shards", shards, "--out", data], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HORA_BIN", "DATA", "BATCH", "EXTRA", "LAUNCH_ARGS") and not k.startswith("HORA_")}
    epochs = os.environ.get("EPOCHS")
    limit = 1500 if not epochs else 300 + 150 * int(epochs)
    sub = subprocess.run(["sbatch", "--parsable", os.environ["JOB_SBATCH"]], capture_output=True, text=True,
                         env=env, cwd=work)
    if sub.returncode != 0:
        print(sub.stderr)
        print("FAIL: sbatch")
        return 1
    job = sub.stdout.strip().split(";")[0]
    out = os.path.join(work, f"mnist-{job}.out")
    t0, state = time.time(), ""
    try:
        while time.time() - t0 < limit:
            info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
            m = re.search(r"JobState=(\S+)", info)
            state = m.group(1) if m else ""
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                break
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    text = open(out).read() if os.path.exists(out) else ""
    print(text)
    errors = []
    if state != "COMPLETED":
        errors.append(f"job {job} ended {state or 'unknown'} after {time.time() - t0:.0f} s (limit {limit} s)")
    m = re.search(r"test_accuracy=([0-9.]+) images_per_s=\d+ ranks=4\s*$", text)
    if not m:
        errors.append("no result line with ranks=4 at the end of the log")
    elif float(m.group(1)) < 0.7:
        errors.append(f"test accuracy {m.group(1)} < 0.7")
    for bad in ("HORA_ERR_REMOTE", "sent no heartbeat", "no heartbeat from", "fatal signal"):
        if bad in text:
            errors.append(f"the log says '{bad}'")
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"PASS: job {job} COMPLETED in {time.time() - t0:.0f} s, test accuracy {m.group(1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
