#!/bin/bash
# Remote-shell agent for the emulated cluster (hvdps-emulate), with ssh's calling convention
# (`agent [-flags] HOST COMMAND...`, as Open MPI's plm_rsh_agent): runs COMMAND inside the
# network namespace that owns HOST's address (HVDPS_NETNS_MAP="10.x.y.1=ns1,10.x.y.2=ns2"),
# the way ssh runs it on a real host. `exec` all the way down, so the pid the caller holds
# becomes the command's own.
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
for pair in ${HVDPS_NETNS_MAP//,/ }; do
  if [ "${pair%%=*}" = "$host" ]; then
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "netns_agent: no emulated host $host (HVDPS_NETNS_MAP)" >&2
exit 255
