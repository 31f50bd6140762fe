#!/bin/bash
# Open MPI rsh agent for test "hosts" that are network namespaces on this machine:
# called as `agent [ssh options] HOST COMMAND...`, it runs COMMAND inside the
# namespace that owns HOST's address (HVDPS_NETNS_MAP="10.x.y.1=ns1,10.x.y.2=ns2"),
# the way ssh would run it on a real host.
while [[ "$1" == -* ]]; do shift; done
host=$1; shift
for pair in ${HVDPS_NETNS_MAP//,/ }; do
  if [ "${pair%%=*}" = "$host" ]; then
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "rsh_agent: no namespace for host $host" >&2
exit 255
