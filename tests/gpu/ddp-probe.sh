#!/bin/bash
# What bounds hora's averaging of ResNet-50's gradients on a machine (docs/benchmarks.md, "On a
# 16-core Xeon"): the copy rate of its cores, hora's shared-memory allreduce against
# MPI_Allreduce, and bench_ddp.py's averaging alone at three shared-memory chunk sizes; every
# rank bound to a core of its own. Run by the device check's `script` step:
#
#   HORA_DEVICE_STEPS=script HORA_DEVICE_SCRIPT=tests/gpu/ddp-probe.sh bash tests/gpu/device-check.sh
#
# (about 2 minutes on 16 cores), or on any machine with a build: ROOT=. BUILD=build bash tests/gpu/ddp-probe.sh
# Environment: ROOT, BUILD (set by the device check), HORA_PROBE_NP (rank counts, default "2 4").
set -uo pipefail
cd "${ROOT:?}"
export PYTHONPATH=$ROOT/${BUILD:?}/python${PYTHONPATH:+:$PYTHONPATH} HORA_LOG=WARN PMIX_MCA_pcompress_base_silence_warning=1
NPS=${HORA_PROBE_NP:-2 4}
run() {
  local np=$1; shift
  mpirun -np "$np" --bind-to core --map-by core -x PYTHONPATH -x HORA_LOG \
    -x PMIX_MCA_pcompress_base_silence_warning "$@" 2>&1 | grep -v -E 'pmix_mca|dlopen error|Perhaps a missing'
}
echo "## machine"
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L1d|L2|L3'
echo "## copy rate of a core (all ranks at once)"
for np in 1 $NPS; do run "$np" python3 python/bench/copy_rate.py; done
echo "## hora's shared-memory allreduce against MPI_Allreduce"
for np in $NPS; do run "$np" "$BUILD/bin/hora-bench" allreduce --algo shm,mpi --min-bytes 32M --max-bytes 128M --repeat 3; done
echo "## the averaging alone (bench_ddp.py --alone 10 --block 5) by HORA_SHM_CHUNK_BYTES"
for np in $NPS; do
  for c in 256K 4M 1M; do
    echo "ranks $np HORA_SHM_CHUNK_BYTES=$c"
    HORA_SHM_CHUNK_BYTES=$c run "$np" -x HORA_SHM_CHUNK_BYTES python3 python/bench/bench_ddp.py \
      --modes "" --alone 10 --block 5 | grep -E '^\| (hora|gloo)'
  done
done
