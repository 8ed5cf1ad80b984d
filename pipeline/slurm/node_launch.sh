#!/usr/bin/env bash
# One per node, started by srun: torchrun for this node's PROCS training processes.
# SIGUSR1/SIGTERM reaching this wrapper go to the trainers (torchrun's children), which finish the
# step, checkpoint and exit 0. Usage: node_launch.sh PROCS (SCRIPT | --module MODULE) [ARGS...]
set -uo pipefail
procs=$1; shift
log_dir="${PIPELINE_LOG_DIR:-logs}/job${SLURM_JOB_ID}-restart${SLURM_RESTART_COUNT:-0}-node${SLURM_NODEID:-0}"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  export DS_ACCELERATOR=cpu
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( ${SLURM_CPUS_ON_NODE:-$procs} / procs > 0 ? ${SLURM_CPUS_ON_NODE:-$procs} / procs : 1 ))}
fi
# SLURM signals every process of the step (`scancel --signal`), torchrun included, whose default
# action for SIGUSR1 is to die: start it with SIGUSR1 ignored. The trainers install their own handler.
trap '' USR1
torchrun --nnodes "${SLURM_NNODES:-1}" --node_rank "${SLURM_NODEID:-0}" --nproc_per_node "$procs" \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --log-dir "$log_dir" --redirects 3 --tee 3 "$@" &
launcher=$!
forward() { echo "node ${SLURM_NODEID:-0}: SIG$1 → trainers"; pkill "-$1" -P "$launcher"; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
wait "$launcher"; status=$?
while kill -0 "$launcher" 2>/dev/null; do wait "$launcher"; status=$?; done  # wait returns early on a trap
exit $status
