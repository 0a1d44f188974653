#!/usr/bin/env bash
# Emulated nodes on this one machine: N Linux network namespaces, each with its own host name
# (a UTS namespace entered with the namespace), joined by veth pairs to one bridge, each link
# rate-limited with tc (tbf, both directions: a full-duplex NIC of RATE) and delayed with netem
# where the kernel has it. Open MPI starts its daemons inside them through rsh-agent.sh, so
# mpirun, Open MPI and hora see N separate hosts that talk over TCP through the links, and the
# ranks of one node talk through shared memory, as on a cluster.
#
#   nodes.sh run [-n N] [-r RATE] [-d DELAY] [-c split|shared] [--] CMD [ARGS...]
#       create the nodes, run CMD in the root namespace (the "login node") with the variables
#       below exported, tear everything down (also on failure, Ctrl-C or SIGTERM), exit with
#       CMD's status. -c split (the default): each node's processes run on cores of their own
#       where the machine has enough (node i gets every N-th allowed CPU from the i-th; with
#       fewer CPUs than nodes, CPU (i-1) mod count), as on real nodes; -c shared: every node
#       may use every CPU.
#   nodes.sh check        exit 0 when this machine can run emulated nodes, else 77 saying why
#
# CMD sees:
#   HORA_MN_HOSTS     the node host names, comma-separated (hmn<ID>n1,...)
#   HORA_MN_MPIFLAGS  the mpirun flags that place ranks there: rsh agent, TCP on the links only,
#                     no binding, oversubscription allowed; add `--host H1:K,H2:K -np N`
#   OMPI_MCA_*        the same settings (but oversubscription and binding) for an mpirun that
#                     another program starts, such as hora's launch
#   HORA_MN_RATE      the link rate (tc syntax: 1gbit), HORA_MN_DELAY the one-way delay ("" = none)
#   HORA_MN_CPUS      each node's CPU list, "HOST=LIST HOST=LIST ..." (rsh-agent.sh applies it
#                     with taskset; empty with -c shared)
#
# Why nodes get their own cores: sharing them, a rank whose MPI wait busy-polls its sockets
# (Open MPI's TCP progress) kept a core for seconds while runnable ranks and heartbeat threads of
# the other emulated node waited on the run queue: each node's processes form one scheduling
# group (the kernel's autogroup: Open MPI starts each node's daemon in its own session), and the
# group weights split across cores left a waiting node's ranks a tiny share of the busy core.
# Measured on the 2-core VM, 256 MiB allreduce, 2 nodes x 2 ranks: ranks runnable but not run
# for 1.5-8.6 s at a time with shared cores (enough for false peer deaths); see
# docs/design.md, "A frozen machine".
#
# Defaults: 2 nodes, RATE 1gbit, no delay. Why 1 Gbit/s: the link must be the bottleneck, not the
# machine. Between two namespaces of a 2-core machine, unshaped TCP moved about 350 MB/s (one
# stream, both cores busy with sender, receiver and the network stack), and a 2 Gbit/s (250 MB/s)
# tbf link gave 215 MB/s, close enough to that ceiling that CPU load would show up as link speed.
# At 1 Gbit/s (125 MB/s) the link is a third of the ceiling, so busbw against the link rate
# judges the algorithm. TCP over a 1500-byte MTU carries at most 1448/1514 = 95.6% of the rate
# that tbf counts (Ethernet frames).
# Needs root, `ip` and `tc` (iproute2) and `unshare` (util-linux); without them `check` and `run`
# exit 77 and say why (tests/install-deps.sh installs iproute2). Names carry this script's PID,
# so several runs may coexist; everything is removed on exit.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

skip() { echo "nodes.sh: skipped: $*" >&2; exit 77; }

check() {
  [ "$(id -u)" = 0 ] || skip "emulated nodes need root (network namespaces, tc)"
  command -v ip >/dev/null || skip "no 'ip' (install iproute2)"
  command -v tc >/dev/null || skip "no 'tc' (install iproute2)"
  command -v unshare >/dev/null || skip "no 'unshare' (install util-linux)"
  local probe="hmnprobe$$"
  ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace here (ip netns add failed)"
  ip netns del "$probe"
}

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; }

