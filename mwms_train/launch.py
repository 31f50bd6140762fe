"""Start every MultiWorkerMirroredStrategy worker task, each told the cluster and its index.

    hvdps launch mwms --num_workers 2 [--implementation ring] [trainer flags...]
    hvdps launch mwms --num_workers 4 --hosts h1:2,h2:2 [--rsh AGENT] [--port 2222] [...]

What a TFJob or a batch script does per host, done here per process: every task gets a free
port on --host (loopback by default, and it listens there only) and a TF_CONFIG naming the
whole cluster and its own index. Output lines carry the task's name (``[worker:1]``); the exit
code is worker 0's. A worker that fails or is killed ends the job at once (synchronous
training cannot go on without it), and Ctrl-C, SIGTERM or --run_timeout tear every task down;
the tasks also die with the launcher. The process machinery is the PS launcher's
(tf_cluster/supervise.py: Cluster, supervise).

With --hosts the workers fill the hosts' slots in order (as mpirun places ranks), each started
through the remote shell (ssh, srun's agent under --hosts slurm, or --rsh) with --worker_hosts and
--task_index in its command line, listening on its host's own address at --port and up, and
tethered to its connection (common/launch/tether.py), so the same teardown reaches every host.
"""
import json
import os
import sys
import types

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.spec.config import argv_of, build_parser, from_args
from common.base.errors import UsageError, cli
from common.base.flags import command_line, check_finite
from common.base.procs import child_env, free_ports, loopback_only_env
from tf_cluster.spec import cluster_addresses
from tf_cluster.supervise import Cluster, last_words, refuse_chosen, run_cluster
from mwms_train.backend import add_mwms_args, check_mwms_flags
from common.spec.plugins import plugins_bounded
from common.inputs.data import check_input
from common.model.models import check_plugin
from tf_cluster.listen import bindable, resolve
from common.trainer.run_dir import check_resume_compatible, check_train_dir
from common.launch import remote

LAUNCHER_FLAGS = ("num_workers", "host", "pin_workers", "run_timeout", "hosts", "rsh", "port")
CHOSEN_BY_LAUNCHER = ("worker_hosts", "task_index")


def make_parser():
    """The trainer's own parser plus the launcher's flags: one parse validates everything."""
    p = add_mwms_args(build_parser(__doc__.splitlines()[0], prog="hvdps launch mwms"))
    g = p.add_argument_group("local launcher")
    g.add_argument("--num_workers", type=int, default=2)
    g.add_argument("--host", default="127.0.0.1",
                   help="address every task listens on and is reached at (loopback: nothing else can connect)")
    g.add_argument("--pin_workers", action="store_true",
                   help="pin worker i to core i (equal core budget per worker, for scaling benchmarks)")
    g.add_argument("--run_timeout", type=float, default=0, help="stop everything after this many seconds (0: none)")
    g.add_argument("--hosts", default=None,
                   help="start the workers on these hosts instead: hostfile, h1:2,h2:2 or 'slurm' (the allocation)")
    g.add_argument("--rsh", type=command_line, default=None, help="with --hosts: remote shell called as 'AGENT HOST COMMAND' "
                   "(default: ssh; srun's agent under --hosts slurm)")
    g.add_argument("--port", type=int, default=2222, help="with --hosts: first port on each host (Kubeflow: 2222)")
    return p


