#!/bin/bash
# The GPU path proven in one command, on a GPU machine that starts bare (CUDA, PyTorch and Python,
# no Open MPI, no hwloc, no network). docs/gpu.md says how to run it; its figures go into
# docs/benchmarks.md ("GPU").
#
#   bash tests/gpu/device-prepare.sh          here, once: fills .debs/ (carried with the tree)
#   bash tests/gpu/device-check.sh            there: OUT=<folder> receives every log + summary.md
#
# Steps, in this order, each time-boxed (seconds in brackets) so that the whole ends within
# 8 minutes; a failing step is recorded and the next one still runs:
#   deps    [60]   Open MPI, hwloc, jansson, OpenBLAS from .debs/ (dpkg -x into a prefix, Open
#                  MPI relocated with OPAL_PREFIX) where the machine lacks them; cffi wheels
#   build   [240]  hora for the GPU found (sm_90 on H100/H200), Release, NCCL from the CUDA
#                  toolkit or PyTorch's nvidia-nccl wheel
#   gpu     [10]   is there a GPU? Without one: summary says so, exit 77 (the CI dry run)
#   ctest   [150]  ctest -L gpu: kernels vs host, every collective on device buffers (NCCL with
#                  one rank, the staged and naive paths with 2-4 ranks on the one GPU), layers
#   bench   [210]  hora-bench allreduce --device cuda: kernel GB/s vs a D2D copy, staged vs naive
#                  (2 and 4 ranks on the GPU), hora's NCCL call overhead vs ncclAllReduce (1 rank)
#   mnist   [150]  examples/mnist/bench.sh DEVICE=cuda: the CNN on the GPU vs PyTorch, same GPU,
#                  batch 64 and 256
#   python  [180]  the DLPack / torch tests of tests/python, hora.torch on CUDA tensors (1 and 2
#                  ranks), Horovod's MNIST example and synthetic benchmark on the GPU
#   ddp     [240]  only when HORA_DEVICE_STEPS names it (it needs no GPU, and the default run
#                  has no time left for it): python/bench/bench_ddp.py on the machine's CPU
#                  cores, ranks bound one per core, ResNet-50's gradients averaged by
#                  DistributedOptimizer against DDP over gloo (--alone, then training steps),
#                  for HORA_DEVICE_DDP_NP ranks (default "2 4"): the 4-rank figures of
#                  docs/benchmarks.md that a 2-core machine cannot give
#   script [300]   only when HORA_DEVICE_STEPS names it: bash $HORA_DEVICE_SCRIPT, a measurement
#                  of one's own in the prepared environment (ROOT, BUILD, DEPS, OUT exported)
# Exit status: 0 when every step passed, 77 when there is no GPU (and deps and build passed),
# 1 otherwise. Environment: OUT (default build-device/out), HORA_DEVICE_DEPS (.debs),
# HORA_DEVICE_BUILD (build-device), HORA_DEVICE_USE_DEBS=1 (use the carried packages even where
# the machine has its own), HORA_DEVICE_DEPS_S and HORA_DEVICE_BUILD_S (the deps and build steps'
# limits, default 60 and 240),
# HORA_DEVICE_BUILD_TARGETS (build only these; default all: the GPU steps need the tests),
# CMAKE_CUDA_ARCHITECTURES (default: the GPU's, else 90), HORA_DEVICE_DEADLINE_S (see step()),
# HORA_DEVICE_STEPS (GPU steps to run), HORA_DEVICE_BENCH_NP (default "2 4"),
# HORA_DEVICE_MNIST_BATCHES (default "64 256"), HORA_DEVICE_DDP_NP (default "2 4").
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-device/out}
DEPS=${HORA_DEVICE_DEPS:-.debs}
BUILD=${HORA_DEVICE_BUILD:-build-device}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$OUT" "$BUILD"
SELF=$ROOT/tests/gpu/device-check.sh