N=2 RATE=1gbit DELAY="" CPUS=split
ID=$(( $$ % 100000 ))
NET="10.$(( 100 + ID / 256 % 100 )).$(( ID % 256 ))"
BR="hmnb$ID"
NODES=()

stop_child() {
  [ -n "${CHILD:-}" ] || return 0
  kill -TERM "$CHILD" 2>/dev/null || true
  local i
  for (( i = 0; i < 50; i++ )); do kill -0 "$CHILD" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$CHILD" 2>/dev/null || true
}

teardown() {
  local ns pid i=0
  for ns in "${NODES[@]}"; do
    i=$((i + 1))
    # Processes still inside the node (a rank left behind by a failed run) die with it.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip link del "hmn${ID}v$i" 2>/dev/null || true # the pair, with its end in the node
    ip netns del "$ns" 2>/dev/null || true
    # Open MPI's session folder of this host name, left behind when a rank was killed.
    rm -rf "${TMPDIR:-/tmp}/ompi.$ns."*
  done
  ip link del "$BR" 2>/dev/null || true
  NODES=()
}

# Shape one end of a link: tbf at RATE (burst: 1 ms of traffic, at least 64 KiB, so the kernel's
# timer granularity does not cap the rate), then netem delay where available.
shape() { # shape NETNS_OR_EMPTY DEV
  local in=() bytes_ms burst
  [ -n "$1" ] && in=(ip netns exec "$1")
  bytes_ms=$(tc_rate_bytes "$RATE")
  burst=$(( bytes_ms / 1000 > 65536 ? bytes_ms / 1000 : 65536 ))
  if [ -n "$DELAY" ] && "${in[@]}" tc qdisc add dev "$2" root handle 1: netem delay "$DELAY" 2>/dev/null; then
    "${in[@]}" tc qdisc add dev "$2" parent 1:1 handle 10: tbf rate "$RATE" burst "$burst" latency 50ms
  else
    [ -n "$DELAY" ] && echo "nodes.sh: this kernel has no netem: links get no delay" >&2 && DELAY=""
    "${in[@]}" tc qdisc add dev "$2" root tbf rate "$RATE" burst "$burst" latency 50ms
  fi
}

# Bytes per second of a tc rate (bit, kbit, mbit, gbit; the k/m/g multipliers are 1000s as in tc).
tc_rate_bytes() {
  local v="${1,,}" num unit
  num="${v%%[a-z]*}" unit="${v#"$num"}"
  case "$unit" in
    bit) echo $(( num / 8 )) ;; kbit) echo $(( num * 1000 / 8 )) ;;
    mbit) echo $(( num * 1000000 / 8 )) ;; gbit) echo $(( num * 1000000000 / 8 )) ;;
    *) echo "nodes.sh: rate '$1': use a number with bit, kbit, mbit or gbit (e.g. 2gbit)" >&2; return 2 ;;
  esac
}

