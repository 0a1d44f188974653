#!/bin/bash
# The test command: installs what is missing, builds hora (and its CUDA code when nvcc exists),
# runs the whole ctest suite, then the suite again under AddressSanitizer+UBSan, then the engine
# tests under ThreadSanitizer.
# Usage: bash tests/run.sh   (from anywhere; BUILD_DIR defaults to build)
# Python packages (tests/python/requirements.txt, torch included) go into a virtual environment,
# $BUILD_DIR/venv, made once and reused: nothing is pip-installed into the system interpreter
# (Debian's python3 refuses that, PEP 668), and whichever python3 is first on PATH makes it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PATH=/usr/local/cuda/bin:$PATH

bash tests/install-deps.sh

echo "== python venv ($BUILD_DIR/venv)"
mkdir -p "$BUILD_DIR"
VENV=$(cd "$BUILD_DIR" && pwd)/venv
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# Installs only when requirements.txt changed since the last successful install (torch is large).
stamp=$VENV/.hora-requirements
if ! cmp -s tests/python/requirements.txt "$stamp"; then
  "$VENV/bin/python" -m pip install -q -r tests/python/requirements.txt
  cp tests/python/requirements.txt "$stamp"
fi

echo "== configure and build ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHORA_PYTHON="$VENV/bin/python" \
  -DPython3_EXECUTABLE="$VENV/bin/python" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

echo "== tests"
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "${CTEST_JOBS:-2}" --timeout 600) || status=1

echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer (unit and mpi labels)"
cmake -S . -B "$BUILD_DIR-asan" -DCMAKE_BUILD_TYPE=Debug -DHORA_SANITIZE=ON -DHORA_WITH_CUDA=OFF \
  -DPython3_EXECUTABLE="$VENV/bin/python" >/dev/null
cmake --build "$BUILD_DIR-asan" -j "$JOBS"
# Open MPI's own allocations are reported as leaks by LeakSanitizer; hora's are checked by
# valgrind-free ASan errors (use-after-free, overflows) and UBSan, which abort the test.
# Sanitized ranks run several times slower: a longer peer timeout keeps a slow rank from being
# declared dead (the peer-death tests set their own short timeouts).
(cd "$BUILD_DIR-asan" && HORA_PEER_TIMEOUT_S=120 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "${CTEST_JOBS:-2}" -L 'unit|mpi' -LE 'slow|slurm' --timeout 600) || status=1

echo "== engine tests under ThreadSanitizer"
sh tests/engine/tsan.sh "$BUILD_DIR-tsan" || status=1

if [ $status = 0 ]; then echo "== all tests passed"; else echo "== SOME TESTS FAILED"; fi
exit $status
