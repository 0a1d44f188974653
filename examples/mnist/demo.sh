#!/bin/bash
# The first thing to run: on a fresh Debian 12 machine (as root, or with sudo) this installs what
# is missing, builds hora, converts Fashion-MNIST (Debian's dataset-fashion-mnist) into record
# shards and trains the MNIST convnet on 4 local ranks with `launch -np 4`. It prints progress
# and ends with the line `test_accuracy=... images_per_s=... ranks=4`.
# About 10 minutes on a 2-core machine (most of it training: 10 epochs of 60,000 images).
#   bash examples/mnist/demo.sh            # from anywhere; the repository is found from this file
# Variables: EPOCHS (10), BATCH (64 per rank), NP (4), BUILD_DIR (build), WORK (build/mnist-demo),
# HORA_SKIP_INSTALL=1 (skip the apt step).
set -euo pipefail
cd "$(dirname "$0")/../.."
EPOCHS=${EPOCHS:-10}
BATCH=${BATCH:-64}
NP=${NP:-4}
BUILD_DIR=${BUILD_DIR:-build}
WORK=${WORK:-$BUILD_DIR/mnist-demo}
FASHION=/usr/share/datasets/fashion-mnist
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== 1/4 dependencies (tests/install-deps.sh)"
bash tests/install-deps.sh

echo "== 2/4 build ($BUILD_DIR)"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target mnist launch hora-records

echo "== 3/4 data: Fashion-MNIST ($FASHION) -> record shards in $WORK/fashion"
if [ ! -e "$WORK/fashion/test-00001-of-00002.tfrecord" ]; then
  mkdir -p "$WORK/fashion"
  "$BUILD_DIR/bin/hora-records" convert-idx "$FASHION" --split train --shards 8 --out "$WORK/fashion"
  "$BUILD_DIR/bin/hora-records" convert-idx "$FASHION" --split test --shards 2 --out "$WORK/fashion"
fi

echo "== 4/4 train: $NP ranks, $EPOCHS epochs, batch $BATCH per rank"
rm -rf "$WORK/ckpt"
"$BUILD_DIR/bin/launch" -np "$NP" "$BUILD_DIR/bin/mnist" --data "$WORK/fashion" \
  --epochs "$EPOCHS" --batch-size "$BATCH" --optimizer adam --seed 42 \
  --ckpt-dir "$WORK/ckpt" --ckpt-every 500 --tensorboard "$WORK/tensorboard" --log-every 100 \
  | tee "$WORK/train.log"
echo "TensorBoard: tensorboard --logdir $WORK/tensorboard"
tail -1 "$WORK/train.log" | sed 's/^\[0\] //'
