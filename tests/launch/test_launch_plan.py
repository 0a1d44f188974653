#!/usr/bin/env python3
"""launch without a cluster: placement plans (--dry-run) on hwloc XML topologies, errors, and the
process side (environment, binding, output, exit status, signals) with an emulated srun step.

    test_launch_plan.py plan|errors|cli|run|local

Environment: LAUNCH (the launch binary), TOPO_DIR (the XML topologies), PROBE_LAYOUT,
PROBE_ALLREDUCE (local case). The XML files come from topologies/gen_topologies.py: 2s-4gpu-alt
(2 packages x 8 cores, GPUs 0..3 alternate packages), 2s4n-8gpu-alt (4 NUMA x 4 cores, GPU k on
NUMA k%4), hgx-8gpu (8 NUMA x 4 cores, GPU pairs on NUMA 3,1,7,5), 2s-nogpu (2 x 4 cores)."""
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

LAUNCH = os.environ["LAUNCH"]
TOPO = os.environ["TOPO_DIR"]
ERRORS = []


def tmpdir():
    """A temporary directory removed when the test exits (also when a check failed)."""
    d = tempfile.mkdtemp(prefix="hora-launch-test-")
    atexit.register(shutil.rmtree, d, True)
    return d


def check(cond, msg):
    if not cond:
        ERRORS.append(msg)
        print("FAIL:", msg, file=sys.stderr)


