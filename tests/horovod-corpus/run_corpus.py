#!/usr/bin/env python3
"""Horovod's own PyTorch programs, run against hora.torch with only their imports changed.

Counts how many of Horovod's PyTorch test cases (test/parallel/test_torch.py and
test/parallel/test_adasum_pytorch.py, unittest files) and CPU examples (examples/pytorch: MNIST,
the synthetic benchmark, ImageNet ResNet-50 on a tiny generated image folder) pass at N ranks
under mpirun on the CPU, and why the others do not. docs/horovod.md ("Horovod's own test suite")
holds the result. Not part of ctest: the corpus is Horovod's source, fetched from GitHub
(--download) or given as a folder (--corpus) with Horovod's layout (test/parallel,
examples/pytorch).

    python3 tests/horovod-corpus/run_corpus.py --python build/venv/bin/python \
        --build build --corpus ~/horovod-0.28.1 [--np 2] [--json out.json] [-k allreduce]

The change to each program is its imports only: `horovod.torch` -> `hora.torch`, and
`import horovod` -> `import hora as horovod`. The harness supplies what Horovod's test folder
supplies beside the programs and is not Horovod's API: test/utils/common.py's three helpers
(written here; Horovod's file imports horovod.runner, cloudpickle and mock), and, on Python >=
3.11, `inspect.getargspec` (which Python removed; the tests call it to filter optimizer kwargs).

Each test file runs in one mpirun, with a per-case timeout; when it ends early the cases left
run in a new one. Every failed case then runs again alone in its own mpirun (as Horovod's CI
runs each case in a fresh process with pytest --forked), and that result counts. A case passes
when it passes on every rank. Skips are classified by their reason: a GPU needed, Gloo needed
(Horovod skips these under MPI too), or skipped in Horovod's source itself.
"""
import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

HOROVOD_TAG = "v0.28.1"
TARBALL = f"https://github.com/horovod/horovod/archive/refs/tags/{HOROVOD_TAG}.tar.gz"
TEST_FILES = ["test/parallel/test_torch.py", "test/parallel/test_adasum_pytorch.py"]
EXAMPLES = ["pytorch_mnist.py", "pytorch_synthetic_benchmark.py", "pytorch_imagenet_resnet50.py"]
MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp",
             "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
             "--mca", "btl_vader_single_copy_mechanism", "none"]

COMMON_PY = '''"""The three helpers Horovod's test_torch.py imports from test/utils/common.py."""
import contextlib
import os
import shutil
import tempfile


def mpi_env_rank_and_size():
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if os.environ.get(rank_var) is not None and os.environ.get(size_var) is not None:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    if int(os.environ.get("HOROVOD_TEST_GPU", 0)):
        test.fail(message)
    else:
        test.skipTest(message)


@contextlib.contextmanager
def temppath():
    path = tempfile.mktemp()
    try:
        yield path
    finally:
        if os.path.isfile(path):
            os.remove(path)
        elif os.path.exists(path):
            shutil.rmtree(path)
'''

CONFTEST_PY = '''"""The harness's side of each rank: every case's outcome appended to CORPUS_LOG as it ends
(a later hang loses nothing), a case that runs past CORPUS_CASE_TIMEOUT ends the process
(faulthandler's watchdog works while a thread is blocked in C), and, on Python >= 3.11,
inspect.getargspec, which Python removed and Horovod's tests call."""
import collections
import faulthandler
import inspect
import json
import os


def _log(name, outcome, message):
    path = os.environ["CORPUS_LOG"].replace("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    with open(path, "a") as f:
        f.write(json.dumps([name, outcome, message]) + "\\n")


def pytest_runtest_setup(item):
    faulthandler.dump_traceback_later(int(os.environ.get("CORPUS_CASE_TIMEOUT", "180")),
                                      exit=True)


def pytest_runtest_teardown(item):
    faulthandler.cancel_dump_traceback_later()


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[-1]
    if report.skipped:
        lr = report.longrepr
        _log(name, "skip", lr[2] if isinstance(lr, tuple) else str(lr))
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        _log(name, "fail", crash.message if crash else report.longreprtext.splitlines()[-1])
    elif report.when == "call":
        _log(name, "pass", "")

if not hasattr(inspect, "getargspec"):
    _Spec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")

    def getargspec(func):
        s = inspect.getfullargspec(func)
        return _Spec(s.args, s.varargs, s.varkw, s.defaults)

    inspect.getargspec = getargspec
'''


