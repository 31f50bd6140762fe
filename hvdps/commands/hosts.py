"""hvdps hosts: one inventory (a hostfile) -> every format the launchers want.

    hvdps hosts hostfiles/hostfile.example                  # all formats
    hvdps hosts inventory --format horovodrun               # horovodrun -np N -H h1:4,h2:4
    hvdps hosts inventory --format tf-config --tasks ps=2   # one TF_CONFIG per task

Parsing and validation live in common/launch/hosts.py (the trainers use them too);
this is only the command.
"""
import json
import sys

from common.base.flags import Parser, usage_type
from common.base.errors import UsageError, cli
from common.launch.hosts import parse_hostfile, to_horovod_hosts, to_mpi_hostfile
from tf_cluster.spec import role_counts, tf_configs, to_cluster_spec


@cli
def main(argv=None):
    p = Parser(prog="hvdps hosts", description=__doc__.splitlines()[0])
    p.add_argument("inventory", help="hostfile: one 'host slots=N' per line")
    p.add_argument("--format", default="all",
                   choices=("all", "horovodrun", "mpi-hostfile", "cluster-spec", "tf-config"))
    p.add_argument("--tasks", type=usage_type(role_counts), default="ps=1,chief=1",
                   help="ROLE=N,...: the cluster's tasks besides its workers, on the first slots in this order; "
                        "ps=2 is the classic layout (worker 0 acts as chief)")
    p.add_argument("--port", type=int, default=2222, help="first port of the PS cluster (Kubeflow uses 2222)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 < args.port < 65536:
        raise UsageError("--port must be in 1..65535")
    hosts = parse_hostfile(args.inventory)
    cluster = to_cluster_spec(hosts, args.tasks, args.port)
    parts = {
        "horovodrun": f"horovodrun -np {sum(s for _, s in hosts)} -H {to_horovod_hosts(hosts)}\n",
        "mpi-hostfile": to_mpi_hostfile(hosts),
        "cluster-spec": json.dumps({"cluster": cluster}, indent=2) + "\n",
        "tf-config": "".join(f"# {r}:{i}\nTF_CONFIG='{c}'\n" for r, i, c in tf_configs(cluster)),
    }
    for name, text in parts.items():
        if args.format in ("all", name):
            if args.format == "all":
                sys.stdout.write(f"## {name}\n")
            sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