def parse_args(argv):
    p = make_parser()
    args = p.parse_args(argv)
    refuse_chosen(args, CHOSEN_BY_LAUNCHER)
    if not 1 <= args.num_workers <= 1024:
        raise UsageError(f"--num_workers must be in [1, 1024], got {args.num_workers}")
    check_finite("run_timeout", args.run_timeout)
    if args.run_timeout < 0:
        raise UsageError(f"--run_timeout must be >= 0, got {args.run_timeout}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1-65535, got {args.port}")
    if not args.hosts and (args.rsh or args.port != 2222):
        raise UsageError("--rsh and --port apply only with --hosts")
    if args.hosts and args.pin_workers:
        raise UsageError("--pin_workers pins cores of this machine; it does not apply with --hosts")
    if args.hosts:                   # every host starts in the repository: paths must not depend on the folder
        args.train_dir = os.path.abspath(args.train_dir)
        args.host_ip = None
    else:
        ip = resolve(args.host)
        if ip is None or not bindable(ip):
            raise UsageError(f"--host {args.host}: " + ("cannot resolve it" if ip is None else
                             f"{ip} is not an address of this machine") + "; the local launcher starts every "
                             "task here (other machines: --hosts)")
        args.host_ip = ip
    check_mwms_flags(args)
    with plugins_bounded(args.run_timeout, "--run_timeout"):   # these checks import and call plug-ins
        cfg = from_args(args)
        check_input(cfg, args.num_workers)
        check_plugin(cfg)
    if args.resume:              # refused here, before a task starts
        check_train_dir(cfg)
        check_resume_compatible(cfg, args.train_dir, types.SimpleNamespace(
            name="mwms", mode="sync", world_size=args.num_workers, tasks={}))
    return args, p


def build_tasks(num_workers, host, ip, python=sys.executable, pin=False):
    """(name, argv, extra env) per worker: a free port each, TF_CONFIG naming the cluster and the
    task, and the bind shim keeping its gRPC server on ``ip``."""
    fmt = f"[{host}]" if ":" in host else host
    cluster = {"worker": [f"{fmt}:{p}" for p in free_ports(num_workers, ip)]}
    listen = dict(loopback_only_env(), HVDPS_BIND_ADDR=ip)
    tasks = []
    for i in range(num_workers):
        env = dict(listen, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}))
        if pin:
            env["HVDPS_PIN_CPU"] = str(i % (os.cpu_count() or 1))
        tasks.append((f"worker:{i}", [python, "-u", "-m", "mwms_train.main"], env))
    return tasks


def build_remote_tasks(args, trainer_argv):
    """(name, argv, extra env) per worker placed on --hosts' slots in order, each started through
    the remote shell with the cluster and its index in its command line."""
    hosts = remote.resolve_hosts(args.hosts)
    placed = [h for h, s in remote.take_slots(hosts, args.num_workers) for _ in range(s)]
    cluster = cluster_addresses({"worker": placed}, args.port)
    agent = remote.rsh_argv(args.rsh, args.hosts)
    tasks = []
    for i, host in enumerate(placed):
        line = remote.remote_command([sys.executable, "-u", "-m", "mwms_train.main",
                                      f"--worker_hosts={','.join(cluster['worker'])}", f"--task_index={i}",
                                      *trainer_argv], tether=True)
        tasks.append((f"worker:{i}", [*agent, host, line], {}))
    return tasks


def remote_task_lines(args, trainer_argv):
    """[(task, argv)] that ``--hosts`` starts through the remote shell (hvdps compare's dry run)."""
    return [(name, argv) for name, argv, _ in build_remote_tasks(args, trainer_argv)]


@cli
def main(argv=None):
    args, parser = parse_args(sys.argv[1:] if argv is None else argv)
    trainer_argv = argv_of(args, parser, skip=LAUNCHER_FLAGS)
    if args.hosts:
        cluster = Cluster(build_remote_tasks(args, trainer_argv), [], env=child_env(), marker="mwms_train")
    else:
        cluster = Cluster(build_tasks(args.num_workers, args.host, args.host_ip, pin=args.pin_workers),
                          trainer_argv, env=child_env(), marker="mwms_train")
    code, ended_by, _ = run_cluster(cluster, sync=True, timeout=args.run_timeout or None, chief_name="worker:0")
    return last_words(cluster, code, ended_by, cluster.errors.get("worker:0") or next(iter(cluster.errors.values()), None))


if __name__ == "__main__":
    sys.exit(main())
