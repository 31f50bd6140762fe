"""How to start a whole job of each method, on this machine or on --hosts.

The comparison and the benchmarks start every run through these, with the
real launchers (``mpirun`` for Horovod and bare MPI, ``python -m ps_train.launch`` for PS),
so what they measure is what a user's launch line does. Which launcher a method
name starts is the method registry's (hvdps/methods.py: ``get_launcher``); these
classes know how to launch, not what they are called.

Given ``remote`` (a ``Remote``: hosts, remote shell, network), the same
launchers start the job across hosts: ``mpirun -H`` with Open MPI's own
remote launch for Horovod and bare MPI, ``ps_train.launch --hosts`` for PS.
"""
import importlib
import os
import shlex
import shutil
import sys
from dataclasses import dataclass

from common.trainer.backend import check_jit
from common.base.flags import counts
from common.base.procs import REPO, launcher_rank, loopback_only_env
from common.launch.remote import take_slots
from common.spec.config import argv_of
from tf_cluster.spec import task_of

# Local Horovod runs: ranks talk over shared memory, Open MPI's out-of-band
# channel over loopback only; mpirun's PMIx tool listener ignores every
# interface setting, so the bind shim (HorovodLauncher.env) keeps it on loopback.
# --oversubscribe: Open MPI gives a machine as many slots as it has physical cores and refuses more
# ranks than that; hvdps runs them and marks the run oversubscribed in the report instead.
LOCAL_MPI_FLAGS = ("--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo", "--oversubscribe")


@dataclass(frozen=True)
class Remote:
    """Where a job runs when it is not this machine (hvdps compare --hosts)."""
    hosts_text: str           # as the user gave it: hostfile, h1:2,h2:2 or 'slurm'
    hosts: tuple              # ((host, slots), ...)
    agent: tuple              # remote shell argv, called as AGENT HOST COMMAND
    rsh_given: bool           # False: Open MPI's own default (ssh) or SLURM's launcher
    network: str              # CIDR or interface name MPI's traffic is kept on
    placement: str = "own"    # PS tasks on hosts of their own, or beside the workers
    port: int = 2222


# Across hosts: TCP on the named network only (shared memory between ranks on one host), and
# Open MPI's ring all-reduce, the algorithm whose per-link bytes 2(n-1)/n*M the report checks
# (Open MPI's tuned default switches algorithm by message size and rank count). rtc_hwloc_vmhole none:
# orted skips sharing its hwloc topology through a fixed-address shared-memory segment, which
# crashes orted (SIGSEGV in hwloc_shmem_topology_write) when it cannot map that address.
# btl_tcp_links 4: four TCP connections per pair of ranks. With one, a pair's two directions share a
# socket and the 2-rank ring moves half the link's rate each way (benchmarks/emulated_bandwidth.py:
# 0.48x of a shaped link with 1, 0.94x with 4; 3 ranks, whose left and right peers differ, 0.90x either way).
# mpi_preconnect_mpi 1: every pair's connections opened at MPI_Init. Open MPI opens a pair's links when
# they are first used; when the first traffic is MPI_Comm_dup's small messages (Horovod duplicates
# COMM_WORLD in hvd.init), later large messages between those two ranks use one link only: a 2-rank
# Horovod ring then moved 0.48-0.65x of the link's rate, 0.91-0.93x with this flag
# (BENCHMARKS.md section 10). Its cost is the connections to every rank at start-up, not only the
# ring's neighbours: (n-1) x 4 sockets per rank.
# btl_tcp_eager_limit 4 MB: the ring's blocks (the gradient's bytes / ranks) go without a handshake up to
# 4 MB. Above the limit (64 kB by default) ob1 sends a first fragment and the rest only once the receiver
# has answered; on a slow link that answer queues behind the data coming the other way, and a ring of
# four on a 10 Mbit/s link kept 0.73-0.79 of the link's pace under 64 kB, 0.85-0.94 under 4 MB, and the
# healthy ring of four ran 1.04-1.26x faster (BENCHMARKS.md section 15). Its cost: a message that
# arrives before its receive is posted is buffered whole, up to the limit. OMPI_MCA_btl_tcp_eager_limit
# in the environment is the user's choice and is left to reach every rank (a --mca flag would override it).
EAGER_LIMIT = 4 * 1024 * 1024


