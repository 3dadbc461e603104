#!/usr/bin/env bash
# A one-host Slurm cluster for the `slurm`-marked tests: Debian's slurm-wlm + munge, daemons started directly
# (no systemd), no cgroup plugins. Idempotent: does nothing when the daemons already answer.
# Exit codes: 0 = the cluster answers `sinfo`; 3 = the packages cannot be installed here (tests skip, saying so);
# anything else = set-up failed (tests fail).
set -u
export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "cannot install slurm-wlm and munge: needs root and apt-get" >&2; exit 3
    fi
    (apt-get install -y -q slurm-wlm munge >/tmp/llmfoundry-slurm-apt.log 2>&1 ||
        { apt-get update -q >>/tmp/llmfoundry-slurm-apt.log 2>&1 &&
          apt-get install -y -q slurm-wlm munge >>/tmp/llmfoundry-slurm-apt.log 2>&1; }) ||
        { echo "cannot install slurm-wlm and munge (see /tmp/llmfoundry-slurm-apt.log)" >&2; exit 3; }
fi
set -e
case "$(sinfo -h -o %t 2>/dev/null | head -1)" in idle|mix|alloc) exit 0;; esac

HOST=$(hostname -s)
CPUS=$(nproc)
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge /etc/slurm /var/spool/slurmctld /var/spool/slurmd \
         /var/log/slurm
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key; chmod 0755 /run/munge
if ! pgrep -x munged >/dev/null; then runuser -u munge -- /usr/sbin/munged; fi

cat > /etc/slurm/slurm.conf <<CONF
ClusterName=llmfoundry-test
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
KillWait=20
MinJobAge=600
JobRequeue=1
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} State=UNKNOWN
PartitionName=cpu Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
if ! pgrep -x slurmctld >/dev/null; then /usr/sbin/slurmctld -c; fi
if ! pgrep -x slurmd >/dev/null; then /usr/sbin/slurmd; fi
for _ in $(seq 60); do
    state=$(sinfo -h -o %t 2>/dev/null | head -1)
    case "$state" in idle|mix|alloc) exit 0;; down*|drain*) scontrol update NodeName="$HOST" State=RESUME || true;; esac
    sleep 1
done
echo "Slurm did not come up; see /var/log/slurm/*.log" >&2
exit 1
