#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for tests: munged, slurmctld and N slurmd daemons
# (fake nodes n1..nN, all on 127.0.0.1), each node declared with CPUS CPUs and GPUS fake GPUs
# (gres gpu backed by character devices), PMIx as the default MPI plugin.
#
#   cluster.sh start    install what is missing (apt, root only), write the configuration, start
#                       the daemons (or keep them when already running with the same config),
#                       wait until every node is idle; prints "export SLURM_CONF=..." on stdout
#   cluster.sh stop     cancel all jobs, then stop each daemon by the PID in its PID file
#   cluster.sh status   exit 0 when all daemons run and the nodes answer, else 1
#   cluster.sh env      print the export lines clients need (eval "$(cluster.sh env)")
#
# Exit status 77 from start means "cannot run here" (not root, packages missing and not
# installable): tests that need the cluster skip. Any other failure is an error.
#
# Environment (all optional):
#   HORA_SLURM_DIR      everything lives here (default /tmp/hora-slurm): etc/ log/ run/ spool/ tmp/
#   HORA_SLURM_PORT     slurmctld port (default 16817); slurmd of node i listens on PORT+i
#   HORA_SLURM_NODES    fake nodes (default 2)
#   HORA_SLURM_CPUS     CPUs declared per node (default 8; more than the machine is fine)
#   HORA_SLURM_GPUS     fake GPUs per node (default 4; 0 = no gres)
#   HORA_SLURM_INSTALL  1 (default) = apt-get install missing packages; 0 = never
#   HORA_SLURM_SPLIT    1 (default) = each node's slurmd (and so every task it starts) runs on its
#                       own share of this machine's CPUs, as on real nodes; 0 = all share all
#
# What jobs see (see docs/launch.md, "Testing with the local cluster"): node names n1..nN that
# all share this machine's hostname; SLURMD_NODENAME tells them apart. Each slurmd starts under
# `taskset` with a disjoint slice of the CPUs this script may use (2 CPUs, 2 nodes: n1 gets CPU 0,
# n2 CPU 1), and its tasks inherit it (TaskPlugin=task/none leaves affinity alone), so launch's
# default binding splits a node's own CPUs among its ranks as on a real node. With fewer CPUs
# than nodes every node gets all of them (the nodes then compete, as the log says). A TaskProlog gives every
# task of node nK its own TMPDIR (DIR/tmp/nK) and Open MPI shared-memory directory, and keeps
# Open MPI's TCP on the loopback interface. Requeued jobs are held ~120 s unless released with
# `scontrol update JobId=N StartTime=now`.
set -euo pipefail

DIR=${HORA_SLURM_DIR:-/tmp/hora-slurm}
PORT=${HORA_SLURM_PORT:-16817}
NODES=${HORA_SLURM_NODES:-2}
CPUS=${HORA_SLURM_CPUS:-8}
GPUS=${HORA_SLURM_GPUS:-4}
INSTALL=${HORA_SLURM_INSTALL:-1}
SPLIT=${HORA_SLURM_SPLIT:-1}
CONF=$DIR/etc/slurm.conf
SOCK=$DIR/munge/run/munge.socket
export SLURM_CONF=$CONF

say() { echo "cluster.sh: $*" >&2; }
skip() { say "cannot run here: $*"; exit 77; }

