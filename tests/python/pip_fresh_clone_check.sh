#!/bin/bash
# What a Python user does on a new machine: a clean copy of the repository (its tracked files, as
# `git clone` gives them; no build tree, no environment variables), `pip install ./python` in a
# fresh virtual environment, which builds libhora with CMake and the cffi extension (scikit-build-
# core; PyPI must be reachable, pip's wheel cache keeps repeated runs fast). Then `pip wheel
# ./python`, the source copy is deleted, and the wheel is installed into a second venv: both
# installs run a 2-rank allreduce from Python with asserted values and the `hora-launch` command.
# The CUDA code is left out of this build (--config-settings=cmake.define.HORA_WITH_CUDA=OFF) only
# to keep the test short on small machines (on a loaded 2-core machine the CUDA kernels make the
# test 4x longer); the plain command builds them where nvcc exists, and the main build tests them.
#   pip_fresh_clone_check.sh SOURCE_DIR PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
# (grep reads each listing to its end, not grep -q: with pipefail, a writer cut off by SIGPIPE
# would fail the check although the line was there)
src=$1 py=$2
shift 2
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-pip-clone.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== clean copy of $src"
mkdir "$work/hora"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # the files a commit of the working tree would hold (a clone of HEAD would miss uncommitted work)
  git -C "$src" ls-files -z --cached --others --exclude-standard | tar -C "$src" --null --ignore-failed-read -T - -cf - | tar -C "$work/hora" -xf -
else
  tar -C "$src" --exclude='./build*' --exclude='./python/build' -cf - . | tar -C "$work/hora" -xf -
fi
[ ! -e "$work/hora/build" ] && [ ! -e "$work/hora/python/build" ] || fail "the copy has a build folder"

echo "== pip install ./python (fresh venv, no environment variables)"
"$py" -m venv "$work/venv-a"
cd "$work/hora"
t0=$(date +%s)
env -u HORA_BUILD_DIR -u HORA_PREFIX -u PYTHONPATH "$work/venv-a/bin/python" -m pip install -q \
  --config-settings=cmake.define.HORA_WITH_CUDA=OFF ./python || fail "pip install ./python failed"
echo "pip install ./python: $(( $(date +%s) - t0 )) s"

echo "== pip wheel ./python, then the wheel alone in another venv"
env -u HORA_BUILD_DIR -u HORA_PREFIX "$work/venv-a/bin/python" -m pip wheel -q --no-deps \
  --config-settings=cmake.define.HORA_WITH_CUDA=OFF -w "$work/wheels" ./python || fail "pip wheel ./python failed"
whl=$(ls "$work"/wheels/hora-*.whl)
"$work/venv-a/bin/python" -m zipfile -l "$whl" | grep "hora/lib/libhora.so" >/dev/null || fail "$whl lacks hora/lib/libhora.so"
cd "$work"
rm -rf "$work/hora" # nothing may refer back to the source or its build folder
"$py" -m venv "$work/venv-b"
"$work/venv-b/bin/python" -m pip install -q "$whl" || fail "pip install $whl failed"

for v in venv-a venv-b; do
  echo "== $v: 2-rank allreduce"
  PYTHONPATH= HORA_LOG=NONE "$@" -np 2 "$work/$v/bin/python" -c '
import sys
import numpy as np
import hora
assert hora.__file__.startswith(sys.prefix), hora.__file__
hora.init()
r, n = hora.rank(), hora.size()
assert n == 2, n
out = hora.allreduce(np.arange(5, dtype=np.float64) * (r + 1), op=hora.Sum)
assert out.tolist() == [0.0, 3.0, 6.0, 9.0, 12.0], out
avg = hora.allreduce(np.full(4, r + 1, dtype=np.float32), op=hora.Average)
assert avg.tolist() == [1.5, 1.5, 1.5, 1.5], avg
hora.shutdown()
print("rank", r, "allreduce OK from", hora.__file__)
' || fail "$v: the 2-rank allreduce failed"
  "$work/$v/bin/hora-launch" --help | grep "usage: launch" >/dev/null || fail "$v: hora-launch --help"
done
echo "PASS: pip install ./python and its wheel work from a clean copy"
