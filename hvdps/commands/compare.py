"""hvdps compare: train one model several ways (Horovod, TF's all-reduce, bare MPI, local SGD, PS) and report side by side.

    hvdps compare --workers 1,2 --backends horovod,mwms,mpi,localsgd:8,ps --out runs/compare [trainer flags]
    hvdps compare --from runs/compare              # rebuild the report, no training
    hvdps compare --dry_run --workers 1,2,4         # print the exact commands
    hvdps project --from runs/compare/runs ...      # those runs projected to other networks and sizes

    hvdps compare --hosts hostfile --workers 2,4 ...  # across hosts: mpirun -H, PS roles over ssh
    hvdps compare --hosts slurm ...                   # inside a SLURM allocation (srun for PS roles)
    hvdps emulate --hosts 4 --rate 100mbit -- ...     # the same on an emulated cluster (root)

Every run goes through the real launcher (mpirun, hvdps launch ps;
hvdps/launchers.py)
with identical trainer flags, so model, data, seed, per-worker batch, global
batch, learning-rate rule and samples seen are the same; only the distribution
differs. A failed run is recorded with its error and the others still run.

With --hosts, every host is checked first (reachable through the remote
shell, this repository and Python at the same paths, the run directory
shared); the report lists each run's tasks by host and, where the links'
counters can be read (hvdps emulate), the bytes each link carried.
"""
import dataclasses
import os
import shlex
import signal
import sys

from common.spec.config import argv_of, build_parser, from_args
from common.base.flags import check_finite, command_line, interface_or_cidr
from common.spec.memory import TF_PROCESS_BYTES, memory_estimate
from common.inputs.data import check_input
from common.base.errors import UsageError, cli
from common.base.files import take_folder, writable_dir
from common.base.numbers import integer
from common.spec.plugins import plugins_bounded
from common.base.procs import REPO, available_memory, child_env
from hvdps.launchers import Remote
from hvdps.methods import (METHODS, add_task_flags, fewer_tasks, get_launcher, parse_variants,
                           task_flag_dests)
from hvdps.measure.identity import RunId, workload_name
from hvdps.measure.repeats import alternating, merge
from hvdps.measure.jobs import Interrupted, execute, own_signals
from hvdps.measure.plan import plan_run
from hvdps.measure.runs import collect, environment_of, runs_configs, runs_from_dirs, with_scaling
from hvdps.render.report import write_report
from common.launch import remote
from common.formats.schemas import read_links_spec
from hvdps.measure import conditions
from hvdps.measure.cgroups import CpuController
from common.model.models import check_plugin
from common.launch.remote import check_hosts


MAX_LOCAL_WORKERS = 1024      # the local launchers' bound (ps_train.launch, mwms_train.launch)