# A process is alive when /proc has it and it is not a zombie (daemons are reparented to an init
# that may reap late).
alive() {
  local st
  [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] || return 1
  st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ "$st" != Z ] && [ "$st" != X ]
}
pid_of() { [ -s "$1" ] && cat "$1"; }
stop_pid_file() {
  local f=$1 pid i
  pid=$(pid_of "$f") || return 0
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && { say "$(basename "$f") ($pid) ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$f"
}
node_names() { if [ "$NODES" = 1 ]; then echo n1; else echo "n[1-$NODES]"; fi; }

# The CPUs this script may run on, one per line (Cpus_allowed_list, e.g. "0-3,8").
allowed_cpus() {
  local list r
  list=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
  for r in ${list//,/ }; do
    case "$r" in *-*) seq "${r%-*}" "${r#*-}" ;; *) echo "$r" ;; esac
  done
}
# CPU list of node i (1-based): a disjoint slice of the allowed CPUs, or all of them when there
# are fewer CPUs than nodes or HORA_SLURM_SPLIT=0.
node_cpus() {
  local i=$1 cpus n lo hi
  mapfile -t cpus < <(allowed_cpus)
  n=${#cpus[@]}
  if [ "$SPLIT" != 1 ] || [ "$n" -lt "$NODES" ]; then
    echo "${cpus[*]}" | tr ' ' ','
    return
  fi
  lo=$(( (i - 1) * n / NODES )); hi=$(( i * n / NODES ))
  echo "${cpus[@]:lo:hi-lo}" | tr ' ' ','
}

install_packages() {
  local need=0 b
  for b in munged mungekey slurmctld slurmd srun sbatch scontrol mpirun; do command -v "$b" >/dev/null || need=1; done
  ls /usr/lib/*/slurm-wlm/mpi_pmix*.so >/dev/null 2>&1 || need=1
  ls /usr/lib/*/libpmix.so >/dev/null 2>&1 || need=1
  [ $need = 0 ] && return 0
  [ "$INSTALL" = 1 ] || skip "Slurm/munge/PMIx packages missing and HORA_SLURM_INSTALL=0"
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get"
  say "installing slurm-wlm munge libpmix-dev openmpi-bin"
  # Keep the packages' init scripts from starting system daemons while installing.
  local policy=/usr/sbin/policy-rc.d made=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' > $policy; chmod 755 $policy; made=1; fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurm-wlm munge libpmix-dev openmpi-bin libopenmpi-dev >/dev/null; } || rc=$?
  [ $made = 1 ] && rm -f $policy
  [ $rc = 0 ] || skip "apt-get install failed ($rc)"
}

start_munge() {
  mkdir -p "$DIR/munge/key" "$DIR/munge/run" "$DIR/log"
  chmod 755 "$DIR" "$DIR/munge" "$DIR/munge/run" "$DIR/log" # munged wants its socket dir o+x
  chmod 700 "$DIR/munge/key"
  if [ ! -s "$DIR/munge/key/munge.key" ]; then
    mungekey --create --keyfile="$DIR/munge/key/munge.key" 2>/dev/null ||
      head -c 1024 /dev/urandom > "$DIR/munge/key/munge.key"
    chmod 400 "$DIR/munge/key/munge.key"
  fi
  if alive "$(pid_of "$DIR/munge/run/munged.pid" || true)"; then return 0; fi
  munged --socket="$SOCK" --key-file="$DIR/munge/key/munge.key" --pid-file="$DIR/munge/run/munged.pid" \
    --seed-file="$DIR/munge/key/seed" --log-file="$DIR/log/munged.log"
  munge -n --socket="$SOCK" </dev/null | unmunge --socket="$SOCK" >/dev/null
}

# Writes slurm.conf, gres.conf and the TaskProlog; sets CHANGED=1 when the config differs.
write_config() {
  local i gres="" new
  mkdir -p "$DIR/etc" "$DIR/run" "$DIR/spool/ctld" "$DIR/dev" "$DIR/tmp"
  for i in $(seq "$NODES"); do mkdir -p "$DIR/spool/n$i" "$DIR/tmp/n$i"; done
  chmod 1777 "$DIR/tmp" "$DIR"/tmp/n*
  if [ "$GPUS" -gt 0 ]; then
    gres="Gres=gpu:$GPUS"
    # slurmd accepts only character/block devices as gres files: clone /dev/null (char 1:3).
    for i in $(seq 0 $((GPUS - 1))); do
      [ -c "$DIR/dev/gpu$i" ] || { rm -f "$DIR/dev/gpu$i"; mknod -m 666 "$DIR/dev/gpu$i" c 1 3 2>/dev/null ||
        ln -s /dev/null "$DIR/dev/gpu$i"; }
    done
  fi
  new=$(mktemp)
  local cpumap=""
  for i in $(seq "$NODES"); do cpumap="$cpumap n$i=$(node_cpus "$i")"; done
  cat > "$new" <<CONF
# hora test cluster: $NODES fake node(s) on 127.0.0.1 (written by tests/slurm/cluster.sh)
# slurmd CPU sets (taskset):$cpumap
ClusterName=hora
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
MailProg=/bin/true
# No cgroups (containers and VMs without systemd): Linux process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
# Debian's Open MPI can only be direct-launched through PMIx.
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Start batch jobs at once instead of batching them every 3 s.
SchedulerParameters=batch_sched_delay=0
# Nodes may declare more CPUs than the machine has.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
# The fake nodes share /tmp: give each its own (the pmix plugin keeps per-step files there).
TmpFS=$DIR/tmp/%n
TaskProlog=$DIR/etc/task_prolog.sh
${gres:+GresTypes=gpu}
NodeName=$(node_names) NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$((PORT + 1))-$((PORT + NODES))] CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=4000 $gres State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  [ "$NODES" = 1 ] && sed -i "s/Port=\[$((PORT + 1))-$((PORT + 1))\]/Port=$((PORT + 1))/" "$new"
  CHANGED=0
  cmp -s "$new" "$CONF" || { mv "$new" "$CONF"; chmod 644 "$CONF"; CHANGED=1; }
  rm -f "$new"
  new=$(mktemp)
  echo "AutoDetect=off" > "$new"
  [ "$GPUS" -gt 0 ] && echo "NodeName=$(node_names) Name=gpu File=$DIR/dev/gpu[0-$((GPUS - 1))]" >> "$new"
  cmp -s "$new" "$DIR/etc/gres.conf" || { mv "$new" "$DIR/etc/gres.conf"; chmod 644 "$DIR/etc/gres.conf"; CHANGED=1; }
  rm -f "$new"
  # TaskProlog: stdout lines "export X=y" / "unset X" change every task's environment.
  # Open MPI names its shared-memory files after the host name, which all fake nodes share,
  # so each node gets its own directory; set unconditionally since a step started from a batch
  # script inherits the batch node's value.
  cat > "$DIR/etc/task_prolog.sh" <<'PROLOG'
#!/bin/sh
d="$(dirname "$(dirname "$0")")/tmp/$SLURMD_NODENAME"
echo "export TMPDIR=$d"
echo "export OMPI_MCA_btl_vader_backing_directory=$d"
echo "unset SLURM_SCRIPT_CONTEXT"
[ -n "$OMPI_MCA_btl_tcp_if_include$OMPI_MCA_btl_tcp_if_exclude" ] || echo "export OMPI_MCA_btl_tcp_if_include=lo"
[ -n "$OMPI_MCA_oob_tcp_if_include$OMPI_MCA_oob_tcp_if_exclude" ] || echo "export OMPI_MCA_oob_tcp_if_include=lo"
exit 0
PROLOG
  chmod 755 "$DIR/etc/task_prolog.sh"
}

