#!/usr/bin/env bash
# NAME
#   slurm-cluster.sh - a real Slurm cluster on this host for the tests: slurmctld and two
#   slurmd nodes, each node in a network and UTS namespace of its own
#
# SYNOPSIS
#   scripts/slurm-cluster.sh start DIR
#   scripts/slurm-cluster.sh stop [--keep-logs] DIR
#   scripts/slurm-cluster.sh exec DIR [NODE] -- COMMAND [ARG...]
#   scripts/slurm-cluster.sh node-crash DIR NODE
#   scripts/slurm-cluster.sh node-restart DIR NODE
#
# DESCRIPTION
#   start creates DIR and starts, with all state, spool, logs and pid files under DIR (nothing in
#   /etc/slurm, /etc/munge or /var):
#     munged      with a key of its own (DIR/munge/munge.key) on its own socket
#     two nodes   network namespaces gpurun-slurm-n0 and gpurun-slurm-n1 joined by a veth
#                 pair: node gpurun-n0 at 10.234.0.1 and gpurun-n1 at 10.234.0.2 (/etc/netns/NS/hosts names both, so that a job's
#                 SLURM_JOB_NODELIST resolves on either node)
#     slurmctld   on node 0 (SlurmctldHost=gpurun-n0)
#     slurmd      one per node, each with the node's host name (UTS namespace)
#   and two partitions over both nodes: `low` (the default; PriorityTier=1, PreemptMode=REQUEUE,
#   GraceTime=5) and `high` (PriorityTier=2), so that a job in `high` preempts one in `low`.
#   AuthInfo cred_expire=10 makes a requeued job eligible again after 10 s (Slurm's default is
#   120 s), sched_interval=2 and bf_interval=2 start it within seconds, and the grace time is short: the tests
#   wait less, Slurm's logic is the same. It returns once both nodes are idle, and writes DIR/env, lines to `source`:
#     export SLURM_CONF=DIR/slurm.conf
#     export GPURUN_SLURM_CLUSTER_DIR=DIR
#   The client commands (sbatch, squeue, scontrol, scancel) reach slurmctld only from inside the
#   nodes' network: run them with `exec`.
#
#   stop stops the daemons by their pid files (SIGTERM, up to 10 s, then SIGKILL), kills any
#   process left in the nodes' namespaces (jobs included), deletes the namespaces and
#   /etc/netns/NS, checks that nothing is left, and removes DIR (DIR/log stays with
#   --keep-logs).
#
#   exec runs COMMAND in NODE's network namespace (default 0) with SLURM_CONF set.
#
#   node-crash kills everything on NODE (0 or 1) at once, slurmd and the job's processes, as a
#   power loss would, and marks the node DOWN (slurmctld would after SlurmdTimeout; the tests
#   do not wait 300 s). Slurm requeues the node's jobs that allow it (--requeue).
#   node-restart starts NODE's slurmd again and returns the node to service.
#
# EXIT STATUS
#   0 done; 77 Slurm, munge, `ip` or `unshare` is missing, or this user may not make network
#   namespaces: tests take 77 as "skipped"; 1 anything else.
#
# NOTES
#   Debian 12's Slurm 22.05 with proctrack/linuxproc and task/none: no cgroup, no systemd.
#   Everything runs as root (SlurmUser=root), as in a container. Start and stop take under a
#   second. One cluster per machine: the namespaces' names and the nodes' addresses are fixed
#   (a start stops a cluster it finds in them, from whatever DIR).
set -Eeuo pipefail

die() { echo "slurm-cluster: $*" >&2; exit 1; }
skip() { echo "slurm-cluster: $*; skipped" >&2; exit 77; }
usage() { sed -n '2,/^set -Eeuo/{/^set -Eeuo/d;s/^# \{0,1\}//;p}' "$0"; }

NODES=(gpurun-n0 gpurun-n1)
ADDRS=(10.234.0.1 10.234.0.2)
NS=(gpurun-slurm-n0 gpurun-slurm-n1)
VETH=(gpurun-sl0 gpurun-sl1)

alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# SIGTERM, up to 10 s, then SIGKILL.
stop_pid() {
  local pid=$1 i
  alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 100); do alive "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  for i in $(seq 50); do alive "$pid" || return 0; sleep 0.1; done
  echo "slurm-cluster: pid $pid survives SIGKILL" >&2
}

