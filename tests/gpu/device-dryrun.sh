#!/bin/bash
# CI's check of the prepared GPU device check (tests/gpu/device-check.sh) on a machine without a
# GPU: fetch the carried packages (device-prepare.sh), then run the check with them, as on the bare
# GPU machine: it must pass its dependency and build steps and stop with exit 77 saying there is no
# GPU. Where a private mount namespace can be made (root, `unshare -m`), the machine's own Open
# MPI, PMIx, hwloc and jansson are hidden under empty mounts first, so that only the carried
# copies can satisfy the build. To keep CI short it builds libhora, launch, hora-bench, the MNIST
# example and one GPU test (MPI, CUDA, NCCL, cuBLAS, OpenBLAS, hwloc, jansson, zlib all linked),
# not the whole test tree (HORA_DEVICE_BUILD_TARGETS= builds everything). The deps and build steps
# get 300 and 840 s here, not the device budget's 60 and 240: on 2 loaded cores unpacking the
# packages alone took over 60 s once; the device step's own times are in the summary. Exit 0 when all of
# that holds, 1 otherwise; 77 on a GPU machine (run device-check.sh itself there).
#   bash tests/gpu/device-dryrun.sh WORKDIR
set -uo pipefail
cd "$(dirname "$0")/../.."
# --hidden CMD...: inside `unshare -m`, hide the machine's MPI stack under empty mounts, run CMD.
if [ "${1:-}" = --hidden ]; then
  shift
  for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi \
           /etc/openmpi /usr/share/pmix /usr/lib/x86_64-linux-gnu/hwloc; do
    [ -d "$d" ] && mount -t tmpfs none "$d"
  done
  for f in /usr/bin/orterun /usr/bin/orted /usr/bin/opal_wrapper /usr/bin/mpicc.openmpi \
           /usr/lib/x86_64-linux-gnu/libpmix.so.2 /usr/lib/x86_64-linux-gnu/libhwloc.so.15 \
           /usr/lib/x86_64-linux-gnu/libevent_core-2.1.so.7 /usr/lib/x86_64-linux-gnu/libjansson.so.4 \
           /usr/lib/x86_64-linux-gnu/pkgconfig/hwloc.pc /usr/lib/x86_64-linux-gnu/pkgconfig/jansson.pc; do
    [ -e "$f" ] && mount --bind /dev/null "$f"
  done
  exec "$@"
fi
WORK=${1:?usage: device-dryrun.sh WORKDIR}
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "device-dryrun: this machine has a GPU: run tests/gpu/device-check.sh instead"; exit 77
fi
rm -rf "$WORK/deps" "$WORK/out"
mkdir -p "$WORK"
bash tests/gpu/device-prepare.sh "$WORK/deps" 2>&1 | grep -v '^W: Download is performed unsandboxed' ||
  true
[ -d "$WORK/deps/deb" ] && [ -n "$(ls "$WORK/deps/whl")" ] || { echo "device-dryrun: device-prepare.sh failed"; exit 1; }

hide=()
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  hide=(unshare -m bash "$0" --hidden)
  echo "device-dryrun: the machine's Open MPI, PMIx, hwloc and jansson are hidden from the check"
fi
OUT=$WORK/out HORA_DEVICE_DEPS=$WORK/deps HORA_DEVICE_BUILD=$WORK/build HORA_DEVICE_USE_DEBS=1 \
  HORA_DEVICE_KEEP_ALL=1 HORA_DEVICE_BUILD_S=${HORA_DEVICE_BUILD_S:-840} HORA_DEVICE_DEPS_S=${HORA_DEVICE_DEPS_S:-300} \
  HORA_DEVICE_BUILD_TARGETS=${HORA_DEVICE_BUILD_TARGETS-hora launch hora-bench mnist test_coll_gpu} \
  CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES:-90} \
  "${hide[@]}" bash tests/gpu/device-check.sh
rc=$?
fail=0
expect() { grep -qE "$1" "$2" || { echo "device-dryrun: FAILED: $3 (no '$1' in $2)"; fail=1; }; }
[ $rc = 77 ] || { echo "device-dryrun: FAILED: device-check.sh exited $rc, expected 77 (no GPU)"; fail=1; }
expect '^\| deps \| passed' "$WORK/out/summary.md" "the dependency step"
expect '^\| build \| passed' "$WORK/out/summary.md" "the build step"
expect '^\| gpu \| none found' "$WORK/out/summary.md" "the no-GPU verdict"
expect 'from .*deps \([0-9]+ packages\)' "$WORK/out/setup.log" "the carried packages in use"
expect "Found PkgConfig: $WORK/|Found MPI" "$WORK/out/setup.log" "the configure step"
for b in libhora.so bin/hora-bench bin/launch bin/mnist test_coll_gpu; do
  f=$(find "$WORK/build" -name "$(basename $b)*" \( -type f -o -type l \) | head -1)
  [ -n "$f" ] || { echo "device-dryrun: FAILED: $b was not built"; fail=1; }
done
rm -rf "$WORK/build"
[ $fail = 0 ] && echo "device-dryrun: passed (deps and build from the carried packages; no GPU: exit 77)"
exit $fail
