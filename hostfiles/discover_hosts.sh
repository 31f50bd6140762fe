#!/bin/sh
# Host discovery for elastic Horovod (horovodrun --host-discovery-script): print one
# "host:slots" line per host that may run workers now. Horovod calls it every second;
# edit the file it reads to add or remove slots while a job runs.
#   horovodrun -np 4 --min-np 2 --max-np 8 --host-discovery-script hostfiles/discover_hosts.sh \
#       --network-interface eth0 python horovod_train/main.py --elastic
exec cat "${HVDPS_HOSTS_FILE:-$(dirname "$0")/elastic_hosts.txt}"
