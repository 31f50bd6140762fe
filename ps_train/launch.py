"""Start a whole parameter-server cluster on this machine, for development and tests.

    hvdps launch ps --num_ps 2 --num_workers 2 [--sync] [trainer flags...]
    hvdps launch ps --max_restarts 3 --checkpoint_steps 100 [...]   # recover by itself
    hvdps launch ps --ps_api v2 [...]     # TF2's ParameterServerStrategy, plus a chief task
    hvdps launch ps --hosts h1,h2,h3 [--rsh AGENT] [--ps_placement own|beside] [...]

Every role gets a free port on --host (loopback by default, and each task
listens there only); each role's output lines are prefixed with its name
(``[ps:0]``, ``[worker:1]``); the exit code is the chief's. On exit, Ctrl-C,
SIGTERM, or a role failing, every process is torn down: the children also die
with the launcher (PDEATHSIG), so nothing is orphaned. With --max_restarts, a
failed job is started again from its latest checkpoint, as a TFJob's OnFailure
restart policy would, and launch.json records what each restart lost.

With --hosts the roles go on those hosts instead (ps_train/placement.py places them,
common/launch/remote.py builds each host's command line): each task is started through the remote
shell (ssh, srun's agent, or --rsh), listens on its host's own address at
--port and up, and is tethered to its connection (common/launch/tether.py), so the
same teardown reaches every host.
"""
import json
import os
import sys
import types

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.spec.config import argv_of, from_args
from common.base.errors import UsageError, cli
from common.base.flags import command_line, check_finite
from common.base.files import write_atomic
from common.base.procs import child_env, free_ports
from tf_cluster.spec import cluster_addresses
from tf_cluster.supervise import Cluster, last_words, refuse_chosen, run_cluster
from common.launch import remote
from ps_train.main import make_parser as trainer_parser
from ps_train.cluster import check_aggregation, check_ps_flags, mode_name
from ps_train.placement import place_ps
from common.spec.plugins import plugins_bounded
from common.inputs.data import check_input
from common.model.models import check_plugin
from tf_cluster.listen import bindable, resolve
from common.trainer.run_dir import check_resume_compatible, check_train_dir
from common.formats.schemas import read_checkpoint_index
from common.trainer.metrics import read_metrics
from common.base.numbers import whole

CHOSEN_BY_LAUNCHER = ("job_name", "task_index", "ps_hosts", "worker_hosts", "chief_host", "cluster_spec")


def build_tasks(num_ps, num_workers, host, python=sys.executable, pin=False, chief=False):
    """(name, argv, extra env) per role, each on a free port of ``host``; ``chief``: a separate
    chief task too (TF2's coordinator), started last."""
    ports = free_ports(num_ps + num_workers + int(chief), host)
    fmt = f"[{host}]" if ":" in host else host
    ps_hosts = ",".join(f"{fmt}:{p}" for p in ports[:num_ps])
    worker_hosts = ",".join(f"{fmt}:{p}" for p in ports[num_ps:num_ps + num_workers])
    hosts = [f"--ps_hosts={ps_hosts}", f"--worker_hosts={worker_hosts}"]
    if chief:
        hosts.append(f"--chief_host={fmt}:{ports[-1]}")
    tasks = []
    for job, count in (("ps", num_ps), ("worker", num_workers), ("chief", int(chief))):
        for i in range(count):
            argv = [python, "-u", "-m", "ps_train.main", f"--job_name={job}", f"--task_index={i}", *hosts]
            env = {}
            if pin and job == "worker":   # one core per worker; PS tasks float (their CPU is reported)
                env["HVDPS_PIN_CPU"] = str(i % (os.cpu_count() or 1))
            tasks.append((f"{job}:{i}", argv, env))
    return tasks


def build_remote_tasks(args, trainer_argv, chief=False):
    """(name, argv, extra env) per role placed on --hosts, each started through the remote shell
    with the trainer's flags in its command line; and the cluster ({role: [host:port]})."""
    hosts = remote.resolve_hosts(args.hosts)
    roles = place_ps(hosts, args.num_workers, args.num_ps, args.ps_placement, chief=chief)
    cluster = cluster_addresses(roles, args.port)
    agent = remote.rsh_argv(args.rsh, args.hosts)
    flags = [f"--ps_hosts={','.join(cluster['ps'])}", f"--worker_hosts={','.join(cluster['worker'])}"]
    if chief:
        flags.append(f"--chief_host={cluster['chief'][0]}")
    tasks = []
    for job in ("ps", "worker", "chief"):
        for i, host in enumerate(roles.get(job, [])):
            line = remote.remote_command([sys.executable, "-u", "-m", "ps_train.main", f"--job_name={job}", f"--task_index={i}",
                                          *flags, *trainer_argv], tether=True)
            tasks.append((f"{job}:{i}", [*agent, host, line], {}))
    return tasks, cluster