def step_env(rank, size, local_rank, node, nodelist, tpn, extra=None, pmi=True):
    """The variables an srun task sees (what launch reads), for an emulated step."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0",
           "SLURM_PROCID": str(rank), "SLURM_NTASKS": str(size), "SLURM_LOCALID": str(local_rank),
           "SLURM_NODEID": str(node), "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tpn}
    for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):  # sanitizer builds
        if k in os.environ:
            env[k] = os.environ[k]
    if pmi:
        env["PMIX_RANK"] = str(rank)
    env.update(extra or {})
    return env


def run(args, env, timeout=30):
    for k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
        if k in os.environ:
            env.setdefault(k, os.environ[k])
    p = subprocess.run([LAUNCH] + args, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def plan_node(topo, local_size, gpu_env, args=()):
    """Dry-run plan of every local rank of a one-node step; list of dicts (or None on error)."""
    out = []
    for lr in range(local_size):
        env = step_env(lr, local_size, lr, 0, "n1", str(local_size), gpu_env)
        rc, so, se = run(["--dry-run", "--topology", os.path.join(TOPO, topo)] + list(args), env)
        check(rc == 0, f"{topo} local rank {lr}: rc {rc}: {se}")
        if rc != 0:
            return None
        out.append(json.loads(so))
    return out


def expect_plan(name, plan, gpus, buses, cpus):
    if plan is None:
        return
    for i, p in enumerate(plan):
        check(p["local_rank"] == i and p["rank"] == i, f"{name}: rank fields {p}")
        check(p["gpu"] == gpus[i], f"{name}: local rank {i} gpu {p['gpu']}, want {gpus[i]}")
        check(p["gpu_bus_id"] == buses[i], f"{name}: local rank {i} bus {p['gpu_bus_id']}, want {buses[i]}")
        check(p["cpuset"] == cpus[i], f"{name}: local rank {i} cpuset {p['cpuset']}, want {cpus[i]}")


def gpus_env(n):
    ids = ",".join(str(i) for i in range(n))
    return {"SLURM_STEP_GPUS": ids, "CUDA_VISIBLE_DEVICES": ids, "SLURM_GPUS_ON_NODE": str(n)}


def case_plan():
    # 4 GPUs alternating packages: GPUs 0,2 are local to package 0 (cores 0-7), 1,3 to package 1.
    expect_plan("2s-4gpu 4 ranks", plan_node("2s-4gpu-alt.xml", 4, gpus_env(4)), [0, 1, 2, 3],
                ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0"], ["0-3", "8-11", "4-7", "12-15"])
    expect_plan("2s-4gpu 2 ranks", plan_node("2s-4gpu-alt.xml", 2, gpus_env(4)), [0, 1],
                ["0000:01:00.0", "0000:21:00.0"], ["0-7", "8-15"])
    # 8 GPUs on 4 NUMA nodes: GPU k on NUMA k%4 (cores 4*(k%4)..+3), two ranks per NUMA node.
    expect_plan("2s4n-8gpu", plan_node("2s4n-8gpu-alt.xml", 8, gpus_env(8)), list(range(8)),
                [f"0000:{b:02x}:00.0" for b in (0x01, 0x11, 0x21, 0x31, 0x41, 0x51, 0x61, 0x71)],
                ["0-1", "4-5", "8-9", "12-13", "2-3", "6-7", "10-11", "14-15"])
    # HGX-like: GPU order does not follow NUMA order (pairs on NUMA 3, 1, 7, 5).
    expect_plan("hgx", plan_node("hgx-8gpu.xml", 8, gpus_env(8)), list(range(8)),
                [f"0000:{b:02x}:00.0" for b in (0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd)],
                ["12-13", "14-15", "4-5", "6-7", "28-29", "30-31", "20-21", "22-23"])
    # No GPU: the allowed cores are split evenly (8 cores over 3 ranks: 2, 3, 3).
    expect_plan("nogpu", plan_node("2s-nogpu.xml", 3, {}), [None] * 3, [None] * 3, ["0-1", "2-4", "5-7"])
    # --bind none: every rank keeps the whole allowed set; --bind cores ignores GPU locality.
    expect_plan("bind none", plan_node("2s-4gpu-alt.xml", 2, gpus_env(4), ["--bind", "none"]), [0, 1],
                ["0000:01:00.0", "0000:21:00.0"], ["0-15", "0-15"])
    expect_plan("bind cores", plan_node("2s-4gpu-alt.xml", 4, gpus_env(4), ["--bind", "cores"]), [0, 1, 2, 3],
                ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0"], ["0-3", "4-7", "8-11", "12-15"])
    # --gpus-per-rank 2: rank i takes GPUs 2i, 2i+1 and is placed by the first one.
    p = plan_node("2s-4gpu-alt.xml", 2, gpus_env(4), ["--gpus-per-rank", "2"])
    if p:
        check([x["gpu_ids"] for x in p] == ["0,1", "2,3"] and [x["gpu"] for x in p] == [0, 2], f"gpus-per-rank 2: {p}")
    # --allow-gpu-sharing: 4 ranks on 2 GPUs, round-robin.
    p = plan_node("2s-4gpu-alt.xml", 4, gpus_env(2), ["--allow-gpu-sharing"])
    if p:
        check([x["gpu"] for x in p] == [0, 1, 0, 1], f"sharing: {p}")
    # srun --gpus-per-task=1: each task sees only its own GPU (CUDA ordinal 0). The other local
    # ranks are assumed to hold the node's GPUs in local-rank order when splitting the cores.
    for (lr, n, gid, bus, cpus) in ((1, 2, "1", "0000:21:00.0", "8-15"), (3, 4, "3", "0000:61:00.0", "12-15")):
        env = step_env(lr, n, lr, 0, "n1", str(n), {"SLURM_STEP_GPUS": gid, "CUDA_VISIBLE_DEVICES": gid,
                                                   "SLURM_GPUS_ON_NODE": str(n)})
        rc, so, se = run(["--dry-run", "--topology", os.path.join(TOPO, "2s-4gpu-alt.xml")], env)
        check(rc == 0, f"per-task: {se}")
        if rc == 0:
            j = json.loads(so)
            check((j["gpu"], j["gpu_ids"], j["gpu_bus_id"], j["cpuset"]) == (0, gid, bus, cpus), f"per-task: {j}")
    # CUDA_VISIBLE_DEVICES in another order: the ordinal is the position in it.
    env = step_env(0, 2, 0, 0, "n1", "2", {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "3,2"})
    rc, so, se = run(["--dry-run", "--topology", os.path.join(TOPO, "2s-4gpu-alt.xml")], env)
    if rc == 0:
        j = json.loads(so)
        check(j["gpu_ids"] == "2" and j["gpu"] == 1 and j["gpu_bus_id"] == "0000:41:00.0", f"cvd order: {j}")
    else:
        check(False, f"cvd order: {se}")
    # Multi-node step, cyclic distribution: this rank's own values come from Slurm.
    env = step_env(5, 6, 1, 1, "gpu-a[1-2]", "3(x2)", {"SLURMD_NODENAME": "gpu-a2"})
    rc, so, se = run(["--dry-run", "--topology", os.path.join(TOPO, "2s-nogpu.xml")], env)
    if rc == 0:
        j = json.loads(so)
        check((j["rank"], j["local_rank"], j["local_size"], j["node"], j["nodes"], j["hostname"], j["cpuset"]) ==
              (5, 1, 3, 1, 2, "gpu-a2", "2-4"), f"2-node step: {j}")
    else:
        check(False, f"2-node step: {se}")
    # Local mode plan over -H: host a takes 2 ranks, b the third.
    rc, so, se = run(["-np", "3", "-H", "a:2,b:2", "--dry-run", "--topology", os.path.join(TOPO, "2s-nogpu.xml")],
                     {"PATH": os.environ["PATH"]})
    lines = [json.loads(l) for l in so.splitlines()]
    check([(j["hostname"], j["local_rank"], j["node"], j["cpuset"]) for j in lines] ==
          [("a", 0, 0, "0-3"), ("a", 1, 0, "4-7"), ("b", 0, 1, "0-7")], f"-H plan: {lines} {se}")
    # Allocation mode plan (batch script: no step) from the job's variables.
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-2]",
           "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_GPUS": "0,1", "SLURM_GPUS_ON_NODE": "2"}
    rc, so, se = run(["--dry-run", "--topology", os.path.join(TOPO, "2s-4gpu-alt.xml")], env)
    lines = [json.loads(l) for l in so.splitlines()]
    check([(j["rank"], j["hostname"], j["local_rank"], j["gpu"], j["cpuset"]) for j in lines] ==
          [(0, "n1", 0, 0, "0-7"), (1, "n1", 1, 1, "8-15"), (2, "n2", 0, 0, "0-7"), (3, "n2", 1, 1, "8-15")],
          f"allocation plan: {lines} {se}")


def expect_error(name, args, env, *parts):
    rc, so, se = run(args, env)
    check(rc == 2, f"{name}: rc {rc}, want 2 ({se.strip()})")
    for part in parts:
        check(part in se, f"{name}: message lacks '{part}': {se.strip()}")
    check(so == "", f"{name}: printed a plan or started the program: {so}")


def case_errors():
    xml = ["--topology", os.path.join(TOPO, "2s-4gpu-alt.xml")]
    expect_error("bad nodelist", ["--dry-run"] + xml, step_env(0, 2, 0, 0, "n[1-", "2"), "SLURM_STEP_NODELIST is malformed", "n[1-")
    expect_error("bad tasks-per-node", ["--dry-run"] + xml, step_env(0, 2, 0, 0, "n1", "2(x"), "SLURM_STEP_TASKS_PER_NODE")
    expect_error("nodes vs tasks", ["--dry-run"] + xml, step_env(0, 4, 0, 0, "n[1-3]", "2(x2)"), "names 3 node(s)")
    expect_error("too many ranks", ["--dry-run"] + xml, step_env(0, 4, 0, 0, "n1", "4", gpus_env(2)),
                 "need 4 GPUs", "--allow-gpu-sharing")
    expect_error("gpu not there", ["--dry-run"] + xml, step_env(0, 1, 0, 0, "n1", "1", {"SLURM_STEP_GPUS": "5"}),
                 "GPU 5", "not on this node")
    expect_error("gpus asked, none", ["--dry-run", "--gpus-per-rank", "1", "--topology", os.path.join(TOPO, "2s-nogpu.xml")],
                 step_env(0, 1, 0, 0, "n1", "1"), "--gpus-per-rank 1", "has none")
    expect_error("bind gpu, none", ["--dry-run", "--bind", "gpu", "--topology", os.path.join(TOPO, "2s-nogpu.xml")],
                 step_env(0, 1, 0, 0, "n1", "1"), "--bind gpu")
    expect_error("bad gpu list", ["--dry-run"] + xml, step_env(0, 1, 0, 0, "n1", "1", {"SLURM_STEP_GPUS": "0,,1"}),
                 "SLURM_STEP_GPUS is malformed")
    d = tmpdir()
    marker = os.path.join(d, "started")
    prog = os.path.join(d, "prog.sh")
    with open(prog, "w") as f:
        f.write(f"#!/bin/sh\ntouch {marker}\n")
    os.chmod(prog, 0o755)
    expect_error("no PMI", [prog], step_env(0, 2, 0, 0, "n1", "2", {"SLURM_MPI_TYPE": "none"}, pmi=False),
                 "srun --mpi=pmix", "launch -np")
    check(not os.path.exists(marker), "no PMI: the program was started")
    expect_error("missing program", ["./no/such/prog"], step_env(0, 1, 0, 0, "n1", "1"), "does not exist")
    os.chmod(prog, 0o644)
    expect_error("not executable", [prog], step_env(0, 1, 0, 0, "n1", "1"), "not executable")
    expect_error("directory", [d], step_env(0, 1, 0, 0, "n1", "1"), "is a directory")
    expect_error("bad -np", ["-np", "0", "true"], {"PATH": os.environ["PATH"]}, "-np")
    expect_error("bad -H", ["-H", "a:x", "--dry-run"], {"PATH": os.environ["PATH"]}, "slot count")
    expect_error("bad option", ["--frobnicate", "true"], {"PATH": os.environ["PATH"]}, "unknown option")
    expect_error("-np in a step", ["-np", "8", "true"], step_env(0, 2, 0, 0, "n1", "2"), "-np 8 inside an srun step of 2")

# Bad command lines: each prints exactly one "launch: error: ..." line naming the problem and exits
# 2, with nothing on stdout. (name, arguments, words the message must hold)
CLI_ERRORS = [
    ("unknown option", ["--frobnicate", "true"], ["unknown option '--frobnicate'"]),
    ("unknown short option", ["-x", "true"], ["unknown option '-x'"]),
    ("-H missing its value", ["-H", "--dry-run"], ["option -H needs a value", "'--dry-run' follows it"]),
    ("--output-dir missing its value", ["--output-dir", "-v", "true"], ["option --output-dir needs a value"]),
    ("-np at the end", ["-np"], ["option -np needs a value"]),
    ("--topology at the end", ["--dry-run", "--topology"], ["option --topology needs a value"]),
    ("-np not a number", ["-np", "abc", "--dry-run"], ["option -np: 'abc' is not a number"]),
    ("-np negative", ["-np", "-4", "--dry-run"], ["option -np: '-4' is not a number"]),
    ("-np with a unit", ["--np=4k", "--dry-run"], ["option --np: '4k' is not a number"]),
    ("-np zero", ["-np", "0", "--dry-run"], ["option -np: 0 is out of range (1..1048576)"]),
    ("-np too large", ["-np", "1048577", "--dry-run"], ["option -np: 1048577 is out of range (1..1048576)"]),
    ("-np overflowing", ["-n", "99999999999999999999", "--dry-run"], ["option -n: 99999999999999999999 is out of range"]),
    ("--gpus-per-rank not a number", ["--gpus-per-rank", "one", "--dry-run"], ["option --gpus-per-rank: 'one' is not a number"]),
    ("--gpus-per-rank too large", ["--gpus-per-rank=5000", "--dry-run"], ["option --gpus-per-rank: 5000 is out of range (0..1024)"]),
    ("--kill-after not a number", ["--kill-after", "1.5", "true"], ["option --kill-after: '1.5' is not a number"]),
    ("--kill-after too large", ["--kill-after", "3601", "true"], ["option --kill-after: 3601 is out of range (0..3600)"]),
    ("--bind bad", ["--bind", "sockets", "--dry-run"], ["option --bind: 'sockets' is not none, cores or gpu"]),
    ("flag with a value", ["--dry-run=yes"], ["option --dry-run takes no value"]),
    ("empty value", ["--hosts=", "--dry-run"], ["option --hosts: the value is empty"]),
    ("bad -H", ["-H", "a:x", "--dry-run"], ["-H:", "slot count"]),
    ("-H slots too many", ["-H", "a:1048576,b:1", "--dry-run"], ["-H offers 1048577 slots", "give -np N"]),
    ("--elastic outside an allocation", ["--elastic", "true"], ["--elastic runs in a batch script"]),
    ("--min-nodes above --max-nodes", ["--elastic", "--min-nodes", "3", "--max-nodes", "2", "true"],
     ["--min-nodes 3 is above --max-nodes 2"]),
    ("--min-nodes zero", ["--min-nodes", "0", "true"], ["option --min-nodes: 0 is out of range"]),
    ("--max-restarts too large", ["--max-restarts", "1001", "true"], ["option --max-restarts: 1001 is out of range (0..1000)"]),
    ("--fusion-threshold-mb with a unit", ["--fusion-threshold-mb", "64MB", "true"],
     ["option --fusion-threshold-mb: '64MB' is not a whole number"]),
    ("--fusion-threshold-mb too large", ["--fusion-threshold-mb=1073741825", "true"],
     ["option --fusion-threshold-mb: 1073741825 is out of range (0..1073741824)"]),
    ("--cycle-time-ms negative", ["--cycle-time-ms=-1", "true"], ["option --cycle-time-ms: '-1' is not a number"]),
    ("--cycle-time-ms nan", ["--cycle-time-ms", "nan", "true"], ["option --cycle-time-ms: 'nan' is not a number"]),
    ("--stall-check-shutdown-time-seconds fraction", ["--stall-check-shutdown-time-seconds", "1.5", "true"],
     ["option --stall-check-shutdown-time-seconds: '1.5' is not a whole number"]),
    ("--log-level bad", ["--log-level", "verbose", "true"],
     ["option --log-level: 'verbose' is not one of trace, debug"]),
    ("--timeline-filename empty", ["--timeline-filename=", "true"], ["option --timeline-filename: the value is empty"]),
    ("--mpi-args with quotes", ["--mpi-args=--mca btl '^openib'", "true"],
     ["option --mpi-args: '--mca btl '^openib'' holds a quote"]),
    ("--start-timeout not a number", ["--start-timeout", "1m", "true"], ["option --start-timeout: '1m' is not a whole number"]),
    ("--gloo", ["--gloo", "true"], ["option --gloo: hora's controller and collectives run on MPI only"]),
    ("--hora-set unknown", ["--hora-set", "PATH=/x", "true"], ["option --hora-set is internal to launch"]),
    ("-hostfile missing", ["-hostfile", "/no/such/hostfile", "true"],
     ["option -hostfile: cannot open '/no/such/hostfile'"]),
    ("--hostfile empty", ["--hostfile", "/dev/null", "true"], ["option --hostfile: '/dev/null' is empty"]),
    ("-H and a host file", ["-H", "a:2", "--hostfile", "/dev/null", "true"],
     ["option --hostfile: give the hosts once"]),
    ("no program", ["-np", "2"], ["no program given"]),
    ("missing program", ["-np", "2", "./no/such/prog"], ["program './no/such/prog' does not exist"]),
]


def local_env():
    """This machine's environment without Slurm's or hora's variables: launch's local mode."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HORA_", "OMPI_COMM_WORLD"))}
    return env


