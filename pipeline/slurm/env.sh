# Settings shared by every SLURM job of the pipeline (sourced by the sbatch scripts): the one place
# for NCCL settings and for the rendezvous address.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1   # a failed collective raises instead of hanging until the time limit
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Site-specific network choices belong here, e.g.:
# export NCCL_SOCKET_IFNAME=ib0
# export NCCL_IB_HCA=mlx5

# The first node of the allocation hosts the rendezvous. Its NodeAddr, not its name: node names
# need not resolve (they don't for several slurmd "nodes" on one test machine).
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first_node" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
export MASTER_ADDR=${MASTER_ADDR:-$first_node}
export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