def parse_workers(text, flag="--workers"):
    try:
        counts = sorted({integer(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"{flag} expects numbers like 1,2,4, got {text!r}")
    if not counts or counts[0] < 1:
        raise UsageError(f"{flag} expects positive numbers, got {text!r}")
    return counts


def make_remote(args):
    """--hosts and its companions -> a Remote (None without --hosts); usage errors up front."""
    if not args.hosts:
        for dest, flag in (("rsh", "--rsh"), ("ps_placement", "--ps_placement"), ("port", "--port"),
                           ("network_interface", "--network_interface")):
            if getattr(args, dest) is not None:
                raise UsageError(f"{flag} applies only with --hosts")
        return None
    port = 2222 if args.port is None else args.port
    if not 0 < port < 65536:
        raise UsageError(f"--port must be 1-65535, got {port}")
    hosts = remote.resolve_hosts(args.hosts)
    agent = remote.rsh_argv(args.rsh, args.hosts)
    network = args.network_interface or remote.mpi_network(hosts)
    return Remote(args.hosts, tuple(hosts), tuple(agent), bool(args.rsh), network, args.ps_placement or "own", port)


@dataclasses.dataclass(frozen=True)
class Shape:
    """One configuration the flags ask for, healthy and run once: its identity (its workers and its
    other tasks by role) and the processes its job starts."""
    identity: RunId
    processes: int


def run_shapes(args):
    """[Shape] of every configuration the flags ask for, in order: what plan_runs makes runs of,
    and what the memory checks (here, hvdps emulate's, hvdps k8s's) count."""
    shapes = []
    workload = workload_name(getattr(args, "model", None), getattr(args, "precision", None),
                             getattr(args, "jit_compile", False))
    for variant in parse_variants(args.backends):
        launcher = get_launcher(variant.method)
        for tasks in launcher.task_choices(args, variant.tasks):
            for n in parse_workers(args.workers):
                identity = RunId(workload, variant.method, variant.mode, n, tasks=tasks, settings=variant.settings)
                shapes.append(Shape(identity, launcher.processes(n, tasks)))
    return shapes


def cluster_conditions(args):
    """The clusters the shapes run on: healthy, then each --straggler factor, then --stall, then each
    --slow_link (hvdps/measure/unhealthy.py). A slow or stalled worker applies to the runs that have
    it (worker 1 is not in a run of one); one that no run has is refused. A slow link applies to
    every run."""
    stragglers = conditions.parse_stragglers(args.straggler) if getattr(args, "straggler", None) else []
    stall = conditions.parse_stall(args.stall) if getattr(args, "stall", None) else None
    links = conditions.parse_slow_links(args.slow_link) if getattr(args, "slow_link", None) else []
    found = conditions.conditions(stragglers, stall, links)
    most = max(parse_workers(args.workers))
    for c in found[1:]:
        if not c.applies_to(most):
            flag = "--stall" if c is stall else "--straggler"
            raise UsageError(f"{flag}: worker {c.rank} is in no run: the largest has {most} worker(s), "
                             f"numbered from 0 (--workers {args.workers})")
    return found


@dataclasses.dataclass(frozen=True)
class Asked:
    """What the flags ask for, parsed once: every configuration (``Shape``) and every cluster it runs
    on (None healthy, then each condition)."""
    shapes: tuple
    conditions: tuple


def asked_of(args):
    return Asked(tuple(run_shapes(args)), tuple(cluster_conditions(args)))


def plan_runs(args, trainer_args, cores, remote=None, asked=None):
    """Every run in the order it goes: each shape on each cluster (healthy, then each slow or stalled
    worker), and with --repeat N all of them N times, the order reversed on every other pass
    (hvdps/measure/repeats.py). ``asked``: the flags' Asked, parsed here if not given."""
    runs = []
    repeats = getattr(args, "repeat", 1)
    asked = asked or asked_of(args)
    shapes = [(shape, c) for shape in asked.shapes for c in asked.conditions
              if c is None or c.applies_to(shape.identity.workers)]
    for k, (shape, condition) in alternating(shapes, repeats):
        identity = dataclasses.replace(shape.identity, condition=condition.label if condition else None,
                                       repeat=k if repeats > 1 else None)
        runs.append(plan_run(identity, condition, os.path.join(args.out, "runs"), trainer_args, cores, remote))
    return runs


def check_memory_fits(args, cfg, available, shapes=None):
    """Refuse runs whose tasks, all on this machine, would not fit in the memory ``available``
    now (None: not known): the largest run's tasks each count TF_PROCESS_BYTES plus the config's
    own estimate (common/spec/config.py: memory_estimate). Runs one after another, so the largest counts."""
    if available is None:
        return
    largest = max(shapes or run_shapes(args), key=lambda shape: shape.processes)
    name, procs = largest.identity.name, largest.processes
    per_task = TF_PROCESS_BYTES + sum(b for _, b, _ in memory_estimate(cfg))
    if procs * per_task > available:
        raise UsageError(f"run {name} starts {procs} TensorFlow tasks on this machine, about "
                         f"{procs * per_task / 2**30:.1f} GiB at {per_task / 2**30:.2f} GiB each; "
                         f"{available / 2**30:.1f} GiB is available: {fewer_tasks()}")


def remote_task_lines(run):
    """What a launcher line across hosts starts on each host: [(task, command line)]."""
    return get_launcher(run.backend).task_lines(list(run.cmd)) if run.roles else []


def load_links(path):
    """The emulated cluster's description (written by hvdps emulate): where its link counters are."""
    return read_links_spec(path)


def dry_run_preamble():
    """The directory and environment every printed line runs with, as lines that set them,
    so the dry run pasted into a shell does what the comparison would do."""
    env = child_env()
    changed = {k: env[k] for k in child_env({})}      # what it sets, whatever this shell has already
    lines = ["# every line below runs in the repository with this environment:", shlex.join(["cd", REPO])]
    if changed:
        lines.append("export " + " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(changed.items())))
    return "\n".join(lines)


def backends_help():
    """Each registered method with its modes and what each is called in the report (the bare name
    runs its default modes, or every mode)."""
    return ", ".join(f"{m.name} ({m.modes_help()}" + (f"; settings {m.settings_help()}" if m.settings_help() else "")
                     + ")" for m in METHODS.values())


def make_parser():
    p = build_parser(__doc__.splitlines()[0], prog="hvdps compare")
    g = p.add_argument_group("comparison")
    g.add_argument("--workers", default="1,2", help="worker counts, e.g. 1,2,4")
    g.add_argument("--backends", default="horovod,ps", help="methods to compare, NAME[:MODE][SETTING=VALUE,...], comma-separated (quote "
                        "the brackets in a shell): "
                        + backends_help())
    add_task_flags(g)                    # each method's own (the parameter servers' count)
    g.add_argument("--run_timeout", type=float, default=900, help="seconds before a run is stopped")
    g.add_argument("--repeat", type=int, default=1,
                   help="runs of each configuration, the methods' order reversed on every other pass (A B C, "
                        "C B A, ...); the table takes the median, and a difference is called real only when the "
                        "runs show it")
    add_cluster_flags(p, "each on its own runs, beside the healthy ones; as root")
    g.add_argument("--dry_run", dest="dry_run", action="store_true", help="print the commands, run nothing")
    g.add_argument("--from", dest="from_dirs", nargs="+", default=None,
                   help="rebuild the report from existing run directories")
    g.add_argument("--no_progress", dest="progress", action="store_false")
    p.set_defaults(train_dir="runs/compare")
    p.bound("run_timeout", positive=True)
    p.bound("repeat", 1, 100)
    return p


def add_cluster_flags(p, unhealthy_note):
    """The flags of the cluster the runs go on: an unhealthy one (``unhealthy_note``: how its runs are
    made), and other hosts; hvdps compare's and hvdps tune's alike."""
    u = p.add_argument_group(f"an unhealthy cluster ({unhealthy_note})")
    u.add_argument("--straggler", default=None,
                   help="RANK:FACTOR[,RANK:FACTOR...]: worker RANK at 1/FACTOR of the CPU each task gets, by the "
                        "kernel's CPU cgroup quota; 1:1,1:2,1:4 runs every shape at each factor")
    u.add_argument("--stall", default=None,
                   help="RANK:EVERY_MS:FOR_MS: worker RANK stopped (SIGSTOP) for FOR_MS every EVERY_MS, as a "
                        "preempted machine")
    u.add_argument("--slow_link", default=None,
                   help="hN=RATE[,hN=RATE...]: under hvdps emulate, host N's link at RATE (tc's syntax) both ways, "
                        "run by run; h3=10mbit,h3=20mbit runs every shape at each rate")
    h = p.add_argument_group("across hosts")
    h.add_argument("--hosts", default=None,
                   help="run on these hosts: a hostfile ('host slots=N' lines), h1:2,h2:2, or 'slurm' (the "
                        "allocation's nodes); MPI ranks fill slots in order, PS roles as --ps_placement says")
    h.add_argument("--rsh", type=command_line, default=None,
                   help="remote shell called as 'AGENT HOST COMMAND' (Open MPI's plm_rsh_agent); default ssh, "
                        "srun inside an allocation")
    h.add_argument("--network_interface", dest="network_interface", type=interface_or_cidr, default=None,
                   help="interface or CIDR MPI's traffic stays on (default: the network that reaches the first host)")
    h.add_argument("--ps_placement", default=None, choices=("own", "beside"),
                   help="PS tasks on hosts of their own (the first hosts) or beside the workers")
    h.add_argument("--port", type=int, default=None, help="first port of the PS tasks on each host (default 2222)")
    h.add_argument("--links", default=None,
                   help="an emulated cluster's description (hvdps emulate writes it): sample its link counters")


COMPARE_FLAGS = (*task_flag_dests(), "workers", "backends", "run_timeout", "repeat", "dry_run", "from_dirs", "progress",
                 "train_dir", "resume", "hosts", "rsh", "network_interface", "ps_placement", "port", "links",
                 "straggler", "stall", "slow_link")


def absolute_paths(args):
    """Paths the user gave relative to their folder, made absolute for runs that start elsewhere."""
    args.train_dir = os.path.abspath(args.train_dir)
    if args.data_dir:
        args.data_dir = os.path.abspath(args.data_dir)
    for flag in ("model", "dataset"):
        target, sep, attr = getattr(args, flag).rpartition(":")
        if sep and (target.endswith(".py") or os.sep in target):
            setattr(args, flag, f"{os.path.abspath(target)}:{attr}")


def check_out(out, from_dirs):
    """--out must be a writable folder that holds no report, unless the report is being rebuilt
    from runs inside it (``--from runs/cmp/runs --out runs/cmp``): checked before anything runs."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} exists and is not a directory")
    writable_dir(out, "--out")
    if not os.path.exists(os.path.join(out, "report.md")):
        return
    if from_dirs and any(os.path.commonpath([out, os.path.abspath(d)]) == out for d in from_dirs):
        return
    raise UsageError(f"--out {out} already holds a report; choose another directory "
                     f"or rebuild it with --from {out}")


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = make_parser()
    args = parser.parse_args(argv)
    absolute_paths(args)             # every run starts in the repository, not in the user's folder
    # the checks below import and call plug-ins, within --run_timeout; called in-process (a test, a
    # notebook), the comparison leaves no deadline behind for the caller's next plug-in
    with plugins_bounded(args.run_timeout, "--run_timeout"):
        return compare(args, parser)


def compare(args, parser):
    """The comparison the parsed flags ask for: checks, the runs (or the runs found with --from), the report."""
    cfg = from_args(args)
    args.out = cfg.train_dir
    asked = validate(args, cfg)
    if not args.dry_run:
        check_out(args.out, args.from_dirs)
        take_folder(args.out, "--out")           # a second comparison into it is refused, the first untouched
    interrupted = None
    if args.from_dirs:
        runs = runs_from_dirs(args.from_dirs)
    else:
        remote = make_remote(args)
        links = load_links(args.links) if args.links else None
        check_plan(args, asked, remote, links)
        runs = plan_runs(args, argv_of(args, parser, skip=COMPARE_FLAGS), os.cpu_count() or 1, remote, asked)
        if args.dry_run:
            print_plan(runs)
            return 0
        if remote:
            check_hosts(remote.hosts, remote.agent, args.out)
        runs, interrupted = run_all(args, runs, links)
    return report(args, cfg, runs, interrupted)


def validate(args, cfg):
    """Every refusal the flags and the data can meet, before --out is taken or any run starts: what the
    flags ask for (Asked; None with --from, which plans nothing)."""
    found = cluster_conditions(args)
    for c in found:                          # --straggler, --stall, --slow_link refused before --out is taken
        if isinstance(c, conditions.SlowLink) and not args.from_dirs:
            conditions.link_of(c, load_links(args.links) if args.links else None)
    check_finite("run_timeout", args.run_timeout)
    if args.run_timeout <= 0:
        raise UsageError(f"--run_timeout must be positive, got {args.run_timeout}")
    if args.resume:
        raise UsageError("--resume does not apply to hvdps compare: it starts fresh runs in --out; continue "
                         "one run with its trainer's command (the first line of runs/<name>.log) and --resume")
    if args.from_dirs:
        return None
    asked = Asked(tuple(run_shapes(args)), tuple(found))
    # a plug-in's training step (Keras 3 under the classic PS)
    check_plugin(cfg, graph_mode=any(get_launcher(s.identity.method).graph_mode for s in asked.shapes))
    for method in dict.fromkeys(s.identity.method for s in asked.shapes):
        get_launcher(method).check(cfg)          # what a method's trainer refuses of the flags (a precision)
    for s in asked.shapes:                       # and of each job at its start (a mode at its worker count)
        get_launcher(s.identity.method).check_job(s.identity)
    for n in sorted({s.identity.workers for s in asked.shapes}, reverse=True):  # the same refusal every run would
        check_input(cfg, n)             # meet, once, before any starts (a dry run too): the most workers first
    if not args.hosts and not args.dry_run:    # every task on this machine
        check_memory_fits(args, cfg, available_memory(), asked.shapes)
    return asked


def check_plan(args, asked, remote, links):
    """What the plan's shape refuses: more tasks than one machine runs, a slowed worker across hosts
    that are not hvdps emulate's."""
    largest = max(asked.shapes, key=lambda shape: shape.processes)   # tasks: workers and PS
    name, most = largest.identity.name, largest.processes
    if not remote and most > MAX_LOCAL_WORKERS:     # before any port is reserved (--hosts: its slots)
        raise UsageError(f"run {name}: {most} tasks, more than the {MAX_LOCAL_WORKERS} one machine runs "
                         f"({fewer_tasks()}; other machines: --hosts)")
    if (args.straggler or args.stall) and remote and not links:
        raise UsageError("--straggler and --stall act on this machine's processes: with --hosts, only on "
                         "hvdps emulate's cluster")


def print_plan(runs):
    """--dry_run: every run's tasks by host, its condition and its exact lines, pasteable."""
    print(dry_run_preamble())
    for run in runs:
        if run.roles:
            print(f"# {run.name}: " + ", ".join(f"{t} on {h}" for t, h in run.roles.items()))
        if run.condition:
            print(f"# {run.name}: {run.condition.describe()}")
        own = [f"{k}={v}" for k, v in sorted(run.env.items())]
        print(shlex.join((["env", *own] if own else []) + list(run.cmd)))
        for task, line in remote_task_lines(run):
            print(f"#   {task}: {line}")


def run_all(args, runs, links):
    """(the runs that ran, the signal that stopped the comparison or None): each in turn, with the
    CPU controller a slowed worker needs found (or refused) before the first starts."""
    controller = None
    if any(isinstance(r.condition, conditions.Straggler) for r in runs):
        controller = CpuController.find()     # refused here, before any run, if it cannot be
        controller.remove_stale()
    previous, ran = own_signals(), []
    try:
        execute(runs, args.run_timeout, ran, progress=args.progress, links=links, controller=controller)
        for s, handler in previous.items():      # nothing of ours runs any more: signals as before
            signal.signal(s, handler)
    except Interrupted as exc:
        return ran, exc
    finally:
        if controller:
            controller.close()
    return ran, None


def report(args, cfg, runs, interrupted):
    """The report of what ran, and the comparison's exit code."""
    every_run = collect(runs, ran=not args.from_dirs)
    rows = with_scaling(merge(every_run))   # a row per configuration: the median over its --repeat runs
    # {workload: config} from the runs' own headers, live or --from alike, so a rebuilt report is the
    # live one; this command's config only where no run of it recorded one (every run failed at start)
    configs = runs_configs(every_run) or ({} if args.from_dirs else {cfg.model: cfg.to_dict()})
    table = write_report(rows, args.out, configs, environment_of(every_run), every_run=every_run)
    print(table)
    print(f"\nreport: {os.path.join(args.out, 'report.md')}")
    if interrupted:
        stopped = [r.name for r in runs if r.outcome and r.outcome.interrupted]
        done = len(runs) - len(stopped)
        print(f"error: {interrupted.name}: " + (f"stopped {stopped[0]}; " if stopped else "") +
              f"the report holds the {done} run(s) that finished", file=sys.stderr)
        return 128 + interrupted.signum
    return 0 if all(r.status == "ok" for r in every_run) else 1


if __name__ == "__main__":
    sys.exit(main())
