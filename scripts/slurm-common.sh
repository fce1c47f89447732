# Sourced by scripts/services.sh (the single-node test cluster) and scripts/slurm-multinode.sh (the
# multi-node one): what both Slurm instances share, so a policy changed for one is changed for both.

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Prints the slurm.conf lines both test clusters share: munge, no cgroup plugin anywhere (so no
# cgroup.conf is needed), no accounting, backfill with short intervals (tests wait on jobs, so
# pending jobs must be looked at often), cores and memory as consumable resources, fake GPUs.
#   $1  DefMemPerCPU in MB: without a default, CR_Core_Memory gives a job the whole node's memory
#       and jobs run one at a time
#   $2  KillWait in seconds (SIGTERM → SIGKILL at a job's end)
slurm_conf_policy() {
  cat <<CONF
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2,sched_min_interval=100000
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$1
ReturnToService=2
KillWait=$2
MinJobAge=300
InactiveLimit=0
Waittime=0
GresTypes=gpu
CONF
}
