"""An unhealthy cluster on purpose: one slow worker (``--straggler R:F``), one stalled worker
(``--stall R:EVERY:FOR``) or, on hvdps emulate's cluster, one host's slow link (``--slow_link hN=RATE``),
applied to a running job from the launcher's side, the same for every method.

Synchronous methods (the ring all-reduces, MWMS, sync PS) wait for their slowest worker at every
step; asynchronous PS does not. To measure that, worker ``R`` of a job is made slow by the kernel,
not by a sleep in hvdps's loop:

- **slow**: the worker's processes go into a CPU cgroup of their own whose quota is 1/F of the CPU
  each of the job's tasks gets when they share this machine evenly (cores / tasks, at most one
  core). cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` where the ``cpu`` controller is
  mounted writable, else cgroup v2's ``cpu.max``; where neither can be written, the flag is refused.
- **stalled**: the worker's processes get SIGSTOP for FOR ms every EVERY ms, then SIGCONT, as a
  preempted VM or a swapping machine would stop it.

- **a slow link**: host N's link, both directions, at RATE by the token bucket that shapes it
  (``tc qdisc change ... tbf``, hvdps/measure/cluster.py: ``shape_link``) for the run, and back to
  the cluster's rate after it. Run by run, so each slow-link run sits beside its healthy twin in the
  alternating order as a slow worker's does, not on a cluster of its own built at another time.

Which process is worker R is the method's own answer (``Launcher.worker_of``: an MPI rank's
launcher environment, a TensorFlow task's TF_CONFIG or ``--job_name``/``--task_index``); the
process tree below the job is watched while it runs, so ranks that start late are caught too.
Every group is removed and every stopped process continued when the run ends, fails or is
interrupted; groups that a killed comparison left are removed at the next start.

This module acts on a running job (``Injector``, ``LinkShaper``); the conditions are parsed in
hvdps/measure/conditions.py, and the CPU controller is hvdps/measure/cgroups.py.
"""
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from common.base.errors import RunError
from hvdps.measure.cgroups import GROUP_PREFIX, CpuController, quota_us
from hvdps.measure.cluster import shape_link
from hvdps.measure import reaper
from hvdps.measure.conditions import Stall, Straggler, link_of
from common.base.numbers import whole

POLL_S = 0.1                      # how often the job's process tree is looked at for new workers


# ------------------------------------------------------------------ the job's process tree
def descendants(root_pid, proc="/proc"):
    """Every live process below ``root_pid`` (itself included), from each process's parent in
    /proc/<pid>/stat."""
    children = {}
    for entry in os.listdir(proc):
        if whole(entry) is None:
            continue
        try:
            stat = open(os.path.join(proc, entry, "stat")).read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def process_identity(pid, proc="/proc"):
    """(environment, argv) of a process, or None once it has gone or cannot be read."""
    try:
        env_raw = open(os.path.join(proc, str(pid), "environ"), "rb").read()
        argv_raw = open(os.path.join(proc, str(pid), "cmdline"), "rb").read()
    except OSError:
        return None
    env = {}
    for item in env_raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env, [a.decode(errors="replace") for a in argv_raw.split(b"\0") if a]


# The stops a run's record lists one by one (an hour of a 1 s period; past it only their count
# and total): compare_run.json stays a small file whatever the run's length.
MAX_STOPS = 4000


@dataclass
class Applied:
    """What was done to a run: written beside it (compare_run.json's ``unhealthy``)."""
    condition: str
    what: str
    rank: Optional[int] = None
    factor: Optional[float] = None
    quota_us: Optional[int] = None
    period_us: Optional[int] = None
    controller: Optional[str] = None
    every_ms: Optional[float] = None
    for_ms: Optional[float] = None
    pids: list = field(default_factory=list)
    stops: int = 0
    stopped_s: float = 0.0
    # each stop as (SIGSTOP, SIGCONT) in Unix time: what the projection's held-out check counts of the
    # stall inside a run's measured interval, wherever that falls in the period (None: past MAX_STOPS)
    stopped_at: Optional[list] = field(default_factory=list)
    first_applied_s: Optional[float] = None     # seconds from launch to the worker being slowed or stalled
    link: Optional[str] = None                  # a slow link: the host's port (h3), its name in the links'
    host: Optional[str] = None                  # records (address or SLURM node) and the rate it ran at
    rate: Optional[str] = None
    rate_bps: Optional[float] = None

    def to_dict(self):
        return {k: v for k, v in self.__dict__.items() if v is not None}


