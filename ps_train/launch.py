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

With --hosts the roles go on those hosts instead (common/remote.py places them
and builds each host's command line): each task is started through the remote
shell (ssh, srun's agent, or --rsh), listens on its host's own address at
--port and up, and is tethered to its connection (common/tether.py), so the
same teardown reaches every host.
"""
import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.config import argv_of
from common.errors import UsageError, cli
from common.files import write_atomic
from common.procs import child_env, free_ports

_PR_SET_PDEATHSIG = 1
CHOSEN_BY_LAUNCHER = ("job_name", "task_index", "ps_hosts", "worker_hosts", "chief_host", "cluster_spec")


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _pump(name, stream, out, lock, errors):
    """Copy one role's output with its name in front; remember its first 'error:' line."""
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        if text.startswith("error:"):
            errors.setdefault(name, text.strip())
        with lock:
            out.write(f"[{name}] {text}")
            out.flush()
    stream.close()


class Cluster:
    """The processes of one local cluster, and their orderly or forced end."""

    def __init__(self, tasks, trainer_args, env=None, out=sys.stdout):
        self.tasks = tasks            # [(name, argv)]
        self.trainer_args = trainer_args
        self.env = env or {}
        self.out = out
        self.lock = threading.Lock()
        self.procs = {}
        self.threads = []
        self.cpu = {}
        self.cpu_series = {}          # PS roles: [[unix time, CPU seconds so far], ...] every SERIES_EVERY s
        self.errors = {}              # role -> its first 'error:' line

    def start(self):
        for name, argv, extra_env in self.tasks:
            env = dict(self.env or child_env(), **extra_env)
            cpus = env.pop("HVDPS_PIN_CPU", None)

            def prepare(cpus=cpus):
                _die_with_parent()
                if cpus is not None:
                    os.sched_setaffinity(0, {int(cpus)})
            # stdin: a pipe only this launcher holds; a remote task's tether ends the task when it closes
            p = subprocess.Popen(argv + self.trainer_args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, env=env, preexec_fn=prepare)
            self.procs[name] = p
            t = threading.Thread(target=_pump, args=(name, p.stdout, self.out, self.lock, self.errors),
                                 daemon=True)
            t.start()
            self.threads.append(t)

    def say(self, text):
        with self.lock:
            self.out.write(f"[launch] {text}\n")
            self.out.flush()

    def stop(self, grace=5.0):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
            if p.stdin:
                try:
                    p.stdin.close()       # a remote task's tether ends it (ssh forwards no signal)
                except OSError:
                    pass
        deadline = time.monotonic() + grace
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self.threads:
            t.join(timeout=2)

    def pids(self):
        return {name: p.pid for name, p in self.procs.items()}

    SERIES_EVERY = 0.5

    def sample_cpu(self):
        """CPU seconds (user+system) each role has used so far; kept after the role exits.

        The PS tasks' samples are also kept as a time series, so the report can take
        their CPU over the trainer's measured interval alone (common.metrics), not over
        the whole process with its start-up and TensorFlow import."""
        tick = os.sysconf("SC_CLK_TCK")
        now = time.time()
        for name, p in self.procs.items():
            try:
                if b"ps_train" not in open(f"/proc/{p.pid}/cmdline", "rb").read():
                    continue            # a remote shell (ssh), not the task: its CPU is not the task's
                fields = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
                self.cpu[name] = (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                continue
            series = self.cpu_series.setdefault(name, []) if name.startswith("ps:") else None
            if series is not None and (not series or now - series[-1][0] >= self.SERIES_EVERY):
                series.append([round(now, 3), self.cpu[name]])


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
    from common import remote
    hosts = remote.resolve_hosts(args.hosts)
    roles = remote.place_ps(hosts, args.num_workers, args.num_ps, args.ps_placement, chief=chief)
    cluster = remote.cluster_addresses(roles, args.port)
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


def describe_exit(name, rc):
    if rc is not None and rc < 0:
        try:
            return f"{name} was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"{name} was killed by signal {-rc}"
    return f"{name} exited with code {rc}"


def supervise(cluster, sync, timeout=None, chief_name="worker:0"):
    """Wait for the chief (worker:0, or chief:0 with TF2's strategy); decide what other roles'
    deaths mean.

    Returns (exit code, what ended the job, the role that ended it).
    """
    chief = cluster.procs[chief_name]
    started = time.monotonic()
    reported = set()
    while True:
        cluster.sample_cpu()
        code = chief.poll()
        if code is not None:
            break
        for name, p in cluster.procs.items():
            rc = p.poll()
            if rc is None or name in reported or name == chief_name:
                continue
            reported.add(name)
            if name.startswith("ps:") and rc == 0:
                cluster.say(f"{name} finished")   # released by the chief; the chief exits next
                continue
            if name.startswith("ps:") or (rc != 0 and sync):
                why = "a PS is gone" if name.startswith("ps:") else "sync training needs every worker"
                cluster.say(f"{describe_exit(name, rc)}; {why}: stopping the cluster")
                return (rc if rc and rc > 0 else 1), describe_exit(name, rc), name
            cluster.say(describe_exit(name, rc) + ("; async training continues without it" if rc else ""))
        if timeout and time.monotonic() - started > timeout:
            cluster.say(f"timed out after {timeout:.0f}s: stopping the cluster")
            return 124, "timeout", None
        time.sleep(0.1)
    # Chief finished: the PS tasks were told to exit, other workers stop at the same global step.
    # A failed chief gets no grace: nothing useful can happen after it.
    deadline = time.monotonic() + (30 if code == 0 else 0)
    while time.monotonic() < deadline and any(p.poll() is None for p in cluster.procs.values()):
        cluster.sample_cpu()
        time.sleep(0.1)
    for name, p in cluster.procs.items():
        if p.poll() is None:
            cluster.say(f"{name} still running after the chief finished: stopping it")
    who = "worker:0 (chief)" if chief_name == "worker:0" else chief_name
    return (code if code >= 0 else 1), describe_exit(who, code), chief_name


def run_cluster(cluster, sync, timeout=None, chief_name="worker:0"):
    """Start ``cluster``, supervise it (``supervise``) and stop every task, also on Ctrl-C or SIGTERM:
    (exit code, what ended the job, the role that ended it). The PS and the MultiWorkerMirrored
    launchers (mwms_train/launch.py) run their tasks through it."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    # Both explicitly: a launcher started in the background by a non-interactive shell inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler of its own.
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        cluster.say("started " + ", ".join(f"{n} (pid {pid})" for n, pid in cluster.pids().items()))
        return supervise(cluster, sync, timeout, chief_name=chief_name)
    except KeyboardInterrupt:
        cluster.say("interrupted: stopping the cluster")
        return 130, "interrupted", None
    finally:
        cluster.stop()
        for s, h in previous.items():
            signal.signal(s, h)


def make_parser():
    """The trainer's own parser plus the launcher's flags: one parse validates everything."""
    from ps_train.main import make_parser as trainer_parser
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
    g.add_argument("--rsh", default=None, help="with --hosts: remote shell called as 'AGENT HOST COMMAND' "
                   "(default: ssh; srun's agent under --hosts slurm)")
    g.add_argument("--ps_placement", default="own", choices=("own", "beside"),
                   help="with --hosts: each PS on a host of its own (own) or on the workers' hosts (beside)")
    g.add_argument("--port", type=int, default=2222, help="with --hosts: first port on each host (Kubeflow: 2222)")
    g.add_argument("--run_timeout", type=float, default=0, help="stop everything after this many seconds (0: none)")
    g.add_argument("--timeout", dest="run_timeout", type=float, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)   # the former name of --run_timeout
    g.add_argument("--max_restarts", type=int, default=0,
                   help="when the job fails (a PS or the chief lost, a sync worker gone), restart every role "
                        "from the latest checkpoint up to this many times (see --checkpoint_steps)")
    return p


LAUNCHER_FLAGS = ("num_ps", "num_workers", "host", "pin_workers", "run_timeout", "max_restarts", "hosts", "rsh",
                  "ps_placement", "port")


def refuse_chosen(args, chosen):
    """A launcher places every task itself: a task's own cluster flags or TF_CONFIG are usage errors."""
    for name in chosen:
        if getattr(args, name) is not None:
            raise UsageError(f"--{name} is chosen by the launcher; do not pass it")
    if os.environ.get("TF_CONFIG", "").strip():
        raise UsageError("TF_CONFIG is set: the launcher chooses the cluster itself; unset it")


MAX_LOCAL_TASKS = 1024


def parse_args(argv):
    """(launcher + trainer args, the parser): the trainer flags validated once, here."""
    from common.config import check_finite, from_args
    from ps_train.cluster import check_ps_flags
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
        from ps_train.listen import bindable, resolve
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
    from common.plugins import bound_plugins
    bound_plugins(args.run_timeout, "--run_timeout")      # the checks below import and call plug-ins
    cfg = from_args(args)
    check_ps_flags(args)
    from common.data import num_examples      # the data checks and the batch, once, before a task starts
    from common.plan import steps_per_epoch
    steps_per_epoch(num_examples(cfg), args.num_workers, cfg.batch_size)
    if args.ps_api == "v1":
        from common.models import check_plugin_for_graph_mode
        check_plugin_for_graph_mode(cfg)         # a Keras 3 plug-in: refused before a task starts
    if args.resume:              # refused here, before a task starts or launch.json is written
        from common.training import check_resume_compatible, check_train_dir
        v2 = args.ps_api == "v2"
        job = types.SimpleNamespace(name="ps2" if v2 else "ps", mode="sync" if args.sync and not v2 else "async",
                                    world_size=args.num_workers, num_ps=args.num_ps)
        check_train_dir(cfg)
        check_resume_compatible(cfg, args.train_dir, job)
    return args, p


def run_once(args, trainer_argv):
    """One cluster from start to end: (exit code, what ended it, the Cluster)."""
    v2 = args.ps_api == "v2"                 # TF2's strategy: a separate chief coordinates
    if args.hosts:
        tasks, _ = build_remote_tasks(args, trainer_argv, chief=v2)
        cluster = Cluster(tasks, [], env=child_env())
    else:
        cluster = Cluster(build_tasks(args.num_ps, args.num_workers, args.host, pin=args.pin_workers, chief=v2),
                          trainer_argv, env=child_env())
    code, ended_by, role = run_cluster(cluster, args.sync, args.run_timeout or None,
                                       chief_name="chief:0" if v2 else "worker:0")
    cluster.say("cpu seconds: " + ", ".join(f"{n} {c:.1f}" for n, c in sorted(cluster.cpu.items())))
    cluster.ended_by_role = role
    return code, ended_by, cluster


def checkpoint_step(train_dir):
    """Global step of the latest checkpoint, from TensorFlow's 'checkpoint' index (no TF import)."""
    from common.schemas import read_checkpoint_index
    path = os.path.join(train_dir, "checkpoints", "checkpoint")
    latest = read_checkpoint_index(path) if os.path.lexists(path) else None
    tail = latest.rsplit("-", 1)[-1] if latest else ""
    return int(tail) if tail.isdigit() else None


def last_logged_step(train_dir):
    from common.metrics import read_records
    path = os.path.join(train_dir, "metrics.jsonl")
    steps = [r["global_step"] for r in read_records(path) if r["type"] == "step"] if os.path.exists(path) else []
    return steps[-1] if steps else 0


def exact_resume_points(train_dir, restarts):
    """Where each restart really resumed: the restarted chief's header says (async, the checkpoint's
    name can trail the global step it holds by an update that was in flight)."""
    from common.metrics import read_records
    path = os.path.join(train_dir, "metrics.jsonl")
    headers = [r for r in read_records(path) if r["type"] == "header"] if os.path.exists(path) else []
    if len(headers) <= len(restarts):
        return                          # a restart that died before writing its header: keep the estimate
    for restart, header in zip(restarts, headers[len(headers) - len(restarts):]):
        restart["resumed_from"] = header.get("start_step", restart["resumed_from"])
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


def last_words(cluster, code, ended_by, why):
    """What a user reads last: what ended the job, then, if a task said why, its own ``error:`` line
    passed through whole on stderr (not wrapped in the launcher's line), as if the task were run alone."""
    cluster.say(f"exit code {code} ({ended_by})")
    if why and code not in (0, 130):
        print(why, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
