#!/bin/sh
# ThreadSanitizer run of the engine's multi-rank tests (engine thread, heartbeat thread and user
# threads share handles, the queue and the live-handle list), and of the shared-memory allreduce
# split over helper threads (algo/pool.c).
#   sh tests/engine/tsan.sh [build-dir]      (default: build-tsan next to the source)
# Configures a HORA_TSAN=ON build, builds only the engine tests and runs them for 2 and 3 ranks;
# any TSan report fails the test (exit code 66) and is printed at the end. Takes a few minutes on
# 2 cores.
# TSAN_BUILD_ONLY=1: configure and build only.
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
b=${1:-$src/build-tsan}
cmake -S "$src" -B "$b" -DHORA_TSAN=ON -DHORA_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$b" -j2 --target test_engine_random test_engine_ops test_engine_mismatch test_engine_stall test_engine_timeline test_engine_fusion test_coll test_shm_sg
[ "${TSAN_BUILD_ONLY:-0}" = 1 ] && exit 0 # tests/run.sh builds the tree ahead of the run
# Reports go to files (log_path) and are printed below: a rank's stderr may be redirected by its
# test (test_engine_stall captures rank 0's), which would swallow a report printed there.
# history_size=7: the longest per-thread history, so that a report can show both stacks.
reports=$(mktemp -d "${TMPDIR:-/tmp}/hora-tsan.XXXXXX")
trap 'rm -rf "$reports"' EXIT
export TSAN_OPTIONS="suppressions=$src/tests/engine/tsan.supp halt_on_error=1 exitcode=66 report_signal_unsafe=0 history_size=7 log_path=$reports/report"
status=0
ctest --test-dir "$b" --output-on-failure -R 'test_engine_(random|random_cache|ops|mismatch|stall|timeline|timeline_dynamic|fusion|fusion_packed|fusion_threads)_np[23]$|^test_coll_threads_np[23]$|^test_shm_sg_threads_np2$' || status=1
for f in "$reports"/report.*; do
  [ -e "$f" ] || continue
  echo "== ThreadSanitizer report ($(basename "$f"), pid of the rank):"
  cat "$f"
  status=1
done
exit $status
