#!/usr/bin/env python3
"""launch on the real test Slurm cluster (tests/slurm/cluster.sh): one sbatch job per case.

    test_launch_slurm.py step|alloc|allreduce|errors|kill

Environment (set by ctest): SLURM_CONF, CLUSTER_SH, LAUNCH, PROBE_LAYOUT, PROBE_ALLREDUCE,
WORK_DIR. Exits 77 when the cluster is not running (it could not start here)."""
import os
import re
import subprocess
import sys
import tempfile
import time

ERRORS = []


def check(cond, msg):
    if not cond:
        ERRORS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def sbatch(script, args, timeout=120):
    """Runs a batch script and waits for it; returns (exit status, output, seconds)."""
    os.makedirs(os.environ["WORK_DIR"], exist_ok=True)
    d = tempfile.mkdtemp(dir=os.environ["WORK_DIR"])
    path = os.path.join(d, "job.sh")
    with open(path, "w") as f:
        f.write("#!/bin/bash\n" + script)
    out = os.path.join(d, "out.txt")
    # sbatch --wait polls slowly (up to 10 s late); poll the controller every 0.2 s instead.
    cmd = ["sbatch", "--parsable", "--time=3", "-o", out, "--chdir", d] + args + [path]
    t0 = time.time()
    sub = subprocess.run(cmd, capture_output=True, text=True)
    if sub.returncode != 0:
        check(False, f"sbatch failed: {sub.stderr}")
        return -1, "", 0
    job = sub.stdout.strip().split(";")[0]
    state, rc = "", -1
    while time.time() - t0 < timeout:
        info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout
        m = re.search(r"JobState=(\S+)", info)
        state = m.group(1) if m else ""
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            e = re.search(r"ExitCode=(\d+):(\d+)", info)
            rc = int(e.group(1)) if e else -1
            break
        time.sleep(0.2)
    else:
        subprocess.run(["scancel", job], check=False)
        check(False, f"job {job} did not finish within {timeout} s")
    dt = time.time() - t0
    se = f"(job {job}: {state})\n"
    text = open(out).read() if os.path.exists(out) else ""
    print(f"--- job ({' '.join(args)}): rc={rc} in {dt:.1f} s {se}{text}")
    return rc, text, dt


def probes(text):
    """PROBE lines (tagged "[r] PROBE ...") -> {rank: {key: value}}, checking the tag."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\[(\d+)\] PROBE (.*)$", line)
        if not m:
            continue
        kv = dict(x.split("=", 1) for x in m.group(2).split())
        check(kv["rank"] == m.group(1), f"line tagged [{m.group(1)}] comes from rank {kv['rank']}")
        out[int(kv["rank"])] = kv
    return out


def cpus_of(s):
    out = set()
    for part in s.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.update(range(int(a), int(b) + 1))
        elif part:
            out.add(int(part))
    return out


def node_cpus(name):
    """The CPUs fake node `name` may use: its slurmd's affinity (cluster.sh starts each slurmd on
    its own slice, and the tasks inherit it); this process's when that cannot be read."""
    try:
        with open(os.path.join(os.environ["HORA_SLURM_DIR"], "run", f"slurmd.{name}.pid")) as f:
            return os.sched_getaffinity(int(f.read().strip()))
    except (KeyError, OSError, ValueError):
        return os.sched_getaffinity(0)


def check_layout(ps, nodes=2, per_node=2, gpus="0,1,2,3", narrowed=False):
    size = nodes * per_node
    check(sorted(ps) == list(range(size)), f"ranks {sorted(ps)}, want 0..{size - 1}")
    for node in range(nodes):
        allowed = node_cpus(f"n{node + 1}")
        sets = []
        for lr in range(per_node):
            r = node * per_node + lr
            if r not in ps:
                continue
            p = ps[r]
            want = dict(size=str(size), local_rank=str(lr), local_size=str(per_node),
                        cross_rank=str(node), cross_size=str(nodes), node=f"n{node + 1}",
                        procid=str(r), order="PCI_BUS_ID", cvd=gpus, device=str(lr))
            for k, v in want.items():
                check(p[k] == v, f"rank {r}: {k}={p[k]}, want {v}")
            sets.append(cpus_of(p["cpus"]))
        # Binding: every local rank has its own non-empty share of the allowed CPUs.
        for i, s in enumerate(sets):
            check(s and s <= allowed, f"node {node} local rank {i}: cpus {sorted(s)} not within {sorted(allowed)}")
            for j in range(i):
                if len(allowed) >= per_node:
                    check(not (s & sets[j]), f"node {node}: local ranks {j} and {i} share cpus")
        if len(allowed) >= per_node and sets:
            check(set().union(*sets) == allowed, f"node {node}: the local ranks do not cover the allowed cpus")