def remote_mpi_flags(remote, environ=os.environ):
    net = remote.network
    flags = ["--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", net,
             "--mca", "oob_tcp_if_include", net, "--mca", "rtc_hwloc_vmhole", "none",
             "--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4",
             "--mca", "btl_tcp_links", "4", "--mca", "mpi_preconnect_mpi", "1"]
    if "OMPI_MCA_btl_tcp_eager_limit" not in environ:
        flags += ["--mca", "btl_tcp_eager_limit", str(EAGER_LIMIT)]
    if remote.rsh_given:
        flags += ["--mca", "plm_rsh_agent", " ".join(remote.agent)]
    return flags


@dataclass(frozen=True)
class PodPlan:
    """What a job's pods run on Kubernetes (hvdps k8s, hvdps/k8s/manifests.py). ``kind``: "JobSet",
    one pod per TensorFlow task, each replicated job a role (``tasks``: {role: count}), every pod
    running ``argv`` and taking its TF_CONFIG from the pod (tf_cluster/jobset.py), the job ending
    when the pods of ``ends`` have; or "MPIJob", a launcher pod running ``argv`` (mpirun, the
    operator's hostfile) against ``tasks["worker"]`` worker pods."""
    kind: str
    tasks: dict
    argv: tuple
    ends: str = "worker"


@dataclass(frozen=True)
class TaskFlag:
    """A flag of a method's own that sizes one role of its jobs' tasks besides the workers (the parameter
    servers' count, ps_train/method.py): hvdps compare and hvdps k8s take it (``--DEST 1,2`` runs each count), and the
    method's launcher is told the chosen counts as ``tasks``. Methods that share a flag declare it alike."""
    dest: str
    role: str
    label: str                   # what the report calls its tasks: "2 PS"
    help: str
    default: str = "1"


