#!/bin/bash
# Stand up a real SLURM cluster on this machine for the tests (after shared/recipes/local-slurm):
# Debian's slurm packages, munge with a private key, slurmctld and NODES slurmd "nodes" n1..nN,
# all on 127.0.0.1, without systemd. Needs root. Usage: BASE=/tmp/x NODES=2 setup.sh
set -euo pipefail
BASE=${BASE:-/tmp/pipeline-slurm}
NODES=${NODES:-2}
PORT_BASE=${PORT_BASE:-16817}
H=$(hostname)
bash "$(dirname "${BASH_SOURCE[0]}")/install.sh"  # a no-op under the tests, which check first
mkdir -p $BASE/{etc,state,spool,log,run,munge/key}
chmod 755 $BASE/munge; chmod 700 $BASE/munge/key
[ -f $BASE/munge/key/munge.key ] || { dd if=/dev/urandom of=$BASE/munge/key/munge.key bs=1024 count=1 2>/dev/null; chmod 400 $BASE/munge/key/munge.key; }
munged --key-file=$BASE/munge/key/munge.key --socket=$BASE/munge/munge.socket \
       --pid-file=$BASE/munge/munged.pid --log-file=$BASE/log/munged.log --seed-file=$BASE/munge/key/seed
HW=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //; s/UpTime=.*//')
{
cat <<CONF
ClusterName=pipeline
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmctldPort=$PORT_BASE
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/munge/munge.socket,cred_expire=10
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool/%n
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd-%n.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# a requeued job, or one whose dependency is met, starts within a second (not at the next 30 s backfill pass)
SchedulerParameters=bf_interval=1,sched_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
MinJobAge=3600
CONF
for i in $(seq 1 $NODES); do
  echo "NodeName=n$i NodeHostname=$H NodeAddr=127.0.0.1 Port=$((PORT_BASE + i)) $HW State=UNKNOWN"
done
echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
} > $BASE/etc/slurm.conf
export SLURM_CONF=$BASE/etc/slurm.conf
slurmctld
for i in $(seq 1 $NODES); do mkdir -p $BASE/spool/n$i; slurmd -N n$i; done
for i in $(seq 120); do [ "$(sinfo -h -o %T 2>/dev/null | grep -c idle)" -ge 1 ] && \
  [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c idle)" = "$NODES" ] && break; sleep 0.25; done
sinfo -N
