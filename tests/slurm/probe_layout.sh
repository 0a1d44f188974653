#!/bin/sh
# Prints what launch gave this rank, as one line of key=value pairs (read by test_launch_slurm.py).
# With PROBE_FAIL_RANK=r, rank r exits 7 after a second and the others sleep (failure tests).
# With PROBE_REQUEUE=DIR, rank r stops for a requeue as hora programs do (exit 3) after r * 0.4 s,
# leaving DIR/done-r just before: a rank that is killed early leaves no file.
if [ -n "$PROBE_REQUEUE" ]; then
  sleep "$(echo "$HORA_RANK" | awk '{print $1 * 0.4}')"
  touch "$PROBE_REQUEUE/done-$HORA_RANK"
  exit 3
fi
if [ -n "$PROBE_FAIL_RANK" ]; then
  if [ "$HORA_RANK" = "$PROBE_FAIL_RANK" ]; then sleep 1; exit 7; fi
  sleep 60
  exit 0
fi
cpus=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
echo "PROBE rank=$HORA_RANK size=$HORA_SIZE local_rank=$HORA_LOCAL_RANK local_size=$HORA_LOCAL_SIZE" \
  "cross_rank=$HORA_CROSS_RANK cross_size=$HORA_CROSS_SIZE device=$HORA_DEVICE" \
  "cvd=${CUDA_VISIBLE_DEVICES-unset} order=${CUDA_DEVICE_ORDER-unset} node=$SLURMD_NODENAME" \
  "procid=$SLURM_PROCID cpus=$cpus"