class Launcher:
    graph_mode = False           # trains TF1 graphs: no Keras 3 plug-in (common/spec/keras3.py)
    trainer_flags = ()           # what the method's trainer is told besides the user's flags (hvdps train)
    task_flags = ()              # TaskFlag: the roles besides the workers whose counts the flags choose
    coordinators = 0             # processes every job starts besides its workers and those tasks (a chief)

    def __init__(self, mpi_yield=False):
        # mpi_yield_when_idle: a rank waiting in MPI yields its core instead of spinning on it
        # (MPI launchers only; the benchmarks ask every launcher alike).
        self.mpi_yield = mpi_yield

    def task_choices(self, args, given=None):
        """Every ``tasks`` the parsed flags ask this method's runs to start besides the workers, each
        ((role, count), ...) in ``task_flags`` order: one () for a method that starts workers only
        (hvdps/measure/identity.py: RunId.tasks). ``given``: the counts a --backends entry sets
        (a PS entry's task count), which stand for the flag's of the same role."""
        fixed = dict(given or ())
        choices = [()]
        for flag in self.task_flags:
            counts = [fixed[flag.role]] if flag.role in fixed else getattr(args, flag.dest)
            choices = [(*c, (flag.role, n)) for c in choices for n in counts]
        return choices

    def default_tasks(self):
        """The tasks a job starts when no flag chooses them: each task flag's first default count."""
        return tuple((flag.role, counts(flag.default)[0]) for flag in self.task_flags)

    def processes(self, workers, tasks):
        """The processes a job of ``workers`` workers and ``tasks`` starts."""
        return workers + sum(n for _, n in tasks) + self.coordinators

    def roles(self, hosts, workers, tasks, placement):
        """{task: host} of a job across ``hosts`` ([(host, slots)]), as the report names them:
        one rank per slot, in host order (mpirun's ``-H``, the task launchers' workers). A method
        whose tasks have roles places them itself (ps_train's PSLauncher)."""
        ranks = [h for h, s in take_slots(hosts, workers) for _ in range(s)]
        return {f"rank:{i}": h for i, h in enumerate(ranks)}

    def env(self, remote=None):
        """Extra environment the command needs (on top of common.base.procs.child_env)."""
        return {}

    def worker_of(self, environ, argv):
        """Which worker (rank) of a job of this launcher's a process is, from its environment and
        command line; None for any other process (a launcher, a server task, a shell): what a slow or
        stalled worker is applied to (hvdps/measure/unhealthy.py)."""
        raise NotImplementedError

    def command(self, workers, trainer_argv, mode=None, tasks=(), pin_cores=False, python=sys.executable,
                remote=None):
        """argv that starts ``workers`` training processes with ``trainer_argv``, and the ``tasks``
        besides them ((role, count), ...: ``task_choices``).

        ``pin_cores``: one core per worker and one TensorFlow thread each, for
        scaling benchmarks where every worker must get the same CPU budget.
        ``remote``: start them on those hosts instead of this machine.
        """
        raise NotImplementedError

    def check(self, cfg):
        """Refuse (a UsageError) what this method's trainer would refuse of the shared training flags
        ``cfg`` at its start, before any task of a comparison starts (a precision it cannot take, or
        ``--jit_compile`` where its ``jit_refusal`` says why not). A method with checks of its own
        calls this too."""
        check_jit(cfg, self)

    def jit_refusal(self):
        """Why this method's trainer refuses ``--jit_compile`` (its backend's ``jit_refusal``), None
        where it takes it."""
        return None

    def check_job(self, run):
        """Refuse (a UsageError) what this method's trainer would refuse of one planned job ``run`` (a
        RunId: its mode at its worker count) at its start, so that the plan, a dry run and the
        manifests refuse it first."""

    def task_lines(self, cmd):
        """[(task, command line)] that ``cmd`` (this launcher's, across hosts) starts on each host,
        for the dry run; [] where one launcher line starts everything (mpirun)."""
        return []

    def mode_argv(self, mode):
        """The trainer flags a mode stands for (a PS job's --sync, local SGD's --local_steps K)."""
        return []

    def pods(self, workers, trainer_argv, mode=None, tasks=()):
        """The job as Kubernetes runs it (a PodPlan): what each pod runs, from the image's folder."""
        raise NotImplementedError

    def launch_entry(self, name):
        """(module whose main starts a whole job of method ``name``, the argv it is given before the
        user's): ``hvdps launch NAME``."""
        raise NotImplementedError