class Injector:
    """While a job runs: once it is ``ready`` (training has begun), find worker ``condition.rank``'s
    processes below ``job_pid`` (by ``worker_of(environ, argv)``) and keep them slow or stalled; on
    exit, continue every process it stopped and remove its group. A context manager, entered once
    the job has started.

    From training's start, not the launch: a worker slowed while it imports TensorFlow (4-6 CPU s)
    joins the job late, which every method meets as start-up; what differs between the methods is
    how they train with a slow worker, so that is what the throughput and time to target measure."""

    def __init__(self, condition, job_pid, worker_of, cores, tasks, name, controller=None, ready=None):
        self.condition, self.job_pid, self.worker_of = condition, job_pid, worker_of
        self.ready = ready or (lambda: True)
        self.started = time.monotonic()
        self.seen, self.pids = set(), []
        self.lock, self.done = threading.Lock(), threading.Event()
        self.applied = Applied(condition.label, condition.describe(), condition.rank)
        self.group = None
        self.controller = controller
        if isinstance(condition, Straggler):
            self.controller = controller or CpuController.find()
            q, period = quota_us(condition.factor, cores, tasks)
            self.group = self.controller.create(f"{GROUP_PREFIX}{os.getpid()}-{name}", q, period)
            reaper.tell(group=self.group, root=self.controller.root)   # removed even if this process is killed
            self.applied.factor, self.applied.quota_us, self.applied.period_us = condition.factor, q, period
            self.applied.controller = f"cgroup v{self.controller.version}"
        else:
            self.applied.every_ms, self.applied.for_ms = condition.every_ms, condition.for_ms
        self.threads = [threading.Thread(target=self._watch, daemon=True)]
        if isinstance(condition, Stall):
            self.threads.append(threading.Thread(target=self._stall, daemon=True))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def _watch(self):
        while not self.done.is_set() and not self.ready():
            self.done.wait(POLL_S)
        while not self.done.is_set():
            try:
                tree = descendants(self.job_pid)
            except OSError:
                tree = []
            for pid in tree:
                if pid in self.seen:
                    continue
                who = process_identity(pid)
                if who is None:
                    continue
                self.seen.add(pid)
                if self.worker_of(*who) != self.condition.rank:
                    continue
                if self.group and not self.controller.add(self.group, pid):
                    continue
                with self.lock:
                    self.pids.append(pid)
                    self.applied.pids.append(pid)
                    if self.applied.first_applied_s is None:
                        self.applied.first_applied_s = round(time.monotonic() - self.started, 3)
            self.done.wait(POLL_S)

    def _signal(self, sig):
        with self.lock:
            for pid in self.pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def _stall(self):
        stall = self.condition
        while not self.done.wait((stall.every_ms - stall.for_ms) / 1000):
            with self.lock:
                found = bool(self.pids)
            if not found:
                continue
            t0, wall = time.monotonic(), time.time()
            self._signal(signal.SIGSTOP)
            self.done.wait(stall.for_ms / 1000)
            self._signal(signal.SIGCONT)
            self.applied.stops += 1
            self.applied.stopped_s = round(self.applied.stopped_s + time.monotonic() - t0, 3)
            if self.applied.stopped_at is not None:
                self.applied.stopped_at.append([round(wall, 4), round(time.time(), 4)])
                if len(self.applied.stopped_at) > MAX_STOPS:
                    self.applied.stopped_at = None       # a record of bounded size: the count and total stay

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join(timeout=5)
        self._signal(signal.SIGCONT)         # nothing stays stopped, whatever ended the run
        if self.group and self.controller.remove(self.group):
            reaper.tell(group_removed=self.group)
        return False


class LinkShaper:
    """While a job runs: host ``condition.port``'s link at ``condition.rate``, both directions; on
    exit, back at the cluster's rate for that host. A context manager like ``Injector``, with the
    same ``applied`` record. From the launch, not from training's start: a link is the host's, the
    same for a job's start-up as for its steps, and the start-up's few small messages do not fill it.

    ``links``: hvdps emulate's cluster description (common/formats/schemas.py: LinksSpec), which
    names each host's namespace, the switch's, and the queue every link was shaped with."""

    def __init__(self, condition, links):
        self.condition = condition
        self.host_ns, self.switch, self.queue_ms, self.key, self.normal = link_of(condition, links)
        self.applied = Applied(condition.label, condition.describe(), link=condition.port, host=self.key,
                               rate=condition.rate, rate_bps=condition.rate_bps, stopped_at=None)
        self.shaped = False

    def __enter__(self):
        try:
            shape_link(self.host_ns, self.switch, self.condition.port, self.condition.rate, self.queue_ms, "change")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            raise RunError(f"--slow_link {self.condition.port}={self.condition.rate}: tc refused it: {exc}")
        self.shaped = True
        reaper.tell(link=self.key, normal=[self.host_ns, self.switch, self.condition.port, f"{int(self.normal)}bit",
                                           self.queue_ms, "change"])      # set back even if this process is killed
        self.applied.first_applied_s = 0.0
        return self

    def __exit__(self, *exc):
        if self.shaped:
            try:
                shape_link(self.host_ns, self.switch, self.condition.port, f"{int(self.normal)}bit",
                           self.queue_ms, "change")
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
                raise RunError(f"could not set {self.condition.port}'s link back to {self.normal / 1e6:g} Mbit/s "
                               f"({err}); the runs after this one would be on the slow link")
            reaper.tell(link_restored=self.key)
        return False