# step NAME SECONDS LOG: runs this script's function NAME in a child (`--step NAME`, which first
# reads the environment that the deps step wrote) under a time box, appends its output to
# OUT/LOG and records status and seconds for the summary.
# HORA_DEVICE_DEADLINE_S (default 540) caps the whole: each step's limit is cut to what is left
# of it, less 10 s for the summary, and a step with under 15 s left is not started, so the
# summary is always written inside a device run's limit.
step() {
  local name=$1 secs=$2 log=$OUT/$3 t0 rc left
  left=$((START + ${HORA_DEVICE_DEADLINE_S:-540} - 10 - $(date +%s)))
  if [ $left -lt 15 ]; then
    rows+=("| $name | NOT RUN (deadline) | 0 |"); failed=1
    echo "   $name: not run, ${left}s left before the deadline" | tee -a "$log"
    return 124
  fi
  [ $secs -gt $left ] && secs=$left
  echo "== $name (limit ${secs}s)" | tee -a "$log"
  t0=$(date +%s)
  HORA_DEVICE_PREFIX=$PREFIX timeout -k 10 "$secs" bash "$SELF" --step "$name" >>"$log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t0)) st=passed
  [ $rc = 124 ] || [ $rc = 137 ] && st="TIMED OUT"
  [ $rc != 0 ] && [ "$st" = passed ] && st="FAILED (exit $rc)"
  [ $rc = 77 ] && st="skipped (77)"
  [ "$st" = passed ] || [ $rc = 77 ] || failed=1
  rows+=("| $name | $st | $dt |")
  echo "   $name: $st in ${dt}s" | tee -a "$log"
  return $rc
}

# --- deps: prefer the machine's own Open MPI etc.; else the carried packages -------------------
deps() {
  . tests/gpu/device-deps.sh
  local need=0
  [ "${HORA_DEVICE_USE_DEBS:-0}" = 1 ] && need=1
  command -v mpicc >/dev/null && command -v mpirun >/dev/null || need=1
  pkg-config --exists jansson hwloc 2>/dev/null || need=1
  if [ $need = 1 ]; then
    [ -d "$DEPS/deb" ] || { echo "no $DEPS/deb: run tests/gpu/device-prepare.sh and carry $DEPS"; return 1; }
    hora_device_unpack "$DEPS" "$PREFIX/root"
    hora_device_env "$PREFIX/root"
    echo "hora_device_env '$PREFIX/root'" >>"$ENVF"
    echo "Open MPI, hwloc, jansson, OpenBLAS from $DEPS ($(ls "$DEPS"/deb | wc -l) packages)"
  fi
  if ! python3 -c 'import cffi' 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "$DEPS/whl" --no-compile --target "$PREFIX/site" \
      cffi pycparser || return 1
    export PYTHONPATH=$PREFIX/site${PYTHONPATH:+:$PYTHONPATH}
    echo "export PYTHONPATH=$PYTHONPATH" >>"$ENVF"
  fi
  # NCCL: the toolkit's, else the one PyTorch's wheels bring.
  if [ ! -e /usr/local/cuda/include/nccl.h ]; then
    local d
    d=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) || d=
    if [ -n "$d" ] && [ -e "$d/include/nccl.h" ]; then
      {
        echo "NCCL_ARGS=(-DNCCL_INCLUDE_DIR='$d/include' -DNCCL_LIBRARY='$(ls "$d"/lib/libnccl.so* | head -1)')"
        echo "export LD_LIBRARY_PATH='$d/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
      } >>"$ENVF"
      echo "NCCL from $d"
    fi
  fi
  mpicc --showme && mpirun --version | head -1 && python3 -c 'import cffi; print("cffi", cffi.__version__)'
  python3 -c 'import numpy, torch; print("numpy", numpy.__version__, "torch", torch.__version__)' || echo "python3 lacks numpy or torch: the python step will fail"
}

# --- build -------------------------------------------------------------------------------------
build() {
  local arch=${CMAKE_CUDA_ARCHITECTURES:-}
  if [ -z "$arch" ]; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    [ -n "$arch" ] || arch=90
  fi
  echo "CUDA architecture: sm_$arch"
  # A build folder left by an earlier run names that run's private prefix (a new one each run):
  # start clean.
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DHORA_WITH_CUDA=ON -DHORA_WITH_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DHORA_PYTHON="$(command -v python3)" \
    -DMPI_C_COMPILER="$(command -v mpicc)" "${NCCL_ARGS[@]}" &&
    cmake --build "$BUILD" -j "$(nproc)" ${HORA_DEVICE_BUILD_TARGETS:+--target $HORA_DEVICE_BUILD_TARGETS}
}

gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU '; }