def make_parser():
    """The trainer's own parser plus the launcher's flags: one parse validates everything."""
    p = trainer_parser()
    p.prog = "hvdps launch ps"
    p.description = __doc__.splitlines()[0]
    g = p.add_argument_group("local launcher")
    g.add_argument("--num_ps", type=int, default=1)
    g.add_argument("--num_workers", type=int, default=2)
    g.add_argument("--host", default="127.0.0.1",
                   help="address every task listens on and is reached at (loopback: nothing else can connect)")
    g.add_argument("--pin_workers", action="store_true",
                   help="pin worker i to core i (equal core budget per worker, for scaling benchmarks)")
    g.add_argument("--hosts", default=None,
                   help="start the roles on these hosts instead: hostfile, h1:2,h2:2 or 'slurm' (the allocation)")
    g.add_argument("--rsh", type=command_line, default=None, help="with --hosts: remote shell called as 'AGENT HOST COMMAND' "
                   "(default: ssh; srun's agent under --hosts slurm)")
    g.add_argument("--ps_placement", default="own", choices=("own", "beside"),
                   help="with --hosts: each PS on a host of its own (own) or on the workers' hosts (beside)")
    g.add_argument("--port", type=int, default=2222, help="with --hosts: first port on each host (Kubeflow: 2222)")
    g.add_argument("--run_timeout", type=float, default=0, help="stop everything after this many seconds (0: none)")
    g.add_argument("--max_restarts", type=int, default=0,
                   help="when the job fails (a PS or the chief lost, a sync worker gone), restart every role "
                        "from the latest checkpoint up to this many times (see --checkpoint_steps)")
    return p


def remote_task_lines(args, trainer_argv):
    """[(task, argv)] that ``--hosts`` starts through the remote shell (hvdps compare's dry run)."""
    tasks, _ = build_remote_tasks(args, trainer_argv, chief=args.ps_api == "v2")
    return [(name, argv) for name, argv, _ in tasks]


LAUNCHER_FLAGS = ("num_ps", "num_workers", "host", "pin_workers", "run_timeout", "max_restarts", "hosts", "rsh",
                  "ps_placement", "port")


MAX_LOCAL_TASKS = 1024


def parse_args(argv):
    """(launcher + trainer args, the parser): the trainer flags validated once, here."""
    p = make_parser()
    args = p.parse_args(argv)
    refuse_chosen(args, CHOSEN_BY_LAUNCHER)
    if args.num_ps < 1 or args.num_workers < 1:
        raise UsageError("--num_ps and --num_workers must be at least 1")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1-65535, got {args.port}")
    if not args.hosts and (args.rsh or args.ps_placement != "own" or args.port != 2222):
        raise UsageError("--rsh, --ps_placement and --port apply only with --hosts")
    if args.hosts and args.pin_workers:
        raise UsageError("--pin_workers pins cores of this machine; it does not apply with --hosts")
    if args.hosts:                   # every host starts in the repository: paths must not depend on the folder
        args.train_dir = os.path.abspath(args.train_dir)
    else:                            # every task starts here and listens on --host
        ip = resolve(args.host)
        if ip is None or not bindable(ip):
            raise UsageError(f"--host {args.host}: " + ("cannot resolve it" if ip is None else
                             f"{ip} is not an address of this machine") +
                             "; the local launcher starts every task here (other machines: --hosts)")
    if args.max_restarts < 0:
        raise UsageError(f"--max_restarts must be >= 0, got {args.max_restarts}")
    check_finite("run_timeout", args.run_timeout)
    if args.run_timeout < 0:
        raise UsageError(f"--run_timeout must be >= 0, got {args.run_timeout}")
    if not args.hosts and args.num_ps + args.num_workers > MAX_LOCAL_TASKS:
        raise UsageError(f"--num_ps {args.num_ps} and --num_workers {args.num_workers}: {args.num_ps + args.num_workers} "
                         f"tasks on this machine, more than the {MAX_LOCAL_TASKS} the local launcher starts "
                         f"(a port, a process and a TensorFlow runtime each); other machines: --hosts")
    with plugins_bounded(args.run_timeout, "--run_timeout"):   # these checks import and call plug-ins
        cfg = from_args(args)
        check_ps_flags(args)
        if args.sync and args.ps_api == "v1":
            check_aggregation(args.num_workers, args.backup_workers, args.replicas_to_aggregate)
        check_input(cfg, args.num_workers)
        check_plugin(cfg, graph_mode=args.ps_api == "v1")
    if args.resume:              # refused here, before a task starts or launch.json is written
        v2 = args.ps_api == "v2"
        job = types.SimpleNamespace(name="ps2" if v2 else "ps", mode=mode_name(args.sync and not v2, args.backup_workers),
                                    world_size=args.num_workers, tasks={"ps": args.num_ps})
        check_train_dir(cfg)
        check_resume_compatible(cfg, args.train_dir, job)
    return args, p