class MPIRunLauncher(Launcher):
    """One ``mpirun`` line that starts every rank of a trainer (``main``: its package and script), on
    this machine (loopback, shared memory) or across ``remote``'s hosts with Open MPI's own remote
    launch. ``dense_mode``: the mode whose ranks all-reduce embedding tables whole."""
    main = None                  # (package, script), set by the method package's launcher
    dense_mode = None

    def launch_entry(self, name):
        return "hvdps.commands.launch", [name]      # this launcher's own mpirun line, run in place

    def env(self, remote=None):
        return {} if remote else loopback_only_env()   # across hosts MPI binds the network it is given

    def worker_of(self, environ, argv):
        return launcher_rank(environ, default=None)      # the rank mpirun (or srun) gave the process

    def command(self, workers, trainer_argv, mode=None, tasks=(), pin_cores=False, python=sys.executable,
                remote=None):
        bind = ["-bind-to", "core", "-map-by", "core"] if pin_cores else ["-bind-to", "none", "-map-by", "slot"]
        threads = ["--threads_per_worker", "1"] if pin_cores else []
        extra = ["--mca", "mpi_yield_when_idle", "1"] if self.mpi_yield else []
        if remote:
            hosts = ",".join(f"{h}:{s}" for h, s in take_slots(remote.hosts, workers))
            where = ["-H", hosts, *remote_mpi_flags(remote)]
        else:
            where = list(LOCAL_MPI_FLAGS)
        return self._mpirun(workers, [*bind, *where, *extra], python, os.path.join(REPO, *self.main),
                            [*threads, *self.mode_argv(mode), *trainer_argv])

    def mode_argv(self, mode):
        """The trainer flags a mode stands for: the dense mode's own flag (Horovod's --sparse_as_dense)."""
        return [f"--{mode}"] if mode is not None and mode == self.dense_mode else []

    def _mpirun(self, workers, flags, python, main, argv, exported=("PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")):
        mpirun = shutil.which("mpirun") or "mpirun"
        return [mpirun, "-np", str(workers), *flags, *(a for name in exported for a in ("-x", name)),
                python, main, *argv]

    def pods(self, workers, trainer_argv, mode=None, tasks=()):
        """An MPIJob: the launcher pod's mpirun over the workers the operator lists in its hostfile,
        one slot each, from the image's folder; root inside the image, as the operator's own
        examples run."""
        argv = self._mpirun(workers, ["-bind-to", "none", "-map-by", "slot"], "python", "/".join(self.main),
                            [*self.mode_argv(mode), *trainer_argv],
                            exported=("PATH", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"))
        return PodPlan("MPIJob", {"worker": workers}, ("mpirun", *argv[1:]))


class TaskLauncher(Launcher):
    """A method's own local launcher (``python -m <package>.launch``), which starts one task per
    role here or through the remote shell on ``--hosts``. ``module``: that launcher; ``placement``:
    it takes ``--ps_placement``; ``extra``: flags every job of the method passes."""
    module = None
    placement = False

    def launch_entry(self, name):
        return self.module, list(self.trainer_flags)  # the method's own launch module

    def launcher_argv(self, workers, mode, tasks):
        """The launcher's own flags for a job of ``workers`` workers and ``tasks``."""
        return ["--num_workers", str(workers)]

    def command(self, workers, trainer_argv, mode=None, tasks=(), pin_cores=False, python=sys.executable,
                remote=None):
        pin = ["--pin_workers", "--threads_per_worker", "1"] if pin_cores else []
        where = []
        if remote:
            where = ["--hosts", remote.hosts_text]
            if self.placement:
                where += ["--ps_placement", remote.placement]
            where += ["--port", str(remote.port)]
            if remote.rsh_given:
                where += ["--rsh", shlex.join(remote.agent)]
        return [python, "-u", "-m", self.module, *self.launcher_argv(workers, mode, tasks), *pin, *where,
                *trainer_argv]

    def tf_tasks(self, workers, tasks):
        """{TensorFlow role: tasks} of a job: its ``tasks`` by role, then the workers."""
        return {**dict(tasks), "worker": workers}

    ends = "worker"              # the role whose tasks end the job (TF2's PS: its coordinator, the chief)

    def pods(self, workers, trainer_argv, mode=None, tasks=()):
        """A JobSet: one pod per task, every pod the method's trainer with the flags every task of
        the job gets (they differ only in the task, which each pod takes from its JobSet's variables:
        tf_cluster/jobset.py), checked by the trainer's own parser. The local launcher's checks
        (this machine's data, ports and task count) are not the cluster's, so it is not asked."""
        package = self.module.rsplit(".", 1)[0]
        parser = importlib.import_module(f"{package}.main").make_parser()
        args = parser.parse_args([*self.trainer_flags, *self.mode_argv(mode), *trainer_argv])
        main = package.replace(".", "/") + "/main.py"
        return PodPlan("JobSet", self.tf_tasks(workers, tasks), ("python", main, *argv_of(args, parser)), self.ends)

    def worker_of(self, environ, argv):
        task = task_of(environ, argv)                    # TensorFlow's task: TF_CONFIG or its flags
        return task[1] if task and task[0] == "worker" else None

    def task_lines(self, cmd):
        """The launcher's --hosts starts each task through the remote shell: one line per task."""
        launch = importlib.import_module(self.module)
        args, parser = launch.parse_args(cmd[4:])
        return [(name, shlex.join(argv)) for name, argv in
                launch.remote_task_lines(args, argv_of(args, parser, skip=launch.LAUNCHER_FLAGS))]
