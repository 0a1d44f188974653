#!/bin/sh
# `HORA_BUILD_DIR=BUILD pip install ./python` (the developers' way: only the cffi extension is
# compiled, linked to the build tree's libhora), into a fresh virtual environment, then a 2-rank
# allreduce through the installed package (not the copy in <build>/python). pip fetches the build
# backend (scikit-build-core) and numpy/cffi from PyPI or its wheel cache.
# Usage: pip_install_check.sh BUILD_DIR SOURCE_DIR PYTHON MPIEXEC [MPIEXEC_FLAGS...]
set -eu
build=$1 src=$2 py=$3
shift 3
work=$build/python-pip
rm -rf "$work"
mkdir -p "$work"
cp -r "$src/python" "$work/src"   # pip builds in the source folder: keep the checkout clean
cp "$src/VERSION" "$work/VERSION" # pyproject.toml reads the version from ../VERSION
rm -rf "$work/src/build" "$work/src/hora.egg-info"
trap 'rm -rf "$work"' EXIT
"$py" -m venv "$work/venv"
HORA_BUILD_DIR=$build "$work/venv/bin/python" -m pip install -q "$work/src"
ldd "$work"/venv/lib/python*/site-packages/hora/_hora_cffi*.so | grep -q "$build/lib/libhora.so" || {
  echo "FAIL: the extension does not link $build/lib/libhora.so"; exit 1; }
cd "$work"
PYTHONPATH= "$@" -np 2 "$work/venv/bin/python" -c '
import sys
import numpy as np
import hora
assert hora.__file__.startswith(sys.prefix), hora.__file__
hora.init()
out = hora.allreduce(np.full(3, hora.rank() + 1, dtype=np.int64), op=hora.Sum)
assert out.tolist() == [3, 3, 3], out
hora.shutdown()
print("pip-installed hora OK:", hora.__file__)
'
