#!/bin/bash
# Every command-line tool other than launch against a table of invocations: --help prints the
# usage on stdout and exits 0; an unknown option, a non-number where a number goes, an option
# missing its value and an out-of-range number print exactly one line on stderr and exit 2; a
# missing, empty or garbage input file gets one error line that names it. Absurd sizes must be
# refused at once (each call has a 60 s limit; a refused one takes milliseconds), and a refused
# convert-idx writes nothing.
# With MPIEXEC, `hora-bench ckpt` also runs on 2 ranks (rank 0 checkpoints, the others follow)
# and must print its result and leave no folder behind.
#   bad_invocations.sh BIN_DIR [MPIEXEC FLAGS...]   (BIN_DIR: hora-bench, hora-records, hora-info, mnist)
set -u
bin=$1
shift
mpi=("$@")
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-tools-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
export HORA_LOG=NONE
mkdir -p "$work/tmp"
export TMPDIR=$work/tmp # mnist's IDX cache and hora-bench's folders stay inside $work
fails=0 n=0

# check RC REGEX CMD...: exit status RC, REGEX found in the output; for RC 2 exactly one stderr line.
check() {
  local want=$1 re=$2
  shift 2
  n=$((n + 1))
  timeout 60 "$@" >"$work/out" 2>"$work/err" </dev/null
  local rc=$? lines
  lines=$(wc -l <"$work/err")
  if [ "$rc" != "$want" ]; then
    echo "FAIL: $* -> exit $rc, want $want"; sed 's/^/  | /' "$work/err" | head -5; fails=$((fails + 1)); return
  fi
  if ! cat "$work/out" "$work/err" | grep -Eq -- "$re"; then
    echo "FAIL: $* -> output lacks /$re/"; sed 's/^/  | /' "$work/err" "$work/out" | head -5
    fails=$((fails + 1)); return
  fi
  if [ "$want" = 2 ] && [ "$lines" != 1 ]; then
    echo "FAIL: $* -> $lines lines on stderr, want 1"; sed 's/^/  | /' "$work/err" | head -5
    fails=$((fails + 1)); return
  fi
  echo "ok: $* -> $rc: $(head -1 "$work/err" "$work/out" 2>/dev/null | grep -v '^==>' | grep . | head -1)"
}

# Inputs: an empty file, a garbage file, and IDX files of 10 images of 28x28.
: >"$work/empty.tfrecord"
head -c 1000 /dev/urandom >"$work/garbage.tfrecord"
mkdir -p "$work/idx" "$work/emptydir"
{ printf '\x00\x00\x08\x03\x00\x00\x00\x0a\x00\x00\x00\x1c\x00\x00\x00\x1c'; head -c 7840 /dev/zero; } \
  >"$work/idx/train-images-idx3-ubyte"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x0a'; head -c 10 /dev/zero; } >"$work/idx/train-labels-idx1-ubyte"
mkdir -p "$work/badidx"
head -c 5000 /dev/urandom >"$work/badidx/train-images-idx3-ubyte"
cp "$work/idx/train-labels-idx1-ubyte" "$work/badidx/"

B="$bin/hora-bench"
for sub in allreduce fusion ckpt records launch; do
  check 0 "usage" "$B" $sub --help
  check 2 "unknown option '--no-such-option'" "$B" $sub --no-such-option
done
check 0 "usage: hora-bench" "$B" --help
check 2 "unknown benchmark 'nope'" "$B" nope
check 2 "--iters 'abc' is not a whole number" "$B" allreduce --iters abc
check 2 "--iters needs a value" "$B" allreduce --iters
check 2 "--iters needs a value" "$B" allreduce --iters --warmup 3
check 2 "--iters -1 is out of range|--iters '-1' is not a whole number" "$B" allreduce --iters -1
check 2 "--repeat 0 is out of range" "$B" allreduce --repeat 0
check 2 "--max-bytes '12Q' is not a byte size" "$B" allreduce --max-bytes 12Q
check 2 "--max-bytes 100T is out of range" "$B" allreduce --max-bytes 100T
check 2 "--dtype 'f128' is not one of" "$B" allreduce --dtype f128
check 2 "--device 'tpu' is not one of" "$B" allreduce --device tpu
check 2 "--steps 'x' is not a whole number" "$B" fusion --steps x
check 2 "--workload 'vgg' is not one of" "$B" fusion --workload vgg
check 2 "--tensors 100000000000 is out of range" "$B" ckpt --tensors 100000000000
check 2 "--state-mib 17592186044416 is out of range" "$B" ckpt --state-mib 17592186044416
check 2 "--state-mib 99999999999999999999999 is out of range" "$B" ckpt --state-mib 99999999999999999999999
check 2 "--reps '3x' is not a whole number" "$B" ckpt --reps 3x
check 2 "--dir needs a value" "$B" ckpt --dir
check 2 "--shards 100000000000 is out of range" "$B" records --shards 100000000000
check 2 "--shards 100 is more than --records 10" "$B" records --records 10 --shards 100
check 2 "is more than 64 GiB" "$B" records --records 100000000 --record-bytes 1000000
check 2 "--cache 'hot' is not one of" "$B" records --cache hot
check 2 "--reps 'many' is not a whole number" "$B" launch --reps many