def case_cli():
    env = local_env()
    for name, args, parts in CLI_ERRORS:
        rc, so, se = run(args, dict(env))
        lines = se.splitlines()
        check(rc == 2, f"{name}: launch {' '.join(args)}: rc {rc}, want 2 ({se.strip()})")
        check(len(lines) == 1 and lines[0].startswith("launch: error: "),
              f"{name}: want one 'launch: error:' line, got {lines}")
        for part in parts:
            check(part in se, f"{name}: message lacks {part!r}: {se.strip()}")
        check(so == "", f"{name}: printed something on stdout: {so[:200]!r}")
    for args in (["--help"], ["-h"], ["--help", "--frobnicate"]):
        rc, so, se = run(args, dict(env))
        check(rc == 0 and so.startswith("usage: launch [options]") and "--kill-after" in so and se == "",
              f"launch {' '.join(args)}: rc {rc}, stdout {so[:80]!r}, stderr {se!r}")
    rc, so, se = run(["--version"], dict(env))
    check(rc == 0 and re.match(r"^launch \(hora\) \d+\.\d+\.\d+\n$", so) is not None, f"--version: {rc} {so!r}")
    # Planning is linear in ranks: a million ranks on one node (this machine), and on a node of
    # 8 GPUs shared round-robin (the GPU path, one CPU group per NUMA node). Sanitizer builds
    # plan HORA_TEST_PLAN_RANKS (100k: tests/launch/CMakeLists.txt) under the same bound.
    xml = os.path.join(TOPO, "2s4n-8gpu-alt.xml")
    nr = int(os.environ.get("HORA_TEST_PLAN_RANKS", "1000000"))
    for label, args in (("this machine", []),
                        ("8 GPUs shared", ["--topology", xml, "--gpus", "0-7", "--allow-gpu-sharing"])):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            # CPU time is the cost of planning; wall time on a loaded 2-core machine is mostly
            # waiting for a core, so it gets a looser bound. Quadratic planning took an hour.
            t0 = time.monotonic()
            p = subprocess.Popen([LAUNCH, "-np", str(nr), "--dry-run"] + args, env=dict(env), stdout=out, stderr=err)
            _, status, ru = os.wait4(p.pid, 0)
            dt, cpu = time.monotonic() - t0, ru.ru_utime + ru.ru_stime
            rc = os.waitstatus_to_exitcode(status)
            err.seek(0)
            print(f"launch -np {nr} --dry-run ({label}): {cpu:.2f} s CPU, {dt:.2f} s wall")
            check(rc == 0, f"{nr} ranks ({label}): rc {rc}: {err.read()[-300:]}")
            check(cpu < 5.0, f"{nr} ranks ({label}) took {cpu:.2f} s CPU, want < 5 s (planning must be linear in ranks)")
            check(dt < 60.0, f"{nr} ranks ({label}) took {dt:.2f} s wall, want < 60 s")
            out.seek(0)
            data = out.read()
            lines = data.count(b"\n")
            check(lines == nr, f"{nr} ranks ({label}): {lines} plan lines")
            last = json.loads(data[data.rstrip(b"\n").rfind(b"\n") + 1:])
            check(last["rank"] == nr - 1 and last["local_rank"] == nr - 1 and last["size"] == nr,
                  f"{nr} ranks ({label}): last line {last}")
            if args:
                # local rank nr-1 takes GPU (nr-1) % 8 = 7 (NUMA 3: cores 12-15); the nr/8 ranks of
                # that NUMA node wrap round-robin over its 4 cores: index nr/8-1 -> core 12 + 3.
                check(nr % 32 == 0, f"HORA_TEST_PLAN_RANKS={nr}: want a multiple of 32")
                check(last["gpu"] == 7 and last["cpuset"] == "15", f"{nr} ranks, 8 GPUs: last line {last}")
            else:
                n = len(os.sched_getaffinity(0))
                check(last["cpuset"] != "", f"{nr} ranks: empty cpuset {last} ({n} CPUs)")