def run_once(args, trainer_argv):
    """One cluster from start to end: (exit code, what ended it, the Cluster)."""
    v2 = args.ps_api == "v2"                 # TF2's strategy: a separate chief coordinates
    if args.hosts:
        tasks, _ = build_remote_tasks(args, trainer_argv, chief=v2)
        cluster = Cluster(tasks, [], env=child_env(), marker="ps_train")
    else:
        cluster = Cluster(build_tasks(args.num_ps, args.num_workers, args.host, pin=args.pin_workers, chief=v2),
                          trainer_argv, env=child_env(), marker="ps_train")
    code, ended_by, role = run_cluster(cluster, args.sync, args.run_timeout or None,
                                       chief_name="chief:0" if v2 else "worker:0")
    cluster.say("cpu seconds: " + ", ".join(f"{n} {c:.1f}" for n, c in sorted(cluster.cpu.items())))
    cluster.ended_by_role = role
    return code, ended_by, cluster


def checkpoint_step(train_dir):
    """Global step of the latest checkpoint, from TensorFlow's 'checkpoint' index (no TF import)."""
    path = os.path.join(train_dir, "checkpoints", "checkpoint")
    latest = read_checkpoint_index(path) if os.path.lexists(path) else None
    tail = latest.rsplit("-", 1)[-1] if latest else ""
    return whole(tail)


def last_logged_step(train_dir):
    path = os.path.join(train_dir, "metrics.jsonl")
    steps = [r.global_step for r in read_metrics(path) if r.type == "step"] if os.path.exists(path) else []
    return steps[-1] if steps else 0


def exact_resume_points(train_dir, restarts):
    """Where each restart really resumed: the restarted chief's header says (async, the checkpoint's
    name can trail the global step it holds by an update that was in flight)."""
    path = os.path.join(train_dir, "metrics.jsonl")
    headers = [r for r in read_metrics(path) if r.type == "header"] if os.path.exists(path) else []
    if len(headers) <= len(restarts):
        return                          # a restart that died before writing its header: keep the estimate
    for restart, header in zip(restarts, headers[len(headers) - len(restarts):]):
        if "start_step" in header.model_fields_set:
            restart["resumed_from"] = header.start_step
        restart["lost_updates"] = max(0, restart["last_logged_update"] - restart["resumed_from"])


@cli
def main(argv=None):
    args, parser = parse_args(sys.argv[1:] if argv is None else argv)
    restarts = []
    while True:
        code, ended_by, cluster = run_once(args, argv_of(args, parser, skip=LAUNCHER_FLAGS))
        # Restart like a TFJob's OnFailure policy: not after success, a usage error or Ctrl-C.
        if code in (0, 2, 130) or len(restarts) >= args.max_restarts:
            break
        resumed_from = checkpoint_step(args.train_dir)
        if resumed_from is None:
            cluster.say(f"{ended_by}; no checkpoint in {args.train_dir} to restart from")
            break
        last = last_logged_step(args.train_dir)
        lost = max(0, last - resumed_from)
        restarts.append({"after": ended_by, "exit_code": code, "resumed_from": resumed_from,
                         "last_logged_update": last, "lost_updates": lost})
        cluster.say(f"restart {len(restarts)}/{args.max_restarts} after {ended_by}: resuming from the checkpoint "
                    f"at update {resumed_from}; {lost} logged update(s) since then are lost")
        args.resume = True
    exact_resume_points(args.train_dir, restarts)
    if os.path.isdir(args.train_dir) and (code != 2 or restarts):   # the PS tasks' cost belongs in the results
        # too; not after a refusal (exit 2), which must leave an earlier run's files as they were
        path = os.path.join(args.train_dir, "launch.json")
        write_atomic(path, json.dumps({"cpu_seconds": cluster.cpu, "cpu_series": cluster.cpu_series,
                                       "exit_code": code, "ended_by": ended_by, "restarts": restarts,
                                       "pids": cluster.pids()}, indent=2))
    return last_words(cluster, code, ended_by, cluster.errors.get(cluster.ended_by_role))


if __name__ == "__main__":
    sys.exit(main())
