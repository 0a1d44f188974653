#!/bin/bash
# examples/pytorch/pytorch_mnist.py (Horovod's MNIST example, only its import changed) on real
# digits: 3 epochs on 2 ranks (HORA_MNIST_NP) with the 10k MNIST digits of tests/common/real_data.sh
# (or Fashion-MNIST where they are absent), then its final test accuracy is checked: >= 0.90 on
# the digits (measured 0.943), >= 0.65 on Fashion-MNIST (measured 0.7415). The example trains on
# the GPU of its local rank where torch sees one (the device check runs it so, at 1 rank: it pins
# torch.cuda.set_device(local_rank), which needs a GPU per rank), else on the CPU. Exit 77 when
# torch is not importable.
#   horovod_mnist_check.sh PYTHON MPIEXEC [MPIEXEC_FLAGS...]
. "$(dirname "$0")/mnist_data.sh"
min_acc=0.90
[ "$dataset" = fashion ] && min_acc=0.65
np=${HORA_MNIST_NP:-2}
echo "data: $dataset ($data), $np ranks, test accuracy wanted >= $min_acc"
"${mpi[@]}" -np "$np" "$py" "$src/examples/pytorch/pytorch_mnist.py" --data-dir "$data" \
  --epochs 3 --lr 0.05 > "$work/log" 2>&1
rc=$?
cat "$work/log"
[ $rc = 0 ] || { echo "FAIL: the example exited with $rc"; exit 1; }
acc=$(sed -n 's/^final accuracy \([0-9.]*\)$/\1/p' "$work/log")
[ -n "$acc" ] || { echo "FAIL: no 'final accuracy' line"; exit 1; }
awk -v a="$acc" -v m="$min_acc" 'BEGIN { exit !(a >= m) }' || { echo "FAIL: accuracy $acc < $min_acc"; exit 1; }
echo "PASS: accuracy $acc >= $min_acc"