def case_run():
    probe = os.environ["PROBE_LAYOUT"]
    # Environment, binding and tagging of one rank of an emulated 2-rank step.
    env = step_env(1, 2, 1, 0, "n1", "2", {"SLURMD_NODENAME": "n1", "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"})
    rc, so, se = run([probe], env)
    check(rc == 0, f"probe: rc {rc}: {se}")
    m = re.match(r"^\[1\] PROBE (.*)$", so.strip())
    check(m is not None, f"probe output not tagged [1]: {so!r}")
    if m:
        kv = dict(x.split("=", 1) for x in m.group(1).split())
        want = dict(rank="1", size="2", local_rank="1", local_size="2", cross_rank="0", cross_size="1",
                    device="1", cvd="0,1", order="PCI_BUS_ID")
        for k, v in want.items():
            check(kv.get(k) == v, f"probe {k}={kv.get(k)}, want {v}")
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) >= 2:
            got = kv["cpus"]
            check(got != ",".join(map(str, allowed)) and got != "", f"local rank 1 of 2 not bound to a share: {got}")
    # Exit status and partial last lines; --no-tag-output; --output-dir.
    env = step_env(0, 1, 0, 0, "n1", "1")
    rc, so, se = run(["sh", "-c", "echo out; printf tail; echo err >&2; exit 5"], env)
    check(rc == 5 and so == "[0] out\n[0] tail\n" and "[0] err\n" in se, f"exit/tagging: rc={rc} {so!r} {se!r}")
    rc, so, se = run(["--no-tag-output", "sh", "-c", "echo plain"], env)
    check(rc == 0 and so == "plain\n", f"--no-tag-output: {so!r}")
    d = tmpdir()
    rc, so, se = run(["--output-dir", d, "sh", "-c", "echo a; echo b >&2"], env)
    text = open(os.path.join(d, "rank.0.log")).read() if os.path.exists(os.path.join(d, "rank.0.log")) else ""
    check(rc == 0 and so == "" and sorted(text.split()) == ["a", "b"], f"--output-dir: {rc} {so!r} {text!r}")
    # horovodrun's tuning options become HORA_* settings of the rank, overriding the environment
    # (docs/launch.md, "From horovodrun").
    show = ["sh", "-c", "env | grep -E '^HORA_(FUSION|CYCLE|CACHE|TIMELINE|STALL|LOG=|INIT_TIMEOUT)' | sort"]
    rc, so, se = run(["--fusion-threshold-mb", "32", "--cycle-time-ms=2.5", "--cache-capacity", "0",
                      "--timeline-filename", "/x/t.json", "--no-stall-check", "--log-level", "DEBUG",
                      "--hierarchical-allreduce", "--mpi"] + show, dict(env, HORA_CACHE_CAPACITY="9"))
    want = ["[0] HORA_CACHE_CAPACITY=0", "[0] HORA_CYCLE_TIME_MS=2.5", "[0] HORA_FUSION_THRESHOLD=32M",
            "[0] HORA_LOG=TRACE", "[0] HORA_STALL_SHUTDOWN_S=0", "[0] HORA_STALL_WARNING_S=0",
            "[0] HORA_TIMELINE=/x/t.json", "[0] HORA_TIMELINE_MARK_CYCLES=0"]
    check(rc == 0 and so.split("\n")[:-1] == want and se == "", f"tuning options: rc={rc} {so!r} {se!r}")
    rc, so, se = run(["--timeline-filename", "t.json", "--timeline-mark-cycles", "--disable-cache",
                      "--stall-check-warning-time-seconds", "30", "--autotune", "--start-timeout", "45"] + show, env)
    check(rc == 0 and so.split("\n")[:-1] == ["[0] HORA_INIT_TIMEOUT_S=45", "[0] HORA_STALL_WARNING_S=30",
                                              "[0] HORA_TIMELINE=t.json", "[0] HORA_TIMELINE_MARK_CYCLES=1"],
          f"mark cycles: {so!r}")
    check(se.count("--autotune: hora has no autotuner") == 1, f"--autotune warning: {se!r}")
    # Horovod's no-marks default gives way to a HORA_TIMELINE_MARK_CYCLES the user set.
    rc, so, se = run(["--timeline-filename", "t.json"] + show, dict(env, HORA_TIMELINE_MARK_CYCLES="1"))
    check(rc == 0 and "[0] HORA_TIMELINE_MARK_CYCLES=1" in so, f"user's mark cycles: {so!r}")
    # What a child launch receives from its parent (local mode through mpirun).
    rc, so, se = run(["--hora-set", "HORA_TIMELINE=/a=b.json", "--hora-timeline-default"] + show, env)
    check(rc == 0 and so.split("\n")[:-1] == ["[0] HORA_TIMELINE=/a=b.json", "[0] HORA_TIMELINE_MARK_CYCLES=0"],
          f"--hora-set: {so!r} {se!r}")
    rc, so, se = run(["sh", "-c", "kill -TERM $$"], env)
    check(rc == 128 + 15 and "killed by signal 15" in se, f"killed program: rc={rc} {se!r}")
    # Signals: from launch's parent (slurmstepd in a real step, which signals the whole step
    # itself) they are not forwarded; from anyone else they are.
    prog = "trap 'echo got USR1; exit 0' USR1; echo ready $PPID; while :; do sleep 0.1; done"
    p = subprocess.Popen([LAUNCH, "sh", "-c", prog], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    check(line.startswith("[0] ready "), f"signal probe: {line!r}")
    p.send_signal(signal.SIGUSR1)  # from the parent: not forwarded
    time.sleep(0.5)
    check(p.poll() is None, "a signal from launch's parent was forwarded in step mode")
    subprocess.run(["kill", "-USR1", str(p.pid)])  # from another process: forwarded
    try:
        out, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        check(False, "SIGUSR1 was not forwarded")
    check(p.returncode == 0 and "[0] got USR1" in out, f"forwarded USR1: rc={p.returncode} {out!r} {err!r}")


def alive(pid):
    """A process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def local_kill9(env):
    """A rank's program dies by SIGKILL mid-run while its peers ignore SIGTERM (as ranks stuck in
    a collective would): the job ends within seconds, with a line naming the rank, node and
    signal, and no process left."""
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "prog.sh")
        with open(prog, "w") as f:
            f.write(f"#!/bin/bash\ntrap '' TERM\necho $$ > {d}/pid.$HORA_RANK\nexec sleep 300\n")
        os.chmod(prog, 0o755)
        p = subprocess.Popen([LAUNCH, "-np", "3", prog], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        files = [os.path.join(d, f"pid.{r}") for r in range(3)]
        t0 = time.time()
        while time.time() - t0 < 60 and not all(os.path.exists(f) and os.path.getsize(f) for f in files):
            time.sleep(0.1)
        pids = [int(open(f).read()) for f in files if os.path.exists(f) and os.path.getsize(f)]
        check(len(pids) == 3, f"kill -9: {len(pids)} of 3 ranks started")
        if len(pids) == 3:
            t0 = time.time()
            os.kill(pids[1], signal.SIGKILL)
        try:
            out, err = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            check(False, "kill -9 of rank 1: the job did not end within 90 s")
        dt = time.time() - t0
        print(f"kill -9 of rank 1 under launch's mpirun: the job ended in {dt:.1f} s")
        check(p.returncode == 128 + 9, f"kill -9: launch exited {p.returncode}, want 137: {err[-500:]}")
        check(re.search(r"launch: rank 1 \(node \S+\): \S+ killed by signal 9 \(Killed\)", err) is not None,
              f"kill -9: no line naming rank 1, its node and the signal: {err[-500:]}")
        check(dt < 30, f"kill -9: the job took {dt:.1f} s to end, want < 30 s")
        left = [pid for pid in pids if alive(pid)]
        check(not left, f"kill -9: processes left: {left}")
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def case_local():
    probe = os.environ["PROBE_LAYOUT"]
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("SLURM_") or k.startswith("HORA_"):
            del env[k]
    p = subprocess.run([LAUNCH, "-np", "3", probe], env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, f"local -np 3: rc {p.returncode}: {p.stderr}")
    got = {}
    for l in p.stdout.splitlines():
        m = re.match(r"^\[(\d+)\] PROBE (.*)$", l)
        if m:
            got[int(m.group(1))] = dict(x.split("=", 1) for x in m.group(2).split())
    check(sorted(got) == [0, 1, 2], f"local ranks {sorted(got)}: {p.stdout}")
    for r, kv in got.items():
        check((kv["rank"], kv["size"], kv["local_rank"], kv["local_size"], kv["cross_rank"], kv["cross_size"]) ==
              (str(r), "3", str(r), "3", "0", "1"), f"local rank {r}: {kv}")
    # One rank fails: status 7, the others end at once (mpirun aborts the job).
    t0 = time.time()
    p = subprocess.run([LAUNCH, "-np", "3", "-H", "localhost:3", probe], env=dict(env, PROBE_FAIL_RANK="1"),
                       capture_output=True, text=True, timeout=90)
    check(p.returncode == 7, f"local failure: rc {p.returncode}, want 7: {p.stderr[-500:]}")
    check(time.time() - t0 < 30, f"local failure took {time.time() - t0:.0f} s")
    check("launch: rank 1" in p.stderr, "no message naming the failed rank")
    local_kill9(env)
    # hora_init through launch's mpirun: layout agrees with HORA_*, allreduce exact.
    p = subprocess.run([LAUNCH, "-np", "3", os.environ["PROBE_ALLREDUCE"]], env=env, capture_output=True, text=True,
                       timeout=120)
    check(p.returncode == 0 and len(re.findall(r"ALLREDUCE .* errors=0", p.stdout)) == 3,
          f"allreduce through local launch: rc {p.returncode}: {p.stdout} {p.stderr[-800:]}")
    # horovodrun's -hostfile: "host slots=N" lines, as -H; a bad line names the file and the line.
    d = tmpdir()
    hf = os.path.join(d, "hosts")
    with open(hf, "w") as f:
        f.write("# the machine itself\nlocalhost slots=2\n")
    p = subprocess.run([LAUNCH, "-hostfile", hf, probe], env=env, capture_output=True, text=True, timeout=60)
    got = sorted(int(m.group(1)) for m in re.finditer(r"^\[(\d+)\] PROBE ", p.stdout, re.M))
    check(p.returncode == 0 and got == [0, 1], f"-hostfile (2 slots, no -np): rc {p.returncode}: {got} {p.stderr[-500:]}")
    with open(hf, "a") as f:
        f.write("otherhost slots=two\n")
    p = subprocess.run([LAUNCH, "-hostfile", hf, probe], env=env, capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and f"option -hostfile: {hf}: line 3: slot count 'two'" in p.stderr and not p.stdout,
          f"bad host file: rc {p.returncode}: {p.stderr!r}")
    # horovodrun's tuning options reach every rank through launch's mpirun (on other hosts as
    # options of the child launch, since mpirun forwards no environment there).
    p = subprocess.run([LAUNCH, "-np", "2", "--fusion-threshold-mb", "8", "--timeline-filename", "tl.json",
                        "sh", "-c", "echo TUNE $HORA_FUSION_THRESHOLD $HORA_TIMELINE $HORA_TIMELINE_MARK_CYCLES"],
                       env=env, capture_output=True, text=True, timeout=60)
    got = sorted(l for l in p.stdout.splitlines() if " TUNE " in l)
    check(p.returncode == 0 and got == ["[0] TUNE 8M tl.json 0", "[1] TUNE 8M tl.json 0"],
          f"tuning options through local launch: rc {p.returncode}: {p.stdout!r} {p.stderr[-500:]}")
    # horovodrun's --mpi-args="..." (the = form, as with horovodrun's argparse, since the value
    # starts with '-') reach mpirun (here its -x NAME=VALUE), and Horovod's variables are
    # forwarded to every host as hora's are (-x, shown by -v).
    p = subprocess.run([LAUNCH, "-v", "-np", "2", "--mpi-args=-x HORA_TEST_MPI_ARGS=yes",
                        "sh", "-c", "echo MA $HORA_TEST_MPI_ARGS"],
                       env=dict(env, HOROVOD_CYCLE_TIME="2"), capture_output=True, text=True, timeout=60)
    got = sorted(l for l in p.stdout.splitlines() if " MA " in l)
    check(p.returncode == 0 and got == ["[0] MA yes", "[1] MA yes"] and "-x HOROVOD_CYCLE_TIME" in p.stderr,
          f"--mpi-args through local launch: rc {p.returncode}: {p.stdout!r} {p.stderr[-800:]}")


if __name__ == "__main__":
    case = sys.argv[1]
    {"plan": case_plan, "errors": case_errors, "cli": case_cli, "run": case_run, "local": case_local}[case]()
    print(f"test_launch_{case}: {'FAILED' if ERRORS else 'passed'} ({len(ERRORS)} errors)")
    sys.exit(1 if ERRORS else 0)