stop_pidfile() {
  [ -s "$1" ] || return 0
  stop_pid "$(cat "$1")"
  rm -f "$1"
}

# Every process in network namespace $1, SIGKILLed (a crashed node leaves nothing running).
kill_namespace() {
  local ns=$1 pids i
  ip netns list 2>/dev/null | grep -qw "$ns" || return 0
  for i in $(seq 50); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.1
  done
  echo "slurm-cluster: processes left in $ns: $(ip netns pids "$ns" | tr '\n' ' ')" >&2
}

# Runs "$@" in node $1's network namespace, with /etc/netns/NS/hosts as /etc/hosts (in a mount
# namespace of its own). Not `ip netns exec`: it mounts a fresh /sys, without the cgroup file
# systems that slurmd 22.05 insists on reading even with proctrack/linuxproc and task/none.
in_node_net() {
  local n=$1
  shift
  nsenter --net="/run/netns/${NS[$n]}" unshare --mount /bin/sh -c \
    'mount --bind "$0" /etc/hosts && exec "$@"' "/etc/netns/${NS[$n]}/hosts" "$@"
}

# The same, with a UTS namespace carrying the node's host name: the daemons on node $1.
on_node() {
  local n=$1
  shift
  in_node_net "$n" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "${NODES[$n]}" "$@"
}

