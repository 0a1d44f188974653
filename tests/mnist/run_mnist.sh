#!/bin/bash
# CI checks of examples/mnist on 2 ranks with 10k real images (8000 train / 2000 test): the MNIST
# digits beside the source tree (../shared/data/mnist-digits-10k) or, where they are absent, the
# first 10k images of Debian's Fashion-MNIST (tests/common/real_data.sh).
# train, resume and signal check the CPU path (--device cpu, also on a GPU machine: there --device
# auto would train on the GPU, and its GPU monitor adds scalars to the TensorBoard file that the
# train mode counts); nogpu and cuda check the device choice and the GPU path.
#   run_mnist.sh train  MNIST MPIEXEC [MPIEXEC_FLAGS...]
#       one epoch: the loss of the last progress line is below half that of the first, and the
#       test accuracy is at least 0.88 on the digits (measured 0.926 with these settings), 0.72 on
#       Fashion-MNIST (measured 0.7635; loss 2.63 -> 0.63).
#   run_mnist.sh resume MNIST MPIEXEC [MPIEXEC_FLAGS...]
#       90 steps uninterrupted vs 40 steps + --resume to 90: the final weights are bitwise equal
#       (36 and 16 with HORA_TEST_SHORT=1).
#   run_mnist.sh signal MNIST MPIEXEC [MPIEXEC_FLAGS...]
#       SIGUSR1 midway: exit status 3 after a checkpoint; --resume finishes with the same weights
#       as the uninterrupted run.
#   run_mnist.sh nogpu  MNIST MPIEXEC [MPIEXEC_FLAGS...]
#       on a machine without a GPU (exit 77 where nvidia-smi lists one): --device cuda fails with
#       status 1 and a message naming --device cuda, and --device auto trains on the CPU.
#   run_mnist.sh cuda   MNIST MPIEXEC [MPIEXEC_FLAGS...]
#       on a GPU machine (exit 77 without one, or when the build has no CUDA layer kernels): one
#       epoch with --device cuda (loss falls, test accuracy >= 0.88 / 0.72), then 90 steps uninterrupted
#       vs 40 + --resume on the GPU: the final weights are bitwise equal.
set -u
mode=$1 mnist=$2
# Steps of the resume and signal checks: 90, the first run stopping at 40 (checkpoints every 15)
# and the signal at step 20; sanitizer builds (HORA_TEST_SHORT=1, tests/mnist/CMakeLists.txt) run
# 36, 16 (every 8) and 8, the same checks at two fifths of the instrumented CPU time.
steps=90 half=40 every=15 sig_at=20
[ "${HORA_TEST_SHORT:-0}" = 1 ] && steps=36 half=16 every=8 sig_at=8
shift 2
mpi=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-mnist-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$(cd "$(dirname "$0")/../.." && pwd)
found=$(HORA_SOURCE_DIR=${HORA_SOURCE_DIR:-$src} bash "$src/tests/common/real_data.sh" "$work") || exit $?
data=${found% *} dataset=${found##* }
min_acc=0.88
[ "$dataset" = fashion ] && min_acc=0.72
echo "data: $dataset ($data), test accuracy wanted >= $min_acc"
fail() { echo "FAIL: $*"; exit 1; }
run() { # np log args...
  local np=$1 log=$2
  shift 2
  "${mpi[@]}" -np "$np" "$mnist" --data "$data" --cache-dir "$work/cache" --batch-size 64 \
    --threads 1 "$@" > "$log" 2>&1
}

# A one-epoch run learned: the loss halved from the first progress line to the last, and the final
# line reports a test accuracy of at least $min_acc (sets first, last and acc for the PASS line).
check_learned() {
  first=$(grep -m1 -o 'loss [0-9.]*' "$1" | awk '{print $2}')
  last=$(grep -o ' loss [0-9.]*' "$1" | tail -1 | awk '{print $2}')
  acc=$(sed -n 's/^.*test_accuracy=\([0-9.]*\) images_per_s=\([0-9]*\) ranks=2$/\1/p' "$1")
  [ -n "$first" ] && [ -n "$last" ] && [ -n "$acc" ] || fail "missing progress or final line"
  awk -v a="$first" -v b="$last" 'BEGIN{exit !(b < 0.5 * a)}' || fail "loss did not fall: $first -> $last"
  awk -v a="$acc" -v m="$min_acc" 'BEGIN{exit !(a >= m)}' || fail "test accuracy $acc < $min_acc on $dataset"
}

case "$mode" in
train)
  run 2 "$work/out" --device cpu --epochs 1 --log-every 10 --ckpt-dir "$work/ck" --tensorboard "$work/tb" || { cat "$work/out"; fail "run failed"; }
  cat "$work/out"
  check_learned "$work/out"
  tail -1 "$work/out" | grep -q '^\(\[0\] \)\?test_accuracy=' || fail "last line is not the result line"
  # TensorBoard: the file_version event, 4 scalars per progress line, 2 per epoch, all CRC-valid
  lines=$(grep -c ' images/s ' "$work/out")
  ev=$(ls "$work"/tb/events.out.tfevents.* 2>/dev/null | head -1)
  [ -n "$ev" ] || fail "no TensorBoard event file"
  "$(dirname "$mnist")/hora-records" verify "$ev" >/dev/null || fail "event file fails its CRCs"
  n=$("$(dirname "$mnist")/hora-records" count "$ev" | awk '{print $NF}' | tail -1)
  [ "$n" = $((1 + 4 * lines + 2)) ] || fail "event file has $n records, want $((1 + 4 * lines + 2))"
  echo "PASS: loss $first -> $last, test accuracy $acc, $n TensorBoard events"
  ;;
