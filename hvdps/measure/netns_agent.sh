#!/bin/bash
# Remote-shell agent for the emulated cluster (hvdps emulate), with ssh's calling convention
# (`agent [-flags] HOST COMMAND...`, as Open MPI's plm_rsh_agent): runs COMMAND inside the
# network namespace that owns HOST's address (HVDPS_NETNS_MAP="10.x.y.1=ns1,10.x.y.2=ns2"),
# the way ssh runs it on a real host. `exec` all the way down, so the pid the caller holds
# becomes the command's own.
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
for pair in ${HVDPS_NETNS_MAP//,/ }; do
  if [ "${pair%%=*}" = "$host" ]; then
    ns=${pair#*=}
    # A /tmp of its own for Open MPI's session directories, as a real host has: the emulated hosts
    # share this machine's /tmp and hostname, so one host's daemon removing its empty directories
    # could pull them from under another's ("mkdir ... No such file or directory" at orte_init).
    mkdir -p "/tmp/hvdps-ompi/$ns" && export OMPI_MCA_orte_tmpdir_base="/tmp/hvdps-ompi/$ns"
    exec ip netns exec "$ns" /bin/sh -c "$*"
  fi
done
echo "netns_agent: no emulated host $host (HVDPS_NETNS_MAP)" >&2
exit 255
