#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine (Debian/Ubuntu, as root), for the `slurm` test tier
# and for a developer who wants to try `hydra/launcher=slurm_cpu`. Idempotent: a cluster that is
# already up is left alone; missing packages, config, key or daemons are added. Exits non-zero, with
# the daemons' log tails, when SLURM does not come up (CI treats that as a failure).
#
#   sudo bash .ci/slurm-up.sh            # then: sinfo; python -m pytest -q tests/slurm
#
# Debian's slurm-wlm 22.05 + munge, no accounting daemon (sacct is unavailable; submitit copes as
# long as every job writes its result, see README "Running a sweep on SLURM").
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by spec-decode-bench .ci/slurm-up.sh"
LOGDIR=/var/log/slurm
t0=$(date +%s)

say() { echo "slurm-up: $*" >&2; }
die() {
  say "ERROR: $*"
  for f in "$LOGDIR/slurmctld.log" "$LOGDIR/slurmd.log" /var/log/munge/munged.log; do
    [ -f "$f" ] && { echo "--- tail $f" >&2; tail -n 20 "$f" >&2; }
  done
  exit 1
}
running() { pgrep -x "$1" >/dev/null 2>&1; }
node_ready() {
  # The controller answers and the node takes jobs.
  scontrol ping 2>/dev/null | grep -q "is UP" || return 1
  sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)$'
}

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts munged, slurmctld, slurmd)"

if command -v sbatch >/dev/null && node_ready && grep -qF "$MARK" "$CONF" 2>/dev/null; then
  say "already up ($(sinfo -h -N -o '%N %c CPUs %m MB %T' | head -1))"
  exit 0
fi

# 1. Packages (only when missing: a developer's machine is not updated behind their back).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
   || ! command -v munged >/dev/null; then
  say "installing slurmctld slurmd slurm-client munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed"
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
    || die "apt-get install failed"
fi

# 2. munge: a random key owned by munge (Debian's package usually creates one).
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key

# 3. slurm.conf for this machine (CPUs and memory as slurmd detects them). A slurm.conf that this
# script did not write is never overwritten.
if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
  die "$CONF exists and was not written by this script; not touching it (start your cluster yourself)"
fi
host=$(hostname -s)
getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >>/etc/hosts
node_line=$(slurmd -C | head -1)   # NodeName=<host> CPUs=N Boards=.. SocketsPerBoard=.. ... RealMemory=M
mem_mb=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
# Leave 1 GiB to the OS so a job asking for the whole node is refused instead of swapping.
node_line=${node_line/RealMemory=$mem_mb/RealMemory=$((mem_mb > 2048 ? mem_mb - 1024 : mem_mb))}
install -d -m 0755 /etc/slurm
install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld /var/lib/slurm/slurmd "$LOGDIR"
new_conf=$(cat <<EOF
$MARK
ClusterName=specdecode
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
# No cgroups (containers rarely allow them; 22.05 has no CgroupPlugin=disabled): processes are tracked
# through their parent chain, which finds a job's servers too (they are its descendants).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Each CPU and MB is a schedulable unit, so small CPU jobs (cpus_per_task=1) run side by side.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
# No slurmdbd: no accounting, no sacct.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
# scancel / time limit: SIGTERM, then SIGKILL after KillWait s (SLURM's default is 30; the runner
# stops its server within a second of SIGTERM, and a short wait keeps the CI tier fast).
KillWait=10
# A node that was down (e.g. slurmd restarted) takes jobs again by itself.
ReturnToService=2
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
$node_line State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
if [ "$(cat "$CONF" 2>/dev/null)" != "$new_conf" ]; then
  printf '%s\n' "$new_conf" >"$CONF"
  changed=1
else
  changed=0
fi

# 4. Daemons (started directly: CI containers have no systemd).
if ! running munged; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged || die "munged did not start"
fi
for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge does not work (munge -n | unmunge)"

if [ "$changed" = 1 ] && { running slurmctld || running slurmd; }; then
  say "config changed: reconfiguring"
  scontrol reconfigure >/dev/null 2>&1 || true
fi
if ! running slurmctld; then
  say "starting slurmctld"
  /usr/sbin/slurmctld || die "slurmctld did not start"
fi
if ! running slurmd; then
  say "starting slurmd"
  /usr/sbin/slurmd || die "slurmd did not start"
fi

# 5. Wait until the node takes jobs (resume it if it came up drained/down from an earlier run).
for i in $(seq 60); do
  node_ready && break
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
  case "$state" in
    down*|drain*|fail*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
node_ready || die "the node did not become ready in 60 s (state: $(sinfo -h -N -o '%T %E' 2>&1 | head -1))"

# 6. One real job through sbatch.
out=$(mktemp)
if ! timeout 60 sbatch --wait --quiet -o "$out" --wrap 'echo ok from $SLURM_JOB_ID' >/dev/null 2>&1 \
   || ! grep -q "^ok from" "$out"; then
  rm -f "$out"
  die "a trivial sbatch job did not run"
fi
rm -f "$out"
say "up in $(( $(date +%s) - t0 )) s: $(sinfo -h -N -o '%N %c CPUs %m MB %T' | head -1)"