def dry_lines(text):
    import json
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


def case_step():
    L, P = os.environ["LAUNCH"], os.environ["PROBE_LAYOUT"]
    rc, text, _ = sbatch(f"""
srun --mpi=pmix {L} -- {P}
echo "== per-task"
srun --mpi=pmix --gpus-per-task=1 {L} --dry-run
echo "== failure"
t0=$(date +%s)
PROBE_FAIL_RANK=2 srun --mpi=pmix {L} -- {P}
echo "== fail rc=$? seconds=$(( $(date +%s) - t0 ))"
cat > sigprobe.sh <<'EOS'
#!/bin/sh
n=0
trap 'n=$((n+1))' USR1
echo ready
i=0
while [ $n = 0 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
sleep 1
echo usr1 count=$n
EOS
chmod +x sigprobe.sh
srun --mpi=pmix {L} -- ./sigprobe.sh > signals.out 2>&1 &
for i in $(seq 300); do [ "$(grep -c ready signals.out)" = 4 ] && break; sleep 0.1; done
scancel -s USR1 $SLURM_JOB_ID
wait
echo "== signals"
cat signals.out
""", ["-N2", "--ntasks-per-node=2", "--gres=gpu:4"])
    check(rc == 0, f"job exit status {rc}")
    # Plain srun (no --kill-on-bad-exit): the failing rank's launch ends the step.
    m = re.search(r"== fail rc=(\d+) seconds=(\d+)", text)
    check(m is not None and m.group(1) != "0" and int(m.group(2)) < 30, f"step failure: {m and m.groups()}")
    check("launch: rank 2 (node n2)" in text and "exited with status 7" in text, "no message naming rank 2")
    # scancel -s USR1 reaches every program exactly once (launch does not send it again).
    counts = re.findall(r"^\[(\d)\] usr1 count=(\d+)$", text.partition("== signals")[2], re.M)
    check(sorted(counts) == [(str(r), "1") for r in range(4)], f"USR1 deliveries: {counts}")
    text = text.partition("== failure")[0]
    head, _, tail = text.partition("== per-task")
    check_layout(probes(head))
    # --gpus-per-task: Slurm hands each task its own GPU; launch takes it (CUDA ordinal 0).
    d = {j["rank"]: j for j in dry_lines(tail)}
    check(sorted(d) == [0, 1, 2, 3], f"per-task dry run ranks {sorted(d)}")
    for r, j in d.items():
        check(j["gpu_ids"] == str(r % 2) and j["gpu"] == 0, f"per-task rank {r}: {j}")
        check(j["hostname"] == f"n{r // 2 + 1}" and j["node"] == r // 2, f"per-task rank {r} node: {j}")


def case_alloc():
    L, P = os.environ["LAUNCH"], os.environ["PROBE_LAYOUT"]
    rc, text, _ = sbatch(f"""
{L} -np 4 {P}
echo "== rc=$?"
t0=$(date +%s)
PROBE_FAIL_RANK=1 {L} -np 4 {P}
echo "== fail rc=$? seconds=$(( $(date +%s) - t0 ))"
mkdir -p rq
PROBE_REQUEUE=$PWD/rq {L} -np 4 {P}
echo "== requeue rc=$? done=$(ls rq | wc -l)"
""", ["-N2", "--ntasks-per-node=2", "--gres=gpu:4"])
    check(rc == 0, f"job exit status {rc}")
    head, _, tail = text.partition("== rc=")
    check(tail.startswith("0"), "launch -np 4 did not exit 0")
    check_layout(probes(head))
    m = re.search(r"== fail rc=(\d+) seconds=(\d+)", text)
    check(m is not None, "no result of the failure run")
    if m:
        check(m.group(1) == "7", f"failing run exited {m.group(1)}, want rank 1's status 7")
        check(int(m.group(2)) < 30, f"the other ranks took {m.group(2)} s to end")
    check("launch: rank 1 (node n1)" in text and "exited with status 7" in text, "no message naming the failed rank")
    # Every rank stops for a requeue (status 3) at a slightly different time: none is killed by
    # the first one's exit, and launch returns 3 for the batch script to requeue on.
    m = re.search(r"== requeue rc=(\d+) done=\s*(\d+)", text)
    check(m is not None and m.groups() == ("3", "4"), f"requeue run: {m and m.groups()} (want rc 3, 4 ranks done)")


def case_allreduce():
    L, A = os.environ["LAUNCH"], os.environ["PROBE_ALLREDUCE"]
    rc, text, _ = sbatch(f"""
srun --mpi=pmix {L} -- {A}
echo "== srun rc=$?"
{L} -np 4 {A}
echo "== alloc rc=$?"
""", ["-N2", "--ntasks-per-node=2"])
    check(rc == 0, f"job exit status {rc}")
    check("== srun rc=0" in text and "== alloc rc=0" in text, "an allreduce run failed")
    lines = re.findall(r"^\[(\d+)\] ALLREDUCE rank=(\d+) size=4 local=(\d)/2 cross=(\d)/2 errors=0$", text, re.M)
    check(len(lines) == 8, f"{len(lines)} good ALLREDUCE lines, want 8 (4 ranks x 2 runs)")
    for tag, r, lr, cr in lines:
        check(tag == r and int(lr) == int(r) % 2 and int(cr) == int(r) // 2, f"rank {r}: local {lr} cross {cr}")


def case_errors():
    L, P = os.environ["LAUNCH"], os.environ["PROBE_LAYOUT"]
    rc, text, _ = sbatch(f"""
srun --mpi=none {L} -- {P}
echo "== nopmi rc=$?"
srun --mpi=pmix {L} -- {P}
echo "== gpus rc=$?"
srun --mpi=pmix {L} -- ./no-such-program
echo "== missing rc=$?"
""", ["-N2", "--ntasks-per-node=2", "--gres=gpu:1"])
    check(rc == 0, f"job exit status {rc}")
    check("== nopmi rc=2" in text, "srun --mpi=none: launch did not stop with status 2")
    check("srun --mpi=pmix" in text and "no PMI" in text, "no-PMI message missing")
    check("PROBE" not in text, "a program was started although launch should have stopped")
    check("== gpus rc=2" in text and "--allow-gpu-sharing" in text, "2 ranks on 1 GPU: no clear error")
    check("== missing rc=2" in text and "program './no-such-program' does not exist" in text, "missing program: no clear error")

def case_kill():
    """A rank's program dies by a signal mid-run (kill -9 from outside, or its own SIGSEGV) while
    the other ranks ignore SIGTERM (as ranks stuck in a collective would): the failing rank's
    launch names the rank, node and signal and ends the step on both nodes (SIGTERM, SIGKILL
    --kill-after seconds later); the job ends within 60 s with no process left."""
    L = os.environ["LAUNCH"]
    rc, text, dt = sbatch(f"""
cat > prog.sh <<'EOS'
#!/bin/bash
trap '' TERM
echo $$ > pid.$1.$HORA_RANK
if [ "$1" = segv ] && [ "$HORA_RANK" = 1 ]; then
  while [ $(ls pid.segv.* | wc -l) -lt 4 ]; do sleep 0.1; done
  kill -SEGV $$
fi
exec sleep 300
EOS
chmod +x prog.sh
ms() {{ echo $(( $(date +%s%N) / 1000000 )); }}
alive() {{  # a process that exists and is not a zombie (killed ranks' zombies wait for init)
  local s
  s=$(sed 's/^.*) //' /proc/$1/stat 2>/dev/null | cut -d' ' -f1)
  [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]
}}
left() {{  # the ranks' programs, launch processes, and anything else still running prog.sh
  n=0
  for f in pid.$1.*; do alive $(cat $f) && n=$((n+1)); done
  for p in $(pgrep -f "prog.sh $1"); do alive $p && n=$((n+1)); done
  echo $n
}}
settle() {{  # launch's SIGKILL helper exits just after the step (at once on cgroup clusters): 5 s
  for i in $(seq 50); do [ $(left $1) = 0 ] && break; sleep 0.1; done
  [ $(left $1) = 0 ] || ps -o pid,ppid,stat,cmd -p $(pgrep -d, -f "prog.sh $1") >&2
  left $1
}}
srun --mpi=pmix {L} --allow-no-pmi --kill-after 5 -- $PWD/prog.sh kill &
for i in $(seq 600); do [ $(ls pid.kill.* 2>/dev/null | wc -l) = 4 ] && break; sleep 0.1; done
sleep 1
t0=$(ms)
kill -9 $(cat pid.kill.2)
wait $!
rc=$?
echo "== kill rc=$rc ms=$(( $(ms) - t0 )) left=$(settle kill)"
t0=$(ms)
srun --mpi=pmix {L} --allow-no-pmi -- $PWD/prog.sh segv
rc=$?
echo "== segv rc=$rc ms=$(( $(ms) - t0 )) left=$(settle segv)"
""", ["-N2", "--ntasks-per-node=2"], timeout=150)
    check(dt < 60, f"the job took {dt:.0f} s, want < 60 s")
    m = re.search(r"== kill rc=(\d+) ms=(\d+) left=(\d+)", text)
    check(m is not None, "no result of the kill -9 run")
    if m:
        print(f"kill -9 of rank 2: the step ended {int(m.group(2)) / 1000:.1f} s later (--kill-after 5)")
        check(m.group(1) != "0", "kill -9: srun exited 0")
        check(int(m.group(2)) < 30000, f"kill -9: the step took {m.group(2)} ms to end, want < 30 s")
        check(m.group(3) == "0", f"kill -9: {m.group(3)} process(es) left")
    check(re.search(r"launch: rank 2 \(node n2\): \S+prog.sh killed by signal 9 \(Killed\); ending step \d+\.\d+ "
                    r"on every node", text) is not None, "kill -9: no line naming rank 2, node n2 and signal 9")
    m = re.search(r"== segv rc=(\d+) ms=(\d+) left=(\d+)", text)
    check(m is not None, "no result of the SIGSEGV run")
    if m:
        print(f"SIGSEGV of rank 1: the step ended {int(m.group(2)) / 1000:.1f} s after it started (default --kill-after)")
        check(m.group(1) != "0", "SIGSEGV: srun exited 0")
        check(int(m.group(2)) < 40000, f"SIGSEGV: the step took {m.group(2)} ms, want < 40 s")
        check(m.group(3) == "0", f"SIGSEGV: {m.group(3)} process(es) left")
    check(re.search(r"launch: rank 1 \(node n1\): \S+prog.sh killed by signal 11 \(Segmentation fault\); ending step",
                    text) is not None, "SIGSEGV: no line naming rank 1, node n1 and signal 11")
    kill_hora()


def kill_hora():
    """The same with a real hora training loop (ckpt_probe: allreduce every 50 ms, SIGTERM means
    "checkpoint and stop", which cannot finish with a rank gone): kill -9 of rank 2 mid-run."""
    L, C = os.environ["LAUNCH"], os.environ["CKPT_PROBE"]
    rc, text, dt = sbatch(f"""
ms() {{ echo $(( $(date +%s%N) / 1000000 )); }}
alive() {{
  local s
  s=$(sed 's/^.*) //' /proc/$1/stat 2>/dev/null | cut -d' ' -f1)
  [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]
}}
left() {{ n=0; for p in $(pgrep -f "$PWD/persist"); do alive $p && n=$((n+1)); done; echo $n; }}
mkdir -p persist local
export SLURM_TMPDIR=$PWD/local  # hora's node-local checkpoint directory: here, not in /tmp
srun --mpi=pmix {L} -- {C} $PWD/persist 100000 > run.out 2>&1 &
for i in $(seq 1200); do grep -q PROGRESS run.out && break; sleep 0.1; done
victim=
for p in $(pgrep -f "^{C} $PWD/persist"); do
  tr '\\0' '\\n' < /proc/$p/environ | grep -qx HORA_RANK=2 && victim=$p
done
t0=$(ms)
kill -9 $victim
wait $!
rc=$?
ms=$(( $(ms) - t0 ))
for i in $(seq 50); do [ $(left) = 0 ] && break; sleep 0.1; done
cat run.out
echo "== hora victim=$victim rc=$rc ms=$ms left=$(left)"
""", ["-N2", "--ntasks-per-node=2"], timeout=150)
    check(dt < 90, f"hora job took {dt:.0f} s")
    m = re.search(r"== hora victim=(\d*) rc=(\d+) ms=(\d+) left=(\d+)", text)
    check(m is not None and m.group(1) != "", f"hora: no result or no rank 2 found: {m and m.groups()}")
    if m and m.group(1):
        print(f"kill -9 of a hora rank: the step ended {int(m.group(3)) / 1000:.1f} s later")
        check(m.group(2) != "0", "hora: srun exited 0")
        check(int(m.group(3)) < 60000, f"hora: the step took {m.group(3)} ms to end, want < 60 s")
        check(m.group(4) == "0", f"hora: {m.group(4)} process(es) left")
    check(re.search(r"launch: rank 2 \(node n2\): \S+ckpt_probe killed by signal 9 \(Killed\); ending step", text)
          is not None, "hora: no line naming rank 2, node n2 and signal 9")


def main():
    case = sys.argv[1]
    if subprocess.run(["bash", os.environ["CLUSTER_SH"], "status"], capture_output=True).returncode != 0:
        print("the test Slurm cluster is not running (cluster.sh start could not start it): skipped")
        return 77
    {"step": case_step, "alloc": case_alloc, "allreduce": case_allreduce, "errors": case_errors,
     "kill": case_kill}[case]()
    print(f"slurm_launch_{case}: {'FAILED' if ERRORS else 'passed'} ({len(ERRORS)} errors)")
    return 1 if ERRORS else 0


if __name__ == "__main__":
    sys.exit(main())
