#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the preemption test (tests/sweeps/test_slurm_preemption.py)
# and for trying strategy=slurm by hand. Run as root:
#   scripts/slurm_test_cluster.sh          # install (apt), write /etc/slurm/slurm.conf, start munged, slurmctld, slurmd
#   scripts/slurm_test_cluster.sh stop     # stop the three daemons
# The node is this host with its CPUs and memory, one partition "debug" (the default). No
# cgroups (containers seldom allow them): proctrack/linuxproc, task/none. No accounting
# database: sacct answers nothing, so submitit learns that a job ended from its result file.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm

stop() {
    for daemon in slurmd slurmctld munged; do
        for pid in $(pgrep -x "$daemon" || true); do kill "$pid"; done
    done
}

if [[ "${1:-start}" == stop ]]; then
    stop
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "slurm_test_cluster.sh: run as root (it installs packages and starts daemons)" >&2
    exit 2
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge
fi

host=$(hostname -s)
cpus=$(nproc)
memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))   # leave the OS half a GiB
mkdir -p /etc/slurm "$STATE" "$SPOOL" "$LOGS" /run/munge
cat > "$CONF" <<EOF
ClusterName=foxhunt-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
KillWait=30
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$host CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

stop
sleep 1
chown munge:munge /run/munge
[[ -s /etc/munge/munge.key ]] || { mungekey --create 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; }
chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key
su -s /bin/sh munge -c "munged --force"
slurmctld
slurmd
for _ in $(seq 30); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then
        sinfo
        exit 0
    fi
    sleep 1
done
echo "slurm_test_cluster.sh: the node did not come up idle; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
sinfo >&2 || true
exit 1
