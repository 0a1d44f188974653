#!/usr/bin/env bash
# Open MPI's remote shell for emulated nodes (nodes.sh sets `--mca plm_rsh_agent` to this file):
# `rsh-agent.sh [options] HOST COMMAND...` runs COMMAND (a shell command line, as ssh would) in the
# network namespace named HOST, inside a new UTS namespace whose host name is HOST, so the daemon
# and the ranks it starts see that node's address and name. Options (ssh's, which Open MPI may
# pass) are ignored.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
[ $# -ge 2 ] || { echo "rsh-agent.sh: usage: rsh-agent.sh HOST COMMAND..." >&2; exit 2; }
host="$1"
shift
[ -e "/run/netns/$host" ] || { echo "rsh-agent.sh: no emulated node '$host' (no network namespace of that name)" >&2; exit 255; }
# The node's own cores (nodes.sh -c split): the daemon and every rank it starts inherit them.
cpus=""
for entry in ${HORA_MN_CPUS:-}; do [ "${entry%%=*}" = "$host" ] && cpus="${entry#*=}"; done
pin=()
[ -n "$cpus" ] && pin=(taskset -c "$cpus")
exec ip netns exec "$host" "${pin[@]}" unshare --uts -- sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
