#!/usr/bin/env bash
# hora-bench allreduce across emulated nodes (docs/benchmarks.md, "Across emulated nodes"):
# ring, hier and auto against MPI_Allreduce, 4 KiB to 256 MiB, float32 sum, on 2 nodes x 2 ranks
# and 3 nodes x 1 rank, each link RATE (tbf both ways), plus one node x 2 ranks for the
# shared-memory level of docs/scaling.md.
#
#   tests/multinode/bench.sh OUTDIR [RATE]       (root; build/bin/hora-bench built)
#   HORA_MN_CORES=split|shared (default shared): nodes.sh -c
#
# OUTDIR gets, per layout (2x2, 3x1, 1x2): LAYOUT_small.json (4 KiB .. 4 MiB, 3 interleaved
# repeats, median) and LAYOUT_large.json (8 .. 256 MiB, one repeat, 3 iterations: a 256 MiB
# allreduce takes seconds on a 1 Gbit/s link), LAYOUT.txt (the printed tables, tc's counters of
# every link: sent bytes, drops, and the load average before and after). docs/figures/plot.py
# renders the JSON; docs/figures/scaling.py fits the model to it.
#
# Peer timeout: HORA_PEER_TIMEOUT_S=60 (unless set): on a loaded VM a whole vCPU may stall for
# seconds while the emulated links are busy, and a rank that sends no heartbeat for the timeout is
# declared dead by design. Each rank logs its longest heartbeat silence and stall at the end
# (HORA_LOG=INFO, subsystem ENGINE), so the margins are in LAYOUT.txt.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${1:?usage: bench.sh OUTDIR [RATE]}"
RATE="${2:-1gbit}"
BENCH="${HORA_BENCH:-$ROOT/build/bin/hora-bench}"
[ -x "$BENCH" ] || { echo "bench.sh: no $BENCH (build first, or set HORA_BENCH)" >&2; exit 2; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ALGOS="${HORA_BENCH_ALGOS:-ring,hier,auto,mpi}"
# The figures in docs/benchmarks.md were measured with every node on every core (-c shared: each
# node's 2 ranks have 2 cores, as on a real node with a core per rank); the tests use -c split.
CORES="${HORA_MN_CORES:-shared}"

sweep() { # sweep TAG MPIRUN... : the two size ranges
  local tag="$1"
  shift
  "$@" "$BENCH" allreduce --min-bytes 4K --max-bytes 4M --algo "$ALGOS" --warmup 2 --repeat 3 \
    --json "$OUT/${tag}_small.json"
  "$@" "$BENCH" allreduce --min-bytes 8M --max-bytes 256M --algo "$ALGOS" --warmup 1 --iters 3 \
    --json "$OUT/${tag}_large.json"
}
export -f sweep
export BENCH OUT ALGOS
export HORA_PEER_TIMEOUT_S="${HORA_PEER_TIMEOUT_S:-60}" HORA_LOG="${HORA_LOG:-INFO}" HORA_LOG_SUBSYS="${HORA_LOG_SUBSYS:-ENGINE}"

for layout in 2x2 3x1; do
  nodes="${layout%x*}" ppn="${layout#*x}"
  # with one rank per node hier is the ring (dispatch.c), so 3x1 skips it
  [ "$ppn" = 1 ] && ALGOS="${HORA_BENCH_ALGOS:-ring,auto,mpi}"
  {
    echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$HERE/nodes.sh" run -n "$nodes" -r "$RATE" -c "$CORES" -- bash -c "
      HORA_MN_PPN=$ppn sweep $layout '$HERE/mpirun.sh' -np $((nodes * ppn)) \
        -x HORA_PEER_TIMEOUT_S -x HORA_LOG -x HORA_LOG_SUBSYS
      for h in \${HORA_MN_HOSTS//,/ }; do echo \"# link of \$h:\"; ip netns exec \$h tc -s qdisc show dev eth0; done"
    echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  } 2>&1 | tee "$OUT/$layout.txt"
done
# One node, 2 ranks, shared memory (no emulated link): the intra-node level of the model.
{
  echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  ALGOS=shm,mpi sweep 1x2 mpirun --oversubscribe --bind-to none --mca btl self,vader -np 2
  echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$OUT/1x2.txt"
