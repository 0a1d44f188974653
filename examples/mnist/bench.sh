#!/bin/bash
# Training throughput of examples/mnist on 1, 2 and 4 local ranks against the same model, batch
# size and optimizer in PyTorch on the CPU (examples/mnist/bench_torch.py: DistributedDataParallel
# over gloo with the same rank count and threads per rank), measured in the same run, alternating,
# REPS times each; prints the medians and the ratio hora / PyTorch as a markdown table.
#   bash examples/mnist/bench.sh [IDX_DIR]     (default: /usr/share/datasets/fashion-mnist)
#   DEVICE=cuda bash examples/mnist/bench.sh   one GPU: mnist --device cuda against PyTorch on
#                                              the same GPU (bench_torch.py --device cuda)
# Variables: DEVICE (cpu|cuda; default cpu), PYTHON (python3 with torch and numpy), REPS (3),
# STEPS (150), BATCH (64), RANKS ("1 2 4"; with DEVICE=cuda "1": one GPU), BUILD_DIR (build), THREADS (threads per rank for both; default: mnist uses
# the cores launch binds the rank to, PyTorch cores / ranks).
set -euo pipefail
cd "$(dirname "$0")/../.."
IDX=${1:-/usr/share/datasets/fashion-mnist}
PYTHON=${PYTHON:-python3}
REPS=${REPS:-3}
STEPS=${STEPS:-150}
BATCH=${BATCH:-64}
DEVICE=${DEVICE:-cpu}
case "$DEVICE" in cpu) RANKS=${RANKS:-1 2 4} ;; cuda) RANKS=${RANKS:-1} ;;
  *) echo "bench.sh: DEVICE must be cpu or cuda, not '$DEVICE'"; exit 2 ;; esac
BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-}
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-mnist-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$BUILD_DIR/bin/hora-records" convert-idx "$IDX" --split train --shards 8 --out "$work/data" >/dev/null
"$BUILD_DIR/bin/hora-records" convert-idx "$IDX" --split test --shards 2 --out "$work/data" >/dev/null
"$PYTHON" -c 'import torch, numpy' || { echo "bench.sh: $PYTHON has no torch/numpy"; exit 1; }

median() { sort -n | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
if [ "$DEVICE" = cuda ]; then
  "$PYTHON" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' ||
    { echo "bench.sh: DEVICE=cuda: $PYTHON's torch sees no GPU"; exit 1; }
fi
echo "| device | ranks | hora mnist images/s | PyTorch images/s | hora / PyTorch | runs (hora; PyTorch) |"
echo "|---|---|---|---|---|---|"
for np in $RANKS; do
  h=() t=() hx=(--device "$DEVICE") tx=(--device "$DEVICE")
  if [ -n "$THREADS" ]; then hx+=(--threads "$THREADS"); tx+=(--cores $((THREADS * np))); fi
  for _ in $(seq "$REPS"); do
    line=$("$BUILD_DIR/bin/launch" -np "$np" "$BUILD_DIR/bin/mnist" --data "$work/data" --epochs 1 \
      --max-steps "$STEPS" --batch-size "$BATCH" --log-every 1000000 --ckpt-dir "$work/ck" \
      "${hx[@]}" | sed -n 's/.*test_accuracy=.* images_per_s=\([0-9]*\) ranks=.*/\1/p')
    h+=("$line")
    line=$("$PYTHON" examples/mnist/bench_torch.py --data "$IDX" --ranks "$np" --batch-size "$BATCH" \
      --steps "$STEPS" "${tx[@]}" | sed -n 's/^torch_images_per_s=\([0-9]*\) .*/\1/p')
    t+=("$line")
  done
  hm=$(printf '%s\n' "${h[@]}" | median)
  tm=$(printf '%s\n' "${t[@]}" | median)
  ratio=$(awk -v a="$hm" -v b="$tm" 'BEGIN{printf "%.2fx", a/b}')
  echo "| $DEVICE | $np | $hm | $tm | $ratio | ${h[*]}; ${t[*]} |"
done