write_conf() {
  local dir=$1
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-cluster.sh; removed by its stop.
ClusterName=gpurun
SlurmctldHost=${NODES[0]}(${ADDRS[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
JobRequeue=1
MinJobAge=600
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=${NODES[0]} NodeAddr=${ADDRS[0]} CPUs=2 RealMemory=4000 State=UNKNOWN
NodeName=${NODES[1]} NodeAddr=${ADDRS[1]} CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=5
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2
EOF
}

start_slurmd() {
  local dir=$1 n=$2
  mkdir -p "$dir/spool/${NODES[$n]}"
  SLURM_CONF=$dir/slurm.conf on_node "$n" /usr/sbin/slurmd -N "${NODES[$n]}" -f "$dir/slurm.conf" \
    >>"$dir/log/slurmd-${NODES[$n]}.out" 2>&1
}

# squeue/sinfo/scontrol against this cluster, from node 0.
client() {
  local dir=$1
  shift
  SLURM_CONF=$dir/slurm.conf in_node_net 0 "$@"
}

node_state() { client "$1" sinfo -h -n "$2" -o %T 2>/dev/null | head -1; }

wait_idle() {
  local dir=$1 n=$2 i state=""
  for i in $(seq 300); do
    state=$(node_state "$dir" "${NODES[$n]}")
    case $state in idle | mixed | allocated) return 0 ;; esac
    sleep 0.1
  done
  echo "slurm-cluster: ${NODES[$n]} is ${state:-unknown} after 30 s" >&2
  tail -n 20 "$dir/log/slurmd-${NODES[$n]}.log" >&2 2>/dev/null || true
  return 1
}

cmd_stop() {
  local keep_logs=0
  [ "${1:-}" = --keep-logs ] && { keep_logs=1; shift; }
  local dir=${1:?DIR}
  local f n
  for f in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
    [ -e "$f" ] && stop_pidfile "$f"
  done
  for n in 0 1; do
    kill_namespace "${NS[$n]}"
    ip netns del "${NS[$n]}" 2>/dev/null || true
    rm -rf "/etc/netns/${NS[$n]}"
  done
  # munged runs outside the namespaces; it and any daemon whose pid file was lost are found by
  # this cluster's paths on their command lines.
  local left
  left=$(grep -slzF -e "$dir/" /proc/[0-9]*/cmdline 2>/dev/null | sed -n 's|^/proc/\([0-9]*\)/cmdline$|\1|p' | grep -vx "$$" || true)
  for f in $left; do stop_pid "$f"; done
  if [ -d "$dir" ]; then
    if [ $keep_logs = 1 ]; then
      find "$dir" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
    else
      rm -rf "$dir"
    fi
  fi
  return 0
}

cmd_start() {
  local dir=${1:?DIR}
  local t
  for t in slurmctld slurmd munged sbatch scontrol sinfo ip unshare nsenter; do
    command -v "$t" >/dev/null || skip "$t is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
  done
  [ "$(id -u)" = 0 ] || skip "the nodes' network namespaces need root"
  case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
  # A cluster left by a killed test run: stop it first.
  if ip netns list 2>/dev/null | grep -qw "${NS[0]}" || [ -e "$dir/run" ]; then cmd_stop "$dir"; fi
  mkdir -p "$dir"/{munge,ctld,spool,run,log}
  chmod 755 "$dir/munge"  # clients need to reach the socket
  write_conf "$dir"
  # fail: whatever started is stopped, and the logs say why.
  trap 'echo "slurm-cluster: start failed; logs:" >&2; tail -n 15 "$dir"/log/* >&2 2>/dev/null; cmd_stop --keep-logs "$dir"; exit 1' ERR

  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  # --force: munged refuses a socket folder that root does not own alone, with every ancestor
  # (/tmp's sticky bit included) checked; the key and socket here are this cluster's.
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munge.seed" 2>>"$dir/log/munged.out"

  ip netns add "${NS[0]}"
  ip netns add "${NS[1]}"
  ip link add "${VETH[0]}" type veth peer name "${VETH[1]}"
  local n
  for n in 0 1; do
    ip link set "${VETH[$n]}" netns "${NS[$n]}"
    ip -n "${NS[$n]}" addr add "${ADDRS[$n]}/24" dev "${VETH[$n]}"
    ip -n "${NS[$n]}" link set lo up
    ip -n "${NS[$n]}" link set "${VETH[$n]}" up
    mkdir -p "/etc/netns/${NS[$n]}"
    {
      echo "127.0.0.1 localhost"
      echo "${ADDRS[0]} ${NODES[0]}"
      echo "${ADDRS[1]} ${NODES[1]}"
    } >"/etc/netns/${NS[$n]}/hosts"
  done

  SLURM_CONF=$dir/slurm.conf on_node 0 /usr/sbin/slurmctld -f "$dir/slurm.conf" -i \
    >>"$dir/log/slurmctld.out" 2>&1
  for n in 0 1; do start_slurmd "$dir" "$n"; done
  for n in 0 1; do wait_idle "$dir" "$n"; done
  trap - ERR
  {
    echo "export SLURM_CONF=$dir/slurm.conf"
    echo "export GPURUN_SLURM_CLUSTER_DIR=$dir"
  } >"$dir/env"
  echo "slurm-cluster: ${NODES[*]} up ($(SLURM_CONF=$dir/slurm.conf sinfo --version)); SLURM_CONF=$dir/slurm.conf"
}

cmd_exec() {
  local dir=${1:?DIR}
  shift
  local n=0
  if [ "${1:-}" != -- ]; then n=$1; shift; fi
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || die "exec: no command"
  SLURM_CONF=$dir/slurm.conf in_node_net "$n" "$@"
}

cmd_node_crash() {
  local dir=${1:?DIR} n=${2:?NODE}
  kill_namespace "${NS[$n]}"
  rm -f "$dir/run/slurmd-${NODES[$n]}.pid"
  # On node 0 the crash took slurmctld too: the controller of this test cluster is not the
  # node under test, so it comes back at once.
  if [ "$n" = 0 ]; then
    SLURM_CONF=$dir/slurm.conf on_node 0 /usr/sbin/slurmctld -f "$dir/slurm.conf" \
      >>"$dir/log/slurmctld.out" 2>&1
    sleep 1
  fi
  client "$dir" scontrol update nodename="${NODES[$n]}" state=down reason="node-crash by the test"
}

cmd_node_restart() {
  local dir=${1:?DIR} n=${2:?NODE}
  start_slurmd "$dir" "$n"
  client "$dir" scontrol update nodename="${NODES[$n]}" state=resume 2>/dev/null || true
  wait_idle "$dir" "$n"
}

case ${1:-} in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  exec) shift; cmd_exec "$@" ;;
  node-crash) shift; cmd_node_crash "$@" ;;
  node-restart) shift; cmd_node_restart "$@" ;;
  -h | --help) usage ;;
  *) usage >&2; exit 2 ;;
esac