def rewrite_imports(text):
    """Horovod's imports -> hora's; nothing else changes."""
    text = re.sub(r"^(\s*)import horovod\.torch as hvd\b", r"\1import hora.torch as hvd", text,
                  flags=re.M)
    text = re.sub(r"^(\s*)from horovod\.torch(\.[\w.]+)? import", r"\1from hora.torch\2 import",
                  text, flags=re.M)
    text = re.sub(r"^(\s*)import horovod\s*$", r"\1import hora as horovod", text, flags=re.M)
    return text


def fetch_corpus(dest):
    os.makedirs(dest, exist_ok=True)
    tgz = os.path.join(dest, f"horovod-{HOROVOD_TAG}.tar.gz")
    print(f"downloading {TARBALL}", flush=True)
    urllib.request.urlretrieve(TARBALL, tgz)
    with tarfile.open(tgz) as tf:
        members = [m for m in tf.getmembers()
                   if any(m.name.endswith(p) for p in TEST_FILES + ["examples/pytorch/" + e
                                                                   for e in EXAMPLES])]
        tf.extractall(dest, members=members)
    return os.path.join(dest, f"horovod-{HOROVOD_TAG[1:]}")


def test_cases(path):
    tree = ast.parse(open(path).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out += sorted(f"{node.name}::{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name.startswith("test"))
    return out  # sorted as unittest's loader (and so pytest) runs them


def classify_skip(msg):
    m = msg.lower()
    if "gpu" in m or "cuda" in m:
        return "skip: needs a GPU"
    if "gloo" in m:
        return "skip: Gloo only (Horovod skips it under MPI too)"
    return "skip in Horovod's source: " + msg.strip()[:80]


def rank_outcomes(log_path):
    """{case name: (pass|fail|skip, message)} of one rank's log (the first failure or skip of
    a case wins over a later pass of its teardown)."""
    out = {}
    if os.path.exists(log_path):
        for line in open(log_path):
            name, outcome, message = json.loads(line)
            if name not in out or out[name][0] == "pass":
                out[name] = (outcome, (message or "").strip().splitlines()[0][:200]
                             if message else "")
    return out


def combine(outs, name, alone=False):
    """One case's outcome over the ranks' outcomes (None where a rank has no result)."""
    per_rank = [o.get(name) for o in outs]
    failed = [o for o in per_rank if o is not None and o[0] == "fail"]
    if any(o is None for o in per_rank):
        # A rank that failed ends its pytest and mpirun then ends the others: its failure is
        # the result when the case ran alone.
        return ("fail", failed[0][1]) if failed and len(outs) > 0 and alone else None
    kinds = {o[0] for o in per_rank}
    if kinds == {"pass"}:
        return ("pass", "")
    if "skip" in kinds and kinds <= {"skip", "pass"}:
        return ("skip", classify_skip(next(o[1] for o in per_rank if o[0] == "skip")))
    return ("fail", next(o for o in per_rank if o[0] == "fail")[1])


def run_pytest(args, env, workdir, test_file, selector, tag, timeout):
    """One mpirun of pytest on `selector`; each rank's outcomes, and whether mpirun hung."""
    log = os.path.join(workdir, "results", tag + ".RANK.jsonl")
    cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--color=no", *selector]
    full = ["timeout", "-k", "10", str(timeout), args.mpirun, *MPI_FLAGS, "-np", str(args.np),
            *cmd]
    p = subprocess.run(full, cwd=os.path.dirname(test_file),
                       env=dict(env, CORPUS_LOG=log, CORPUS_CASE_TIMEOUT=str(args.timeout)),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if args.verbose and p.returncode != 0:
        print(p.stdout[-3000:])
    outs = [rank_outcomes(log.replace("RANK", str(r))) for r in range(args.np)]
    return outs, p.returncode in (124, 137)


def run_file(args, env, workdir, test_file, cases):
    """The cases in one mpirun; when it ends early (a rank died or hung past the per-case
    timeout), the cases without a result again in one mpirun, the one that was running alone.
    Then each case that failed again in its own mpirun (a failure that leaves the ranks out of
    step, or a process set left registered, must not decide the cases after it)."""
    base = os.path.basename(test_file)  # node ids relative to the file's folder (pytest's cwd)
    outcome, took, left, rnd = {}, {}, list(cases), 0
    while left:
        rnd += 1
        t0 = time.time()
        sel = [f"{base}::{c}" for c in left]  # pytest runs them in this (unittest's) order
        outs, _ = run_pytest(args, env, workdir, test_file, sel, f"{base}.{rnd}",
                             args.timeout + 60 if len(left) == 1 else args.file_timeout)
        got = {c: combine(outs, c.split("::")[1]) for c in left}
        done = [c for c in left if got[c] is not None]
        for c in done:
            outcome[c], took[c] = got[c], (time.time() - t0) / max(1, len(done))
        if got[left[0]] is None:  # the case that was running when the run ended
            outcome[left[0]] = ("fail", f"no result: hung past {args.timeout} s or a rank died")
            took[left[0]] = time.time() - t0
        left = [c for c in left if c not in outcome]
    results = {}
    for case in cases:
        r, t = outcome[case], took[case]
        if r[0] == "fail":
            t1 = time.time()
            o, _ = run_pytest(args, env, workdir, test_file, [f"{base}::{case}"],
                              re.sub(r"\W", "_", case), args.timeout + 60)
            r = combine(o, case.split("::")[1], alone=True) or r
            t = time.time() - t1
        results[f"{base}::{case.split('::')[1]}"] = r + (t,)
        print(f"{r[0]:5} {t:6.1f}s {base}::{case.split('::')[1]} {r[1]}", flush=True)
    return results


FAKE_IMAGES_PY = """
import os, sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for split in ("train", "val"):
    for c in range(2):
        d = os.path.join(sys.argv[1], split, f"class{c}")
        os.makedirs(d, exist_ok=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(
                os.path.join(d, f"{i}.png"))
"""


def fake_image_folder(python, root):
    """Two classes of four random 48x48 images for train and val (ImageFolder's layout), made
    by the interpreter under test (it has NumPy and Pillow through torchvision)."""
    subprocess.run([python, "-c", FAKE_IMAGES_PY, root], check=True)


def mnist_dir(root, src):
    """torchvision's MNIST layout from the repository's 10k real images (real_data.sh)."""
    out = subprocess.run(["bash", os.path.join(src, "tests/common/real_data.sh"), root],
                         stdout=subprocess.PIPE, text=True, env=dict(os.environ,
                         HORA_SOURCE_DIR=src))
    if out.returncode != 0:
        return None
    data = out.stdout.split()[0]
    raw = os.path.join(root, "mnist", "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        p = os.path.join(data, name)
        if os.path.exists(p):
            shutil.copy(p, raw)
        else:
            subprocess.run(f"gzip -dc '{p}.gz' > '{os.path.join(raw, name)}'", shell=True,
                           check=True)
    return os.path.join(root, "mnist")


def run_examples(args, env, workdir, src):
    ex = os.path.join(workdir, "examples")
    runs = []
    mnist = mnist_dir(os.path.join(workdir, "data"), src)
    if mnist:
        runs.append(("pytorch_mnist.py", ["--epochs", "1", "--data-dir", mnist],
                     "Test set: Average loss"))
        runs.append(("pytorch_mnist.py", ["--epochs", "1", "--data-dir", mnist,
                                          "--use-adasum"], "Test set: Average loss"))
    runs.append(("pytorch_synthetic_benchmark.py",
                 ["--model", "resnet18", "--batch-size", "2", "--num-warmup-batches", "1",
                  "--num-batches-per-iter", "1", "--num-iters", "2"], "Total img/sec on"))
    fake_image_folder(args.python, os.path.join(workdir, "imagenet"))
    runs.append(("pytorch_imagenet_resnet50.py",
                 ["--train-dir", os.path.join(workdir, "imagenet/train"),
                  "--val-dir", os.path.join(workdir, "imagenet/val"), "--epochs", "1",
                  "--batch-size", "2", "--val-batch-size", "2",
                  "--log-dir", os.path.join(workdir, "logs"),
                  "--checkpoint-format", os.path.join(workdir, "ckpt-{epoch}.pth.tar")],
                 None))
    results = {}
    for name, extra, marker in runs:
        cmd = ["timeout", "-k", "10", str(args.example_timeout), args.mpirun, *MPI_FLAGS,
               "-np", str(args.np), args.python, os.path.join(ex, name), *extra]
        t0 = time.time()
        p = subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        ok = p.returncode == 0 and (marker is None or marker in p.stdout)
        if name == "pytorch_imagenet_resnet50.py":
            ok = ok and os.path.exists(os.path.join(workdir, "ckpt-1.pth.tar"))
        why = "" if ok else (f"rc {p.returncode}: " + (p.stdout.strip().splitlines() or [""])[-1])
        key = "examples/pytorch/" + name + "".join(" " + a for a in extra if a.startswith("--use"))
        results[key] = ("pass" if ok else "fail", why[:200], time.time() - t0)
        if not ok and args.verbose:
            print(p.stdout[-3000:])
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--build", default="build", help="hora's build folder (holds python/hora)")
    ap.add_argument("--corpus", help="a Horovod source tree (test/parallel, examples/pytorch)")
    ap.add_argument("--download", metavar="DIR", help=f"fetch Horovod {HOROVOD_TAG} into DIR")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=180, help="seconds per test case")
    ap.add_argument("--file-timeout", type=int, default=1800,
                    help="seconds for one file's whole run")
    ap.add_argument("--example-timeout", type=int, default=900)
    ap.add_argument("-k", dest="filter", help="only cases whose name contains this")
    ap.add_argument("--no-examples", action="store_true")
    ap.add_argument("--only-examples", action="store_true")
    ap.add_argument("--json", help="write every case's outcome here")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    # The programs run in their own folders: paths given relative to here must still hold there
    # (a bare command name such as python3 is looked up on PATH and stays as it is).
    for a in ("python", "mpirun", "build", "corpus", "download", "json"):
        v = getattr(args, a)
        if v and (os.sep in v or a not in ("python", "mpirun")):
            setattr(args, a, os.path.abspath(v))
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    corpus = args.corpus or (fetch_corpus(args.download) if args.download else None)
    if not corpus:
        ap.error("give --corpus DIR (a Horovod source tree) or --download DIR")
    workdir = tempfile.mkdtemp(prefix="hora-horovod-corpus.")
    try:
        return run_all(args, corpus, workdir, src)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_all(args, corpus, workdir, src):
    for sub in ("parallel", "utils", "examples", "results"):
        os.makedirs(os.path.join(workdir, sub))
    with open(os.path.join(workdir, "utils", "common.py"), "w") as f:
        f.write(COMMON_PY)
    with open(os.path.join(workdir, "parallel", "conftest.py"), "w") as f:
        f.write(CONFTEST_PY)
    files = []
    for rel in TEST_FILES:
        if not os.path.exists(os.path.join(corpus, rel)):  # a copy that lacks it: said, not run
            print(f"note: {rel} is not in {corpus}: not run", flush=True)
            continue
        dst = os.path.join(workdir, "parallel", os.path.basename(rel))
        with open(os.path.join(corpus, rel)) as f, open(dst, "w") as g:
            g.write(rewrite_imports(f.read()))
        files.append(dst)
    for name in ([] if args.no_examples else EXAMPLES):
        with open(os.path.join(corpus, "examples/pytorch", name)) as f, \
                open(os.path.join(workdir, "examples", name), "w") as g:
            g.write(rewrite_imports(f.read()))
    deps = os.path.join(workdir, "deps")
    env = dict(os.environ, HORA_LOG="NONE", PYTHONDONTWRITEBYTECODE="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(workdir, "torch-cache"),
               PYTHONPATH=os.pathsep.join([os.path.abspath(os.path.join(args.build, "python")),
                                           deps]), HOME=workdir)
    # the ImageNet example's own dependency (not Horovod's): tqdm
    if subprocess.run([args.python, "-c", "import tqdm"], env=env,
                      stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run([args.python, "-m", "pip", "install", "-q", "--target", deps, "tqdm"],
                       env=env)
    results = {}
    for path in ([] if args.only_examples else files):
        cases = [c for c in test_cases(path) if not args.filter or args.filter in c]
        if cases:
            results.update(run_file(args, env, workdir, path, cases))
    if not args.no_examples and not args.filter:
        for key, r in run_examples(args, env, workdir, src).items():
            results[key] = r
            print(f"{r[0]:5} {r[2]:6.1f}s {key} {r[1]}", flush=True)
    summarize(results, args)
    return 0


def summarize(results, args):
    n = len(results)
    passed = sum(r[0] == "pass" for r in results.values())
    failed = {k: r for k, r in results.items() if r[0] == "fail"}
    skips = {}
    for r in results.values():
        if r[0] == "skip":
            skips[r[1]] = skips.get(r[1], 0) + 1
    gpu = skips.get("skip: needs a GPU", 0)
    runnable = n - sum(skips.values())
    print(f"\n{n} programs/cases at {args.np} ranks: {passed} pass, {len(failed)} fail, "
          f"{sum(skips.values())} skipped")
    for why, k in sorted(skips.items()):
        print(f"  {k:3} {why}")
    print(f"pass ratio of the {n - gpu} that do not need a GPU: {passed}/{n - gpu} = "
          f"{100.0 * passed / max(1, n - gpu):.1f}%; of the {runnable} that run on CPU under "
          f"MPI: {passed}/{runnable} = {100.0 * passed / max(1, runnable):.1f}%")
    for k, r in sorted(failed.items()):
        print(f"  FAIL {k}: {r[1]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: list(r) for k, r in results.items()}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