resume)
  run 2 "$work/a" --device cpu --epochs 2 --max-steps $steps --ckpt-dir "$work/cka" --save-weights "$work/wa" || { cat "$work/a"; fail "full run"; }
  run 2 "$work/b1" --device cpu --epochs 2 --max-steps $half --ckpt-every $every --ckpt-dir "$work/ckb" || { cat "$work/b1"; fail "first half"; }
  run 2 "$work/b2" --device cpu --epochs 2 --max-steps $steps --resume --ckpt-dir "$work/ckb" --save-weights "$work/wb" || { cat "$work/b2"; fail "resumed run"; }
  cat "$work/b2"
  grep -q "resume: step $half " "$work/b2" || fail "the resumed run did not start at step $half"
  cmp "$work/wa" "$work/wb" || fail "resumed weights differ from the uninterrupted run"
  [ "$(stat -c %s "$work/wa")" -gt 100000 ] || fail "weights file too small"
  echo "PASS: resumed run bitwise equal to the uninterrupted run"
  ;;
signal)
  run 2 "$work/a" --device cpu --epochs 2 --max-steps $steps --ckpt-dir "$work/cka" --save-weights "$work/wa" || { cat "$work/a"; fail "full run"; }
  "${mpi[@]}" -np 2 "$mnist" --data "$data" --cache-dir "$work/cache" --batch-size 64 --threads 1 \
    --device cpu --epochs 2 --max-steps $steps --log-every $((sig_at / 4)) --ckpt-dir "$work/ckb" > "$work/b1" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q "step $sig_at/" "$work/b1" && break; sleep 0.05; done
  kill -USR1 $pid
  wait $pid
  rc=$?
  cat "$work/b1"
  [ $rc = 3 ] || fail "exit status $rc after SIGUSR1, want 3"
  grep -q 'stop signal: checkpoint of step' "$work/b1" || fail "no checkpoint message"
  run 2 "$work/b2" --device cpu --epochs 2 --max-steps $steps --resume --ckpt-dir "$work/ckb" --save-weights "$work/wb" || { cat "$work/b2"; fail "resumed run"; }
  cat "$work/b2"
  cmp "$work/wa" "$work/wb" || fail "weights after signal + resume differ from the uninterrupted run"
  echo "PASS: stopped by SIGUSR1 with status 3, resumed to the same weights"
  ;;
nogpu)
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then echo "SKIP: this machine has a GPU"; exit 77; fi
  run 1 "$work/c" --epochs 1 --max-steps 2 --device cuda --ckpt-dir "$work/ckc"
  rc=$?
  cat "$work/c"
  [ $rc = 1 ] || fail "--device cuda without a GPU: exit status $rc, want 1"
  grep -q 'mnist: rank 0: --device cuda: .*use --device cpu' "$work/c" || fail "no clear --device cuda message"
  run 2 "$work/a" --epochs 1 --max-steps 30 --log-every 10 --device auto --ckpt-dir "$work/cka" || { cat "$work/a"; fail "--device auto run"; }
  cat "$work/a"
  grep -q ', device cpu, ' "$work/a" || fail "--device auto did not pick the CPU"
  grep -q '^\(\[0\] \)\?test_accuracy=' "$work/a" || fail "--device auto: no result line"
  echo "PASS: --device cuda refused without a GPU, --device auto trained on the CPU"
  ;;
cuda)
  nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "SKIP: no GPU"; exit 77; }
  "$mnist" --help | grep -q 'cuda runs every layer' || { echo "SKIP: built without the CUDA layer kernels"; exit 77; }
  run 2 "$work/out" --epochs 1 --log-every 10 --device cuda --ckpt-dir "$work/ck0" || { cat "$work/out"; fail "cuda run failed"; }
  cat "$work/out"
  grep -q ', device cuda, ' "$work/out" || fail "not on the GPU"
  check_learned "$work/out"
  run 2 "$work/a" --device cuda --epochs 2 --max-steps 90 --ckpt-dir "$work/cka" --save-weights "$work/wa" || { cat "$work/a"; fail "full run"; }
  run 2 "$work/b1" --device cuda --epochs 2 --max-steps 40 --ckpt-every 15 --ckpt-dir "$work/ckb" || { cat "$work/b1"; fail "first half"; }
  run 2 "$work/b2" --device cuda --epochs 2 --max-steps 90 --resume --ckpt-dir "$work/ckb" --save-weights "$work/wb" || { cat "$work/b2"; fail "resumed run"; }
  grep -q 'resume: step 40 ' "$work/b2" || fail "the resumed run did not start at step 40"
  cmp "$work/wa" "$work/wb" || fail "resumed GPU weights differ from the uninterrupted GPU run"
  echo "PASS: GPU run: loss $first -> $last, test accuracy $acc; resume bitwise equal"
  ;;
*) echo "usage: run_mnist.sh train|resume|signal|nogpu|cuda MNIST MPIEXEC..."; exit 2 ;;
esac
