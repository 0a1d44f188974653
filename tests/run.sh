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

# Scheduling (docs/testing.md, "Time budget"): CPU-bound tests share CTEST_JOBS `cpus` slots (one
# per core, at least 2), tests labelled `wait` (mostly sleeping on timeouts) WAIT_JOBS `waits`
# slots beside them, and the builds labelled `background` (tests/common/background.sh) one
# `background` slot, in one ctest run per build tree.
CPUS=${CTEST_JOBS:-$JOBS}
[ "$CPUS" -ge 2 ] || CPUS=2
WAITS=${WAIT_JOBS:-4}
# ctest_sched ARGS...: ctest in the current (build) folder with that resource spec.
ctest_sched() {
  printf '{"version": {"major": 1, "minor": 0}, "local": [{"cpus": [{"id": "0", "slots": %d}], "waits": [{"id": "0", "slots": %d}], "background": [{"id": "0", "slots": 1}]}]}\n' \
    "$CPUS" "$WAITS" >ctest-resources.json
  ctest --resource-spec-file "$PWD/ctest-resources.json" -j $((2 * (CPUS + WAITS) + 1)) "$@"
}
phase() { echo "== $* (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"; }
# machine [WHAT]: the machine's cores, memory and load (the first call), then with each later call
# the seconds for which some task waited for the CPU, for memory and for I/O during WHAT, since the
# previous call (Linux's pressure stall information, /proc/pressure): what a failure of a
# timing-bound test (the fault tests' peer timeouts) is read against, in a CI log too
# (docs/testing.md).
psi_prev=
machine() {
  local now r
  now=$(for r in cpu memory io; do
          sed -n 's/^some .*total=\([0-9]*\).*/\1/p' "/proc/pressure/$r" 2>/dev/null || true
        done | tr '\n' ' ')
  if [ -z "$psi_prev" ]; then
    awk -v cpus="$(nproc)" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" \
      '/^MemTotal:/ {t = $2} /^MemAvailable:/ {a = $2} /^SwapTotal:/ {s = $2}
       END {printf "== machine: %d CPUs, memory %d MiB (%d MiB available), swap %d MiB, load %s\n",
            cpus, t / 1024, a / 1024, s / 1024, load}' /proc/meminfo
  elif [ -n "$now" ]; then
    echo "$psi_prev $now" | awk -v what="$1" '{n = NF / 2; if (n == 3) printf "== pressure during %s: some task waited %.0f s for the CPU, %.0f s for memory, %.0f s for I/O (/proc/pressure)\n", what, ($4 - $1) / 1e6, ($5 - $2) / 1e6, ($6 - $3) / 1e6}'
  fi
  psi_prev=${now:-none}
}

machine
bash tests/install-deps.sh

phase "python venv ($BUILD_DIR/venv; its packages install beside the build)"
mkdir -p "$BUILD_DIR"
VENV=$(cd "$BUILD_DIR" && pwd)/venv
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# Installs only when requirements.txt changed since the last successful install (torch is large).
# The install (mostly downloading and unpacking PyTorch, one core at most) runs beside the C
# build below; the build is configured again once it is done, which adds the Python tests.
# --no-compile, then the byte-compilation in the background (background.sh): pip byte-compiles every
# installed module in the foreground otherwise (22 s of a 80 s install here, most of it
# PyTorch's). compileall writes the .pyc files even where PYTHONDONTWRITEBYTECODE is set.
stamp=$VENV/.hora-requirements
PIP_LOG=$VENV/pip-install.log
pip_pid=
if ! cmp -s tests/python/requirements.txt "$stamp"; then
  rm -f "$stamp"
  "$VENV/bin/python" -m pip install -q --no-compile -r tests/python/requirements.txt >"$PIP_LOG" 2>&1 &
  pip_pid=$!
fi

phase "configure and build ($BUILD_DIR; the sanitizer trees build beside it and the tests)"
# The AddressSanitizer and ThreadSanitizer trees build in the background at the lowest priority
# (tests/common/background.sh: a session of its own at nice 19) while this build and the plain
# pass run: that pass leaves about a quarter of the cores idle (tests that mostly wait), which
# the builds fill (docs/testing.md, "Time budget").
# -O1 for ASan, as AddressSanitizer's documentation advises "to get a reasonable performance":
# the test_coll sweeps (most of that pass) take a third of their -O0 CPU time.
SAN_LOG=$(cd "$BUILD_DIR" && pwd)/sanitizer-builds.log
sh tests/common/background.sh bash -c '
  cmake -S . -B "$1-asan" -DCMAKE_BUILD_TYPE=Debug -DHORA_SANITIZE=ON -DHORA_WITH_CUDA=OFF \
    -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
    -DPython3_EXECUTABLE="$2/bin/python" >/dev/null &&
    cmake --build "$1-asan" -j "$3" &&
    TSAN_BUILD_ONLY=1 sh tests/engine/tsan.sh "$1-tsan"' _ "$BUILD_DIR" "$VENV" "$JOBS" >"$SAN_LOG" 2>&1 &
san_pid=$!
# (the builds' session is their process group: the whole of it goes if this script fails)
trap 'kill -- -$san_pid 2>/dev/null; kill $san_pid $pip_pid 2>/dev/null || true' EXIT
# configure PENDING: PENDING=1 while the venv's packages are still installing (the Python tests
# are then left out quietly, not replaced by the failing python_deps test).
configure() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHORA_PYTHON="$VENV/bin/python" \
    -DPython3_EXECUTABLE="$VENV/bin/python" -DHORA_PYTHON_PENDING="$1" >/dev/null
}
configure "$([ -n "$pip_pid" ] && echo 1 || echo 0)"
cmake --build "$BUILD_DIR" -j "$JOBS"
if [ -n "$pip_pid" ]; then
  phase "waiting for the venv's packages"
  if ! wait "$pip_pid"; then
    cat "$PIP_LOG"
    echo "== pip install -r tests/python/requirements.txt into $VENV failed (above)"
    exit 1
  fi
  pip_pid=
  cp tests/python/requirements.txt "$stamp"
  (sh tests/common/background.sh "$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null 2>&1 || true) &
  configure 0 # now with the Python tests (tests/python/CMakeLists.txt checks the packages)
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi

phase tests
status=0
(cd "$BUILD_DIR" && ctest_sched --output-on-failure --timeout 600) || status=1

machine "the build and the plain pass"
phase "tests under AddressSanitizer + UndefinedBehaviorSanitizer (labels unit and mpi, less nosan)"
if ! wait $san_pid; then
  cat "$SAN_LOG"
  echo "== the sanitizer builds failed (above)"
  exit 1
fi
trap - EXIT
# Open MPI's own allocations are reported as leaks by LeakSanitizer; hora's are checked by
# valgrind-free ASan errors (use-after-free, overflows) and UBSan, which abort the test.
# Sanitized ranks run several times slower: a longer peer timeout keeps a slow rank from being
# declared dead (the peer-death tests set their own short timeouts).
(cd "$BUILD_DIR-asan" && HORA_PEER_TIMEOUT_S=120 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest_sched --output-on-failure -L 'unit|mpi' -LE 'slow|slurm|nosan' --timeout 600) || status=1

machine "the AddressSanitizer pass"
phase "engine tests under ThreadSanitizer"
sh tests/engine/tsan.sh "$BUILD_DIR-tsan" || status=1

machine "the ThreadSanitizer pass"
phase done
if [ $status = 0 ]; then echo "== all tests passed"; else echo "== SOME TESTS FAILED"; fi
exit $status
