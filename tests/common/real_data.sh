#!/bin/bash
# Real image data for the tests, in MNIST's IDX format, written to or found for OUT_DIR:
#   real_data.sh OUT_DIR   -> prints "DIR NAME" where DIR holds train-*/t10k-* IDX files:
#   1. the 10k real MNIST digits beside the source tree (../shared/data/mnist-digits-10k,
#      8000 train / 2000 test), or in HORA_MNIST_DIGITS (the GPU device check's carried copy):
#      NAME=digits;
#   2. else the same shape cut from Debian's Fashion-MNIST (dataset-fashion-mnist, installed by
#      tests/install-deps.sh): the first 8000 training and the first 2000 test images, written
#      to OUT_DIR/fashion-10k: NAME=fashion.
# Exits 77 when neither exists. The caller owns OUT_DIR (and removes it).
set -eu  # no pipefail: head ends gzip early by design
out=$1
digits="${HORA_MNIST_DIGITS:-${HORA_SOURCE_DIR:-.}/../shared/data/mnist-digits-10k}"
if [ -e "$digits/train-images-idx3-ubyte.gz" ] || [ -e "$digits/train-images-idx3-ubyte" ]; then
  echo "$digits digits"
  exit 0
fi
fm=/usr/share/datasets/fashion-mnist
[ -e "$fm/train-images-idx3-ubyte.gz" ] || { echo "no MNIST digits at $digits and no $fm" >&2; exit 77; }
dst=$out/fashion-10k
mkdir -p "$dst"
be32() { printf "\\x$(printf %02x $(($1 >> 24 & 255)))\\x$(printf %02x $(($1 >> 16 & 255)))\\x$(printf %02x $(($1 >> 8 & 255)))\\x$(printf %02x $(($1 & 255)))"; }
# cut SRC_PREFIX DST_PREFIX N: the first N images and labels, headers rewritten for N
cut() {
  { printf '\x00\x00\x08\x03'; be32 "$3"; be32 28; be32 28
    gzip -dc "$fm/$1-images-idx3-ubyte.gz" | tail -c +17 | head -c $(($3 * 784)); } >"$dst/$2-images-idx3-ubyte"
  { printf '\x00\x00\x08\x01'; be32 "$3"
    gzip -dc "$fm/$1-labels-idx1-ubyte.gz" | tail -c +9 | head -c "$3"; } >"$dst/$2-labels-idx1-ubyte"
}
cut train train 8000
cut t10k t10k 2000
echo "$dst fashion"