# "HOST=LIST ..." for -c split: node i (from 1) gets the allowed CPUs i-1, i-1+N, i-1+2N, ...;
# with fewer CPUs than nodes, the one CPU (i-1) mod count.
node_cpus() {
  local allowed=() c i j list out=""
  for c in $(taskset -pc $$ | sed 's/.*: //' | tr ',' ' '); do
    if [[ "$c" == *-* ]]; then for (( j = ${c%-*}; j <= ${c#*-}; j++ )); do allowed+=("$j"); done
    else allowed+=("$c"); fi
  done
  for (( i = 0; i < N; i++ )); do
    list=""
    if [ "${#allowed[@]}" -ge "$N" ]; then
      for (( j = i; j < ${#allowed[@]}; j += N )); do list+="${list:+,}${allowed[$j]}"; done
    else
      list="${allowed[$(( i % ${#allowed[@]} ))]}"
    fi
    out+="${out:+ }${NODES[$i]}=$list"
  done
  echo "$out"
}

setup() {
  ip link add "$BR" type bridge
  ip addr add "$NET.254/24" dev "$BR"
  ip link set "$BR" up
  local i ns
  for (( i = 1; i <= N; i++ )); do
    ns="hmn${ID}n$i"
    NODES+=("$ns")
    ip netns add "$ns"
    ip link add "hmn${ID}v$i" type veth peer name "hmn${ID}p$i"
    ip link set "hmn${ID}p$i" netns "$ns"
    ip -n "$ns" link set "hmn${ID}p$i" name eth0
    ip -n "$ns" addr add "$NET.$i/24" dev eth0
    ip -n "$ns" link set lo up # hora's heartbeat uses 127.0.0.1 between ranks of one host
    ip -n "$ns" link set eth0 up
    ip link set "hmn${ID}v$i" master "$BR" up
    shape "$ns" eth0          # node -> bridge
    shape "" "hmn${ID}v$i"    # bridge -> node
  done
}

cmd_run() {
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) N="$2"; shift 2 ;;
      -r) RATE="$2"; shift 2 ;;
      -d) DELAY="$2"; shift 2 ;;
      -c) CPUS="$2"; shift 2 ;;
      --) shift; break ;;
      -h|--help) usage; exit 0 ;;
      -*) echo "nodes.sh run: unknown option '$1' (see nodes.sh --help)" >&2; exit 2 ;;
      *) break ;;
    esac
  done
  [[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 32 ] ||
    { echo "nodes.sh run: -n '$N': want 1 to 32 nodes" >&2; exit 2; }
  tc_rate_bytes "$RATE" >/dev/null
  case "$CPUS" in split|shared) ;; *) echo "nodes.sh run: -c '$CPUS': want split or shared" >&2; exit 2 ;; esac
  [ $# -gt 0 ] || { echo "nodes.sh run: no command to run (nodes.sh run [-n N] -- CMD...)" >&2; exit 2; }
  check
  # CMD runs in the background and we wait for it, so a signal is handled at once (bash runs a
  # trap only after the foreground command ends): stop CMD, then remove the nodes.
  CHILD=""
  trap 'teardown' EXIT
  trap 'stop_child; teardown; exit 130' INT
  trap 'stop_child; teardown; exit 143' TERM
  setup
  local hosts
  hosts=$(IFS=,; echo "${NODES[*]}")
  export HORA_MN_HOSTS="$hosts" HORA_MN_RATE="$RATE" HORA_MN_DELAY="$DELAY"
  HORA_MN_CPUS=""
  [ "$CPUS" = split ] && HORA_MN_CPUS="$(node_cpus)"
  export HORA_MN_CPUS
  # TCP (and Open MPI's out-of-band channel) on the links' subnet only; shared memory inside a
  # node; mpirun itself runs here, in the root namespace, and reaches the daemons over the bridge.
  export HORA_MN_MPIFLAGS="--mca plm_rsh_agent $HERE/rsh-agent.sh --mca plm_rsh_no_tree_spawn 1 \
--mca btl self,vader,tcp --mca btl_tcp_if_include $NET.0/24 --mca oob_tcp_if_include $NET.0/24 \
--mca btl_vader_single_copy_mechanism none --oversubscribe --bind-to none"
  # The same for an mpirun started by someone else (hora's launch): Open MPI reads OMPI_MCA_*.
  export OMPI_MCA_plm_rsh_agent="$HERE/rsh-agent.sh" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include="$NET.0/24" \
    OMPI_MCA_oob_tcp_if_include="$NET.0/24" OMPI_MCA_btl_vader_single_copy_mechanism=none
  echo "nodes.sh: $N node(s) $hosts on $NET.0/24, links $RATE${DELAY:+ + $DELAY delay} (tbf both ways)${HORA_MN_CPUS:+, cores $HORA_MN_CPUS}" >&2
  local rc=0
  "$@" <&0 &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=""
  return $rc
}

case "${1:-}" in
  run) shift; cmd_run "$@" ;;
  check) check; echo "nodes.sh: emulated nodes can run here" ;;
  -h|--help|"") usage ;;
  *) echo "nodes.sh: unknown command '$1' (run, check)" >&2; exit 2 ;;
esac