stop_slurm() {
  local i f
  if alive "$(pid_of "$DIR/run/slurmctld.pid" || true)"; then
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
      # shellcheck disable=SC2046
      scancel $(squeue -h -o %i) 2>/dev/null || true
      for i in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  for f in "$DIR"/run/slurmd.*.pid; do [ -e "$f" ] && stop_pid_file "$f"; done
  stop_pid_file "$DIR/run/slurmctld.pid"
}

daemons_alive() {
  local i
  alive "$(pid_of "$DIR/munge/run/munged.pid" || true)" || return 1
  alive "$(pid_of "$DIR/run/slurmctld.pid" || true)" || return 1
  for i in $(seq "$NODES"); do alive "$(pid_of "$DIR/run/slurmd.n$i.pid" || true)" || return 1; done
}

start_slurm() {
  local i states=""
  alive "$(pid_of "$DIR/run/slurmctld.pid" || true)" || slurmctld -f "$CONF"
  for i in $(seq 50); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
  local n cpus
  n=$(allowed_cpus | wc -l)
  [ "$SPLIT" = 1 ] && [ "$n" -lt "$NODES" ] &&
    say "only $n CPU(s) for $NODES nodes: every node gets all of them (their tasks compete)"
  for i in $(seq "$NODES"); do
    cpus=$(node_cpus "$i")
    alive "$(pid_of "$DIR/run/slurmd.n$i.pid" || true)" || taskset -c "$cpus" slurmd -f "$CONF" -N "n$i"
  done
  for i in $(seq 150); do
    states=$(sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$states" = "idle " ] && return 0
    case "$states" in *drain*|*down*|*inval*) scontrol update NodeName="$(node_names)" State=RESUME 2>/dev/null || true ;; esac
    sleep 0.2
  done
  say "nodes are not idle: '$states'"
  tail -n 20 "$DIR"/log/slurm*.log >&2 || true
  return 1
}

case "${1:-}" in
  start)
    [ "$(id -u)" = 0 ] || skip "the test cluster runs its daemons as root; run as root"
    install_packages
    start_munge
    write_config
    if [ "$CHANGED" = 1 ]; then stop_slurm; fi
    start_slurm
    say "up: $(sinfo -h -o '%D nodes %N %T') ($CPUS CPUs, $GPUS GPUs each; SLURM_CONF=$CONF;$(sed -n 's/^# slurmd CPU sets (taskset)://p' "$CONF"))"
    echo "export SLURM_CONF=$CONF"
    ;;
  stop)
    [ -d "$DIR" ] || exit 0
    stop_slurm
    stop_pid_file "$DIR/munge/run/munged.pid"
    ;;
  status)
    daemons_alive && [ -s "$CONF" ] && sinfo -h -o %T >/dev/null 2>&1
    ;;
  env)
    echo "export SLURM_CONF=$CONF"
    ;;
  *)
    echo "usage: $0 start|stop|status|env" >&2
    exit 2
    ;;
esac
