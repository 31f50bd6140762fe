#!/bin/sh
# Remote-shell agent for hvdps inside a SLURM allocation, with ssh's calling convention
# (`agent [options] HOST COMMAND`, as Open MPI's plm_rsh_agent): runs COMMAND as one task
# on node HOST of the current allocation. hvdps compare --hosts slurm uses it for PS roles;
# --overlap lets it share the node with the steps already running there.
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
exec srun --nodes=1 --ntasks=1 --overlap --kill-on-bad-exit=1 -w "$host" /bin/sh -c "$*"
