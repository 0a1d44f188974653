#!/bin/bash
# The ready event of async CUDA submissions on a GPU: ResNet-50 training steps through
# hora.torch's DistributedOptimizer (python/bench/bench_gpu_fusion.py) passing a ready event to
# the engine (the default) against synchronizing torch's stream at every gradient's submission
# (`--ready sync`, hora.torch before), alternating in the same run, with torch's optimizer alone
# (`--plain`, no averaging: the single-GPU step) first and last at 1 rank. 1 rank (NCCL) and 2
# ranks sharing the GPU (the MPI-staged path). Run by the device check's `script` step (about
# 2 minutes on an H200):
#
#   HORA_DEVICE_STEPS=script HORA_DEVICE_SCRIPT=tests/gpu/ready-probe.sh bash tests/gpu/device-check.sh
#
# Environment: ROOT, BUILD (set by the device check), HORA_PROBE_REPEAT (alternations, default 2),
# HORA_PROBE_NP (rank counts, default "1 2"), HORA_PROBE_STEPS (timed steps, default 30).
set -uo pipefail
cd "${ROOT:?}"
export PYTHONPATH=$ROOT/${BUILD:?}/python${PYTHONPATH:+:$PYTHONPATH} HORA_LOG=WARN PMIX_MCA_pcompress_base_silence_warning=1
run() { # NP ARGS...
  local np=$1
  shift
  mpirun -np "$np" --oversubscribe -x PYTHONPATH -x HORA_LOG -x PMIX_MCA_pcompress_base_silence_warning \
    python3 python/bench/bench_gpu_fusion.py --shared-gpu --steps "${HORA_PROBE_STEPS:-30}" --warmup 10 "$@" 2>&1 |
    grep -E '^\||Error|error' | grep -v 'pmix'
}
echo "| setting | ranks | step ms | optimizer.step() wait ms | images/s |"
echo "|---|---:|---:|---:|---:|"
for np in ${HORA_PROBE_NP:-1 2}; do
  [ "$np" = 1 ] && run 1 --plain
  for rep in $(seq "${HORA_PROBE_REPEAT:-2}"); do
    run "$np" --ready sync
    run "$np" --ready event
  done
  [ "$np" = 1 ] && run 1 --plain
done
exit 0
