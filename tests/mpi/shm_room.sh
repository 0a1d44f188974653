#!/bin/bash
# The shared-memory window where its directory is short of room, as in a container whose
# /dev/shm is small (Docker's default is 64 MiB): in a private mount namespace, Open MPI's window
# directory (osc_sm_backing_directory) is pointed at a tmpfs of a few MiB, and test_shm_room runs
#   fit:  4 MiB of room, 8 MiB pieces asked for (a 33 MiB window at 2 ranks): the pieces shrink
#         to fit (512 KiB at 2 ranks, 256 KiB at 3), the sums are exact, and local rank 0 warns
#         naming the directory and both piece sizes;
#   none: 1 MiB of room: every rank fails with HORA_ERR_NO_MEMORY naming the directory.
# Each run must end by itself (the harness's timeout is the hang it guards against).
#   shm_room.sh TEST_BINARY MPIEXEC [MPIEXEC FLAGS...]
# Needs root and `unshare -m` (a mount of its own); exits 77 (skipped) without them.
set -u
bin=$1
shift
if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then
  echo "shm_room: needs root and unshare -m (a private tmpfs mount): skipped"
  exit 77
fi
if [ "${1:-}" != --inside ]; then
  exec unshare -m bash "$0" "$bin" --inside "$@"
fi
shift
dir=$(mktemp -d "${TMPDIR:-/tmp}/hora-shm-room.XXXXXX")
trap 'umount "$dir" 2>/dev/null; rmdir "$dir"' EXIT
status=0
run() { # run SIZE MODE MPIEXEC...: prints the output, returns the exit status
  local room=$1 mode=$2
  shift 2
  mount -t tmpfs -o "size=$room" tmpfs "$dir" || return 99
  OMPI_MCA_osc_sm_backing_directory=$dir HORA_SHM_CHUNK_BYTES=8M HORA_ALLREDUCE_ALGO=shm \
    timeout 120 "$@" "$bin" "$mode" 2>&1
  local rc=$?
  umount "$dir"
  return $rc
}
out=$(run 4m fit "$@") || { echo "$out"; echo "shm_room: fit failed"; status=1; }
echo "$out" | grep -q "test_shm_room: passed" || { echo "$out"; echo "shm_room: fit did not pass"; status=1; }
echo "$out" | grep -qE "$dir has 4.0 MiB free on this node: pieces of (512|256) KiB instead of 8192 KiB" ||
  { echo "$out"; echo "shm_room: fit: no warning naming $dir and the piece sizes"; status=1; }
out=$(run 1m none "$@") || { echo "$out"; echo "shm_room: none failed"; status=1; }
echo "$out" | grep -q "test_shm_room: passed" || { echo "$out"; echo "shm_room: none did not pass"; status=1; }
[ $status = 0 ] && echo "shm_room: passed (pieces shrunk to fit 4 MiB; HORA_ERR_NO_MEMORY on every rank in 1 MiB)"
exit $status
