#!/usr/bin/env python3
"""Preemption on the real test Slurm cluster (tests/slurm/cluster.sh): examples/slurm/requeue.sbatch
runs ckpt_probe on 2 nodes x 2 tasks; the test sends SIGUSR1 (scancel -s USR1) mid-run; the program
checkpoints, flushes to the persistent directory and exits with HORA_EXIT_REQUEUE; the script
requeues the job. The node-local checkpoints are then deleted (the rerun may land on other nodes),
the requeued job is released, and its rerun (SLURM_RESTART_COUNT=1) must resume from the persistent
copy exactly at the step the first run stopped at, and finish.

Environment (set by ctest): SLURM_CONF, CLUSTER_SH, LAUNCH, CKPT_PROBE, REQUEUE_SBATCH, WORK_DIR.
Exits 77 when the cluster is not running."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ERRORS = []
STEPS = 80


def check(cond, msg):
    if not cond:
        ERRORS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def job_info(job):
    info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
    state = re.search(r"JobState=(\S+)", info)
    restarts = re.search(r"Restarts=(\d+)", info)
    return (state.group(1) if state else ""), (int(restarts.group(1)) if restarts else 0), info


def wait_for(pred, timeout, what):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.2)
    check(False, f"timed out after {timeout} s waiting for {what}")
    return False


def read(path):
    return open(path).read() if os.path.exists(path) else ""


def main():
    if subprocess.run(["bash", os.environ["CLUSTER_SH"], "status"], capture_output=True).returncode != 0:
        print("the test Slurm cluster is not running (cluster.sh start could not start it): skipped")
        return 77
    os.makedirs(os.environ["WORK_DIR"], exist_ok=True)
    d = tempfile.mkdtemp(dir=os.environ["WORK_DIR"])
    persist = os.path.join(d, "persist")
    out = os.path.join(d, "out.txt")
    # Node-local storage of this test only (hora's default local_dir is $SLURM_TMPDIR/hora-ckpt;
    # sbatch exports the environment to the job). Without it the default /tmp/hora-$SLURM_JOB_ID
    # could hold checkpoints of an earlier test cluster whose job ids started at 1 too.
    node_local = os.path.join(d, "node-local")
    env = dict(os.environ, TRAIN=os.environ["CKPT_PROBE"], LAUNCH=os.environ["LAUNCH"], HORA_LOG="WARN",
               SLURM_TMPDIR=node_local)
    sub = subprocess.run(["sbatch", "--parsable", "--time=5", "-o", out, "--chdir", d,
                          os.environ["REQUEUE_SBATCH"], persist, str(STEPS)],
                         capture_output=True, text=True, env=env)
    if sub.returncode != 0:
        check(False, f"sbatch failed: {sub.stderr}")
        return 1
    job = sub.stdout.strip().split(";")[0]
    try:
        # Run 1: wait for progress, then preempt.
        wait_for(lambda: re.search(r"PROGRESS step=20", read(out)), 90, "the first run to reach step 20")
        subprocess.run(["scancel", "-s", "USR1", job], check=False)
        # The script requeues the job: it goes back to PENDING with Restarts=1.
        wait_for(lambda: job_info(job)[1] >= 1 and job_info(job)[0] == "PENDING", 60, "the job to be requeued")
        text1 = read(out)
        stopped = re.search(r"STOPPED step=(\d+)", text1)
        check(stopped is not None, "the first run did not report STOPPED")
        check("preempted after a checkpoint: requeueing" in text1, "the batch script did not see HORA_EXIT_REQUEUE")
        # The rerun may land on another node: drop the node-local copies.
        shutil.rmtree(node_local, ignore_errors=True)
        # slurmd rejects a credential created in the same second as the revocation of the killed
        # run's ("Job credential revoked"); Slurm's own ~120 s requeue hold avoids that, and so
        # does releasing the job a little later.
        time.sleep(2.5)
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
        wait_for(lambda: job_info(job)[0] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"),
                 90, "the rerun to finish")
        state, restarts, info = job_info(job)
        text = read(out)
        print(f"--- job {job}: {state}, restarts {restarts}\n{text}")
        check(state == "COMPLETED", f"final state {state}")
        check("ExitCode=0:0" in info, "final exit code is not 0")
        resumes = re.findall(r"^\[0\] RESUME restart=(\d+) step=(\d+) ok=(\d) source=(\S+)$", text, re.M)
        check(len(resumes) == 2, f"{len(resumes)} RESUME lines, want 2")
        if len(resumes) == 2 and stopped:
            check(resumes[0][:3] == ("0", "0", "1"), f"first run: {resumes[0]}")
            r, s, ok, src = resumes[1]
            check(r == "1", f"SLURM_RESTART_COUNT in the rerun is {r}")
            check(s == stopped.group(1) and ok == "1", f"rerun resumed at step {s} (ok={ok}), the first run stopped at {stopped.group(1)}")
            check(src == os.path.join(persist, f"step-{s}"), f"rerun restored from {src}, want the persistent copy")
        check(f"[0] DONE step={STEPS} w={STEPS}.0" in text, "the rerun did not finish with the right weights")
        check("ckpt_probe: passed" in text and "FAILED" not in text, "a rank reported errors")
    finally:
        if ERRORS:
            print(f"--- on failure: {job_info(job)[2]}\n{read(out)}", file=sys.stderr)
        subprocess.run(["scancel", job], check=False)
    print(f"slurm_ckpt_requeue: {'FAILED' if ERRORS else 'passed'} ({len(ERRORS)} errors)")
    return 1 if ERRORS else 0


if __name__ == "__main__":
    sys.exit(main())
