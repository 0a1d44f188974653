#!/bin/bash
# examples/python/mnist_torch.py on 2 ranks with 10k real images (8000 train / 2000 test): the
# MNIST digits beside the source tree (../shared/data/mnist-digits-10k) or, where they are absent,
# the first 10k images of Debian's Fashion-MNIST (tests/common/real_data.sh); exit 77 when torch
# is not importable. One epoch reaches a test accuracy of at least 0.88 on the digits (measured
# 0.92), 0.70 on Fashion-MNIST (measured 0.7575; 0.7950 after epoch 2); then a second run with the same checkpoint folder resumes
# after epoch 1 and trains epoch 2 only.
#   run_mnist_example.sh PYTHON MPIEXEC [MPIEXEC_FLAGS...]
. "$(dirname "$0")/mnist_data.sh"
min_acc=0.88
[ "$dataset" = fashion ] && min_acc=0.70
echo "data: $dataset ($data), test accuracy wanted >= $min_acc"
fail() { echo "FAIL: $*"; exit 1; }
run() { # log epochs
  "${mpi[@]}" -np 2 "$py" "$src/examples/python/mnist_torch.py" --data "$data" --threads 1 \
    --epochs "$2" --ckpt-dir "$work/ck" > "$1" 2>&1
}
run "$work/one" 1 || { cat "$work/one"; fail "first run failed"; }
cat "$work/one"
acc=$(sed -n 's/^.*epoch 1\/1: .*test accuracy \([0-9.]*\) .*$/\1/p' "$work/one")
[ -n "$acc" ] || fail "no epoch line"
awk -v a="$acc" -v m="$min_acc" 'BEGIN{exit !(a >= m)}' || fail "test accuracy $acc < $min_acc on $dataset"
[ -d "$work/ck/step-1" ] || fail "no checkpoint step-1 in $work/ck"
run "$work/two" 2 || { cat "$work/two"; fail "resumed run failed"; }
cat "$work/two"
grep -q "resumed after epoch 1" "$work/two" || fail "the second run did not resume"
grep -q "epoch 1/2" "$work/two" && fail "the resumed run trained epoch 1 again"
acc2=$(sed -n 's/^.*epoch 2\/2: .*test accuracy \([0-9.]*\) .*$/\1/p' "$work/two")
awk -v a="$acc2" -v b="$acc" 'BEGIN{exit !(a >= b - 0.01)}' || fail "epoch 2 accuracy $acc2 fell below epoch 1's $acc"
echo "PASS: accuracy $acc after epoch 1, $acc2 after the resumed epoch 2"