bench_allreduce() {
  local np
  mpirun -np 1 "$BUILD/bin/hora-bench" allreduce --device cuda || return 1
  for np in ${HORA_DEVICE_BENCH_NP:-2 4}; do
    HORA_GPU_PATH=staged mpirun -np "$np" --oversubscribe "$BUILD/bin/hora-bench" allreduce --device cuda --only paths || return 1
  done
}

mnist_bench() {
  local idx=$DEPS/mnist
  [ -d "$idx" ] || idx=/usr/share/datasets/fashion-mnist
  [ -d "$idx" ] || { echo "no MNIST IDX files ($DEPS/mnist, Fashion-MNIST)"; return 77; }
  local b
  for b in ${HORA_DEVICE_MNIST_BATCHES:-64 256}; do
    echo "batch $b"
    DEVICE=cuda PYTHON=python3 BUILD_DIR=$BUILD REPS=3 STEPS=300 BATCH=$b bash examples/mnist/bench.sh "$idx" || return 1
  done
}

python_tests() {
  local t failed=0
  export PYTHONPATH=$ROOT/$BUILD/python${PYTHONPATH:+:$PYTHONPATH} HORA_LOG=NONE
  [ -d "$DEPS/mnist" ] && export HORA_MNIST_DIGITS=$ROOT/$DEPS/mnist
  for t in tests/python/test_dlpack_torch.py tests/python/test_torch_optimizer.py; do
    [ -e "$t" ] || continue
    mpirun -np 1 python3 -m pytest -q -p no:cacheprovider "$t" || failed=1
  done
  # hora.torch on CUDA tensors: 1 rank (NCCL), 2 ranks sharing the GPU (the MPI-staged path).
  for np in 1 2; do
    echo "--- test_torch_cuda.py, $np rank(s)"
    mpirun -np $np --oversubscribe -x PYTHONPATH -x HORA_LOG python3 -m pytest -q -p no:cacheprovider \
      -rs tests/python/test_torch_cuda.py || failed=1
  done
  # Horovod's examples unchanged on the GPU, 1 rank (they pin torch.cuda.set_device(local_rank),
  # which needs a GPU per rank): MNIST to its accuracy, and the synthetic ResNet-50 benchmark.
  echo "--- examples/pytorch/pytorch_mnist.py on the GPU"
  HORA_MNIST_NP=1 bash tests/python/horovod_mnist_check.sh python3 mpirun || failed=1
  echo "--- examples/pytorch/pytorch_synthetic_benchmark.py on the GPU"
  mpirun -np 1 python3 examples/pytorch/pytorch_synthetic_benchmark.py --model resnet50 \
    --batch-size 64 --num-warmup-batches 5 --num-batches-per-iter 10 --num-iters 3 || failed=1
  return $failed
}

# The 4-rank averaging of docs/benchmarks.md ("ResNet-50 gradients"), on a machine with a core per
# rank: the averaging alone (blocks of 5 per method), then training steps, each rank bound to a
# core of its own (the 2-core development VM shares 2 cores among 4 ranks).
ddp_bench() {
  local np
  export PYTHONPATH=$ROOT/$BUILD/python:${PYTHONPATH:-} HORA_LOG=WARN
  # bench NP ARGS...: bench_ddp.py on NP ranks, one bound per core
  bench() { mpirun -np "$1" --bind-to core --map-by core -x PYTHONPATH -x HORA_LOG python3 python/bench/bench_ddp.py "${@:2}"; }
  echo "$(nproc) CPUs: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
  for np in ${HORA_DEVICE_DDP_NP:-2 4}; do
    echo "--- $np ranks, averaging alone"
    bench "$np" --modes "" --alone 20 --block 5 || return 1
    echo "--- $np ranks, training steps"
    bench "$np" --model resnet50 --image-size 32 --batch-size 2 --steps 2 --repeat 5 --warmup 1 \
      --modes local,hora_opt,hora_opt_alone,hora_grouped,ddp,ddp_nosync,ddp_timed || return 1
  done
}

# --step NAME: a child run of one step (see step()).
if [ "${1:-}" = --step ]; then
  PREFIX=$HORA_DEVICE_PREFIX
  ENVF=$PREFIX/env.sh
  NCCL_ARGS=()
  . tests/gpu/device-deps.sh
  [ -e "$ENVF" ] && . "$ENVF"
  set -e
  case $2 in
    deps) deps ;; build) build ;; bench) bench_allreduce ;; mnist) mnist_bench ;;
    python) python_tests ;; ddp) ddp_bench ;;
    script) [ -n "${HORA_DEVICE_SCRIPT:-}" ] || { echo "device-check: HORA_DEVICE_SCRIPT is not set"; exit 2; }
            export ROOT BUILD DEPS OUT; bash "$HORA_DEVICE_SCRIPT" ;;
    ctest) [ -d "$DEPS/mnist" ] && export HORA_MNIST_DIGITS=$ROOT/$DEPS/mnist
           cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 120 -j 4 ;;
    *) echo "device-check: unknown step $2"; exit 2 ;;
  esac
  exit 0
