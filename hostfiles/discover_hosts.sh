#!/bin/sh
# Host discovery for elastic Horovod (horovodrun --host-discovery-script): print one
# "host:slots" line per host that may run workers now. Horovod calls it every second;
# edit the file it reads to add or remove slots while a job runs.
#   horovodrun -np 2 --min-np 1 --max-np 4 --host-discovery-script hostfiles/discover_hosts.sh \
#       --network-interface lo python horovod_train/main.py --elastic
exec cat "${HVDPS_HOSTS_FILE:-$(dirname "$0")/elastic_hosts.txt}"
