#!/bin/bash
# The async engine's device fusion on a GPU: ResNet-50 training steps through hora.torch's
# DistributedOptimizer (python/bench/bench_gpu_fusion.py) with the default fusion against
# HORA_FUSION_THRESHOLD=0 (every device tensor its own collective and wait, the engine before
# device fusion), alternating in the same run: 1 rank (NCCL) and 2 ranks sharing the GPU (the
# MPI-staged path). Run by the device check's `script` step (about 2 minutes on an H100):
#
#   HORA_DEVICE_STEPS=script HORA_DEVICE_SCRIPT=tests/gpu/fusion-probe.sh bash tests/gpu/device-check.sh
#
# Environment: ROOT, BUILD (set by the device check), HORA_PROBE_REPEAT (alternations, default 2),
# HORA_PROBE_NP (rank counts, default "1 2").
set -uo pipefail
cd "${ROOT:?}"
export PYTHONPATH=$ROOT/${BUILD:?}/python${PYTHONPATH:+:$PYTHONPATH} HORA_LOG=WARN PMIX_MCA_pcompress_base_silence_warning=1
echo "| setting | ranks | step ms | optimizer.step() wait ms | images/s |"
echo "|---|---:|---:|---:|---:|"
for np in ${HORA_PROBE_NP:-1 2}; do
  for rep in $(seq "${HORA_PROBE_REPEAT:-2}"); do
    for thr in 0 default; do
      if [ "$thr" = default ]; then unset HORA_FUSION_THRESHOLD; else export HORA_FUSION_THRESHOLD=$thr; fi
      mpirun -np "$np" --oversubscribe -x PYTHONPATH -x HORA_LOG -x PMIX_MCA_pcompress_base_silence_warning \
        ${HORA_FUSION_THRESHOLD:+-x HORA_FUSION_THRESHOLD} python3 python/bench/bench_gpu_fusion.py --shared-gpu 2>&1 |
        grep -E '^\||Error|error' | grep -v 'pmix'
    done
  done
done
unset HORA_FUSION_THRESHOLD