fi

START=$(date +%s)
PREFIX=$(mktemp -d "${TMPDIR:-/tmp}/hora-device.XXXXXX")
trap 'rm -rf "$PREFIX"' EXIT
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
rows=()
failed=0

{
  echo "# hora device check"
  echo
  # The device machine's copy of the working tree may have no .git, or a stale one kept from an
  # earlier run: HORA_DEVICE_COMMIT, set on the command line by whoever sends the run (docs/gpu.md),
  # names the commit sent; the local git answers only without it.
  if [ -n "${HORA_DEVICE_COMMIT:-}" ]; then
    echo "Commit: $HORA_DEVICE_COMMIT (as sent)"
  else
    echo "Commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)') (the device copy's git; HORA_DEVICE_COMMIT unset)"
  fi
  echo "Machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU') ;" \
       "$(nproc) CPUs; nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo
} >>"$SUMMARY"

step deps "${HORA_DEVICE_DEPS_S:-60}" setup.log
dep_rc=$?
# A failed deps step stops the build; without a build no GPU step can run.
if [ $dep_rc = 0 ]; then step build "${HORA_DEVICE_BUILD_S:-240}" setup.log; build_rc=$?; else build_rc=1; fi
n=$(gpu_count)
if [ "$n" = 0 ]; then
  rows+=("| gpu | none found: GPU steps not run | 0 |")
else
  rows+=("| gpu | $n found | 0 |")
fi
# HORA_DEVICE_STEPS: the GPU steps to run (default all four), e.g. "bench mnist" to re-measure.
want() { case " ${HORA_DEVICE_STEPS:-ctest bench mnist python} " in *" $1 "*) return 0 ;; esac; return 1; }
if [ "$n" != 0 ] && [ $build_rc = 0 ]; then
  want ctest && step ctest 150 ctest-gpu.log
  want bench && step bench 210 bench-allreduce.log
  want mnist && step mnist 150 mnist-bench.log
  want python && step python 180 python.log
fi
# The CPU benchmark runs with or without a GPU, only when asked for.
case " ${HORA_DEVICE_STEPS:-} " in *" ddp "*) [ $build_rc = 0 ] && step ddp 240 ddp-bench.log ;; esac
# A measurement of one's own, in the same prepared environment (Open MPI, the build), only when
# asked for: HORA_DEVICE_STEPS=script HORA_DEVICE_SCRIPT=FILE (ROOT, BUILD, DEPS, OUT exported).
case " ${HORA_DEVICE_STEPS:-} " in *" script "*) [ $build_rc = 0 ] && step script 300 script.log ;; esac

{
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
  for f in bench-allreduce.log mnist-bench.log ddp-bench.log script.log; do
    [ -s "$OUT/$f" ] || continue
    echo
    echo "## $f"
    echo '```'
    grep -vE '^(== |   [a-z]+: )' "$OUT/$f" | tail -n 80
    echo '```'
  done
  if [ -s "$OUT/python.log" ]; then
    echo
    echo "## python"
    echo '```'
    sed 's/\x1b\[[0-9;]*m//g' "$OUT/python.log" |
      grep -E '^--- |[0-9]+ (passed|failed)|^(PASS|FAIL)|final accuracy|img/sec on' | tail -n 30
    echo '```'
  fi
  if [ -s "$OUT/ctest-gpu.log" ]; then
    echo
    echo "## ctest -L gpu"
    echo '```'
    grep -E 'tests passed|tests failed|\*\*\*|Failed|Passed|Not Run' "$OUT/ctest-gpu.log" | tail -n 40
    echo '```'
  fi
} >>"$SUMMARY"
cat "$SUMMARY"
if [ $failed = 1 ]; then exit 1; fi
if [ "$n" = 0 ]; then echo "device-check: no GPU on this machine: dependency and build steps passed; exit 77"; exit 77; fi
exit 0
