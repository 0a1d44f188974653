#!/usr/bin/env bash
# mpirun across the emulated nodes of the enclosing `nodes.sh run`: `mpirun.sh -np N ARGS...`
# places N ranks on the nodes in HORA_MN_HOSTS, HORA_MN_PPN ranks per node (default: N spread
# evenly, N / nodes rounded up), filling node 1 first, then node 2, ... (Open MPI's by-slot
# mapping), with nodes.sh's flags (rsh agent, TCP on the links, shared memory inside a node).
#
# `mpirun.sh --launch LAUNCH -np N PROG ARGS...` runs hora's launch instead (`launch -H
# h1:P,h2:P,... --bind none PROG ARGS...`), which starts mpirun itself; nodes.sh's OMPI_MCA_*
# variables carry the same settings to that mpirun.
set -euo pipefail
launch=""
if [ "${1:-}" = --launch ]; then
  launch="${2:?mpirun.sh: --launch needs the path of launch}"
  shift 2
fi
[ -n "${HORA_MN_HOSTS:-}" ] && [ -n "${HORA_MN_MPIFLAGS:-}" ] ||
  { echo "mpirun.sh: run me under tests/multinode/nodes.sh run (HORA_MN_HOSTS is not set)" >&2; exit 2; }
np=""
args=("$@")
for (( i = 0; i < ${#args[@]}; i++ )); do
  case "${args[$i]}" in -np|-n) np="${args[$((i + 1))]:-}"; break ;; esac
done
[[ "$np" =~ ^[0-9]+$ ]] || { echo "mpirun.sh: give the rank count as -np N" >&2; exit 2; }
IFS=, read -r -a hosts <<< "$HORA_MN_HOSTS"
ppn="${HORA_MN_PPN:-$(( (np + ${#hosts[@]} - 1) / ${#hosts[@]} ))}"
hostlist=""
for h in "${hosts[@]}"; do hostlist+="${hostlist:+,}$h:$ppn"; done
if [ -n "$launch" ]; then
  rest=()
  for (( i = 0; i < ${#args[@]}; i++ )); do
    case "${args[$i]}" in -np|-n) i=$((i + 1)) ;; *) rest+=("${args[$i]}") ;; esac
  done
  exec "$launch" -H "$hostlist" --bind none "${rest[@]}"
fi
# shellcheck disable=SC2086 # HORA_MN_MPIFLAGS is a list of flags
exec mpirun $HORA_MN_MPIFLAGS --host "$hostlist" "${args[@]}"
