#!/bin/bash
# The shared-memory allreduce's helper threads (HORA_SHM_THREADS, algo/pool.c) on a machine with
# several cores per rank, as launch gives them (docs/launch.md: a node's cores split among its
# ranks): each rank bound to nproc/N cores (at most 8), once with one thread per rank
# (HORA_SHM_THREADS=1) and once with one per core of the rank (HORA_SHM_THREADS=0, the default),
# in the same run:
#   1. hora-bench allreduce, hora's shared-memory allreduce against MPI_Allreduce, 32-128 MiB;
#   2. bench_ddp.py --alone: ResNet-50's gradients averaged by DistributedOptimizer and by the
#      grouped allreduce against DDP's buckets over gloo (docs/benchmarks.md, "ResNet-50
#      gradients"), the goal's measure;
#   3. training steps on the largest rank count: what the helpers cost backward's compute.
# Run by the device check's `script` step (about 4 minutes on 16 cores):
#
#   HORA_DEVICE_STEPS=script HORA_DEVICE_SCRIPT=tests/gpu/threads-probe.sh bash tests/gpu/device-check.sh
#
# or on any machine with a build: ROOT=. BUILD=build bash tests/gpu/threads-probe.sh
# Environment: ROOT, BUILD (set by the device check), HORA_PROBE_NP (rank counts, default "2 4"),
# HORA_PROBE_PARTS (which of "bench alone steps" to run, default all), HORA_PROBE_STEPS_NP (rank
# counts of the training steps, default the largest of HORA_PROBE_NP), HORA_PROBE_REPEAT (repeats
# of the training steps, default 3), HORA_PROBE_CHUNKS (HORA_SHM_CHUNK_BYTES values for the averaging
# alone with the default threads, default "0", the automatic chunk; e.g. "0 1M 2M").
set -uo pipefail
cd "${ROOT:?}"
export PYTHONPATH=$ROOT/${BUILD:?}/python${PYTHONPATH:+:$PYTHONPATH} HORA_LOG=WARN PMIX_MCA_pcompress_base_silence_warning=1
NPS=${HORA_PROBE_NP:-2 4}
PARTS=" ${HORA_PROBE_PARTS:-bench alone steps} "
CPUS=$(nproc)
# run NP THREADS ARGS...: NP ranks, each bound to its share of the cores, HORA_SHM_THREADS=THREADS
run() {
  local np=$1 t=$2 pe=$((CPUS / $1))
  shift 2
  [ "$pe" -gt 8 ] && pe=8
  [ "$pe" -lt 1 ] && pe=1
  HORA_SHM_THREADS=$t HORA_SHM_CHUNK_BYTES=${CHUNK:-0} mpirun -np "$np" --map-by "slot:PE=$pe" --bind-to core \
    -x PYTHONPATH -x HORA_LOG -x HORA_SHM_THREADS -x HORA_SHM_CHUNK_BYTES -x PMIX_MCA_pcompress_base_silence_warning "$@" 2>&1 |
    grep -v -E 'pmix_mca|dlopen error|Perhaps a missing'
}
echo "## machine"
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L1d|L2|L3'
[[ $PARTS == *" bench "* ]] && echo "## hora's shared-memory allreduce against MPI_Allreduce (HORA_SHM_THREADS: 1, then 0 = one per core)"
[[ $PARTS == *" bench "* ]] && for np in $NPS; do
  for t in 1 0; do
    echo "ranks $np, $((CPUS / np > 8 ? 8 : CPUS / np)) cores each, HORA_SHM_THREADS=$t"
    run "$np" "$t" "$BUILD/bin/hora-bench" allreduce --algo shm,mpi --min-bytes 32M --max-bytes 128M --repeat 3
  done
done
[[ $PARTS == *" alone "* ]] && echo "## the averaging alone (bench_ddp.py --alone 10 --block 5)"
[[ $PARTS == *" alone "* ]] && for np in $NPS; do
  for tc in 1:0 $(for c in ${HORA_PROBE_CHUNKS:-0}; do echo "0:$c"; done); do
    t=${tc%%:*} CHUNK=${tc#*:}
    echo "ranks $np HORA_SHM_THREADS=$t HORA_SHM_CHUNK_BYTES=$CHUNK"
    CHUNK=$CHUNK run "$np" "$t" python3 python/bench/bench_ddp.py --modes "" --alone 10 --block 5 | grep -E '^\| (hora|gloo)'
  done
done
CHUNK=0
[[ $PARTS == *" steps "* ]] || exit 0
REPEAT=${HORA_PROBE_REPEAT:-3}
for np in ${HORA_PROBE_STEPS_NP:-${NPS##* }}; do
  echo "## training steps, $np ranks (--steps 2 --repeat $REPEAT)"
  for t in 1 0; do
    echo "ranks $np HORA_SHM_THREADS=$t"
    run "$np" "$t" python3 python/bench/bench_ddp.py --model resnet50 --image-size 32 --batch-size 2 --steps 2 \
      --repeat "$REPEAT" --warmup 1 --modes local,hora_opt,hora_opt_alone,ddp,ddp_nosync,ddp_timed | grep -E '^\|'
  done
done