R="$bin/hora-records"
check 0 "usage: hora-records" "$R" --help
for sub in convert-idx count verify cat; do
  check 0 "usage: hora-records" "$R" $sub --help
  check 2 "unknown option '--no-such-option'" "$R" $sub --no-such-option "$work/empty.tfrecord"
done
check 2 "unknown command 'nope'" "$R" nope
check 2 "--shards 'x' is not a whole number" "$R" convert-idx "$work/idx" --split train --shards x --out "$work/o"
check 2 "--shards 0 is out of range" "$R" convert-idx "$work/idx" --split train --shards 0 --out "$work/o"
check 2 "--shards needs a value" "$R" convert-idx "$work/idx" --split train --out "$work/o" --shards
check 2 "--split 'valid' is not one of" "$R" convert-idx "$work/idx" --split valid --shards 1 --out "$work/o"
check 2 "--shards 99999 is more than the 10 images in .*train-images-idx3-ubyte" \
  "$R" convert-idx "$work/idx" --split train --shards 99999 --out "$work/o"
[ -e "$work/o" ] && { echo "FAIL: a refused convert-idx created $work/o"; fails=$((fails + 1)); }
check 0 "10 train images of 28x28 in 2 shards" "$R" convert-idx "$work/idx" --split train --shards 2 --out "$work/o"
check 1 "$work/badidx/train-images-idx3-ubyte" "$R" convert-idx "$work/badidx" --split train --shards 1 --out "$work/o3"
check 1 "$work/emptydir/t10k-images" "$R" convert-idx "$work/emptydir" --split test --shards 1 --out "$work/o2"
check 1 "$work/missing.tfrecord" "$R" count "$work/missing.tfrecord"
check 1 "$work/garbage.tfrecord" "$R" verify "$work/garbage.tfrecord"
check 1 "$work/garbage.tfrecord" "$R" cat "$work/garbage.tfrecord"
check 0 "^0$" "$R" count "$work/empty.tfrecord"
check 2 "takes one FILE" "$R" cat "$work/empty.tfrecord" "$work/garbage.tfrecord"

I="$bin/hora-info"
check 0 "usage: hora-info" "$I" --help
check 0 "^hora [0-9]" "$I"
check 2 "unknown option '--nope'" "$I" --nope
check 2 "unknown command 'nope'" "$I" nope

M="$bin/mnist"
if [ -x "$M" ]; then
  check 0 "usage: mnist" "$M" --help
  check 2 "unknown option '--no-such-option'" "$M" --no-such-option
  check 2 "--epochs 'abc' is not a whole number" "$M" --data "$work/idx" --epochs abc
  check 2 "--epochs 0 is out of range" "$M" --data "$work/idx" --epochs 0
  check 2 "--lr 'fast' is not a number" "$M" --data "$work/idx" --lr fast
  check 2 "--data needs a value" "$M" --data --resume
  check 2 "--batch-size needs a value" "$M" --data "$work/idx" --batch-size
  check 2 "--optimizer 'rmsprop' is not one of" "$M" --data "$work/idx" --optimizer rmsprop
  check 2 "--data DIR is required" "$M" --epochs 1
  check 1 "$work/emptydir" "$M" --data "$work/emptydir" --epochs 1
  check 1 "$work/missing" "$M" --data "$work/missing" --epochs 1
  check 1 "$work/badidx/train-images-idx3-ubyte" "$M" --data "$work/badidx" --epochs 1
fi

if [ ${#mpi[@]} -gt 0 ]; then
  check 0 "copier \(copier_gbs\) +[0-9.]+ GB/s" "${mpi[@]}" -np 2 "$B" ckpt --state-mib 2 --tensors 2 --reps 1
  left=$(ls "$work/tmp" | grep hora-bench-ckpt)
  [ -z "$left" ] || { echo "FAIL: hora-bench ckpt left $left in TMPDIR"; fails=$((fails + 1)); }
fi

echo "$n invocations, $fails failed"
[ "$fails" = 0 ]
