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
"""
import errno
import glob
import math
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Tuple

from common.base.errors import RunError, UsageError
from common.base.procs import exists
from hvdps.measure.cluster import parse_rate, shape_link

# CFS bandwidth control runs a group for its quota, then holds it to the period's end: with the default
# 100 ms period a worker at 1/4 runs 25 ms and stops 75 ms, a stall more than a slow CPU. 10 ms keeps
# that to a few steps of a small model; longer only where the quota would fall below the kernel's 1 ms.
PERIOD_US = 10_000
MIN_QUOTA_US = 1_000
GROUP_PREFIX = "hvdps-"           # hvdps-<comparison pid>-<run>: who made it, so a stale one can go
PRIVATE_MOUNT = "/run/hvdps-cgroup-cpu-"   # + pid: where a comparison in a namespace mounts the cpu hierarchy
POLL_S = 0.1                      # how often the job's process tree is looked at for new workers
MAX_FACTOR = 1000.0
MAX_MS = 3_600_000


class OnWorker:
    """A condition of worker ``rank``: only the runs that have that worker run with it."""

    def applies_to(self, workers):
        return self.rank < workers


@dataclass(frozen=True)
class Straggler(OnWorker):
    """Worker ``rank`` at 1/``factor`` of the CPU the others get (1: healthy)."""
    rank: int
    factor: float

    @property
    def label(self):
        return f"slow{self.rank}x{self.factor:g}"

    def describe(self):
        return f"worker {self.rank} at 1/{self.factor:g} CPU"


@dataclass(frozen=True)
class Stall(OnWorker):
    """Worker ``rank`` stopped for ``for_ms`` every ``every_ms``."""
    rank: int
    every_ms: float
    for_ms: float

    @property
    def label(self):
        return f"stall{self.rank}-{self.every_ms:g}-{self.for_ms:g}"

    def describe(self):
        return f"worker {self.rank} stopped {self.for_ms:g} ms every {self.every_ms:g} ms"


@dataclass(frozen=True)
class SlowLink:
    """Host ``port``'s (h1, h2, ...) link at ``rate`` (tc's syntax) in both directions."""
    port: str
    rate: str

    rank = None                     # a host's, not a worker's: every run has it

    @property
    def label(self):
        return f"link-{self.port}-{self.rate}"

    @property
    def rate_bps(self):
        return parse_rate(self.rate)

    def describe(self):
        return f"{self.port}'s link at {self.rate_bps / 1e6:g} Mbit/s"

    def applies_to(self, workers):
        return True


def _number(text, flag, what, lo, hi, whole=False):
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        raise UsageError(f"{flag}: {what} must be a{' whole' if whole else ''} number, got {text!r}")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise UsageError(f"{flag}: {what} must be in [{lo:g}, {hi:g}], got {text!r}")
    return value


def parse_stragglers(text):
    """``R:F[,R:F...]`` -> [Straggler], in order, without repeats; F >= 1 (1 is a healthy run)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        rank, sep, factor = part.partition(":")
        if not sep or not rank.strip() or not factor.strip():
            raise UsageError(f"--straggler expects RANK:FACTOR like 1:4 (worker 1 at a quarter of the CPU), got {part!r}")
        s = Straggler(_number(rank.strip(), "--straggler", "the rank", 0, 1 << 20, whole=True),
                      _number(factor.strip(), "--straggler", "the slowdown factor", 1, MAX_FACTOR))
        if s not in out:
            out.append(s)
    return out


def parse_stall(text):
    """``R:EVERY:FOR`` (milliseconds) -> Stall; 0 < FOR < EVERY."""
    parts = [p.strip() for p in str(text).split(":")]
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"--stall expects RANK:EVERY_MS:FOR_MS like 1:2000:500, got {text!r}")
    rank = _number(parts[0], "--stall", "the rank", 0, 1 << 20, whole=True)
    every = _number(parts[1], "--stall", "EVERY_MS", 1, MAX_MS)
    stop = _number(parts[2], "--stall", "FOR_MS", 1, MAX_MS)
    if stop >= every:
        raise UsageError(f"--stall: FOR_MS ({stop:g}) must be shorter than EVERY_MS ({every:g})")
    return Stall(rank, every, stop)


def parse_slow_links(text):
    """``hN=RATE[,hN=RATE...]`` -> [SlowLink], in order, without repeats: each a run of every shape
    with host N's link at RATE (one slow link at a time; several rates draw a curve)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        host, sep, rate = part.partition("=")
        m = re.fullmatch(r"h([1-9]\d{0,2})", host.strip())
        if not sep or not m or not rate.strip():
            raise UsageError(f"--slow_link expects hN=RATE like h3=10mbit (host 3's link at 10 Mbit/s), got {part!r}")
        parse_rate(rate.strip(), "--slow_link")
        link = SlowLink(f"h{int(m.group(1))}", rate.strip().lower())
        if link not in out:
            out.append(link)
    return out


def conditions(stragglers=None, stall=None, slow_links=None):
    """Every cluster a comparison runs each shape on: healthy first (None), then each straggler
    factor (F = 1 is the healthy run itself), then the stall, then each slow link."""
    out = [None]
    out += [s for s in (stragglers or []) if s.factor != 1]
    if stall is not None:
        out.append(stall)
    out += list(slow_links or [])
    return out


# ------------------------------------------------------------------ the kernel's CPU controller
class CpuController:
    """One cgroup CPU controller: v1 (``cpu.cfs_quota_us``) or v2 (``cpu.max``) at ``root``."""

    def __init__(self, root, version, mounted=False):
        self.root, self.version, self.mounted = root, version, mounted

    @classmethod
    def find(cls, v1="/sys/fs/cgroup/cpu", mounts="/proc/mounts", own="/proc/self/cgroup", private=None):
        """This machine's writable CPU controller, or a usage error that says what is missing: the v1
        ``cpu`` hierarchy at ``v1`` or wherever /proc/mounts has it (``cpu,cpuacct`` on many hosts),
        else a cgroup2 mount that offers ``cpu``.

        Inside ``ip netns exec`` (hvdps emulate runs the comparison there) a fresh /sys hides the
        cgroup mounts. There, in a mount namespace of its own, as root, the v1 hierarchy this process
        belongs to is mounted again at ``private``: the same hierarchy, so its groups are the machine's.
        Never in the machine's own mount namespace."""
        table = _mounts(mounts)
        for path, kind, options in [(v1, "cgroup", ["cpu"])] + table:
            if kind == "cgroup" and "cpu" in options and _writable(path, "cpu.cfs_quota_us"):
                return cls(path, 1)
        for path, kind, _ in table:
            if kind == "cgroup2" and "cpu" in _words(os.path.join(path, "cgroup.controllers")) \
                    and os.access(path, os.W_OK):
                return cls(path, 2)
        hierarchy = _v1_cpu_hierarchy(own)
        private = private or f"{PRIVATE_MOUNT}{os.getpid()}"
        if hierarchy and os.geteuid() == 0 and _own_mount_namespace() and _mount_cpu(private, hierarchy):
            return cls(private, 1, mounted=True)
        raise UsageError("--straggler needs the kernel's CPU controller writable (cgroup v1 cpu.cfs_quota_us "
                         f"at {v1}, or a cgroup2 mount with the cpu controller): run as root on such a machine")

    def create(self, name, quota_us, period_us=PERIOD_US):
        """A new group ``name`` limited to ``quota_us`` of CPU time per ``period_us``; its path."""
        path = os.path.join(self.root, name)
        os.mkdir(path)
        try:
            if self.version == 1:
                _write(os.path.join(path, "cpu.cfs_period_us"), period_us)
                _write(os.path.join(path, "cpu.cfs_quota_us"), quota_us)
            else:
                if "cpu" not in open(os.path.join(self.root, "cgroup.subtree_control")).read().split():
                    _write(os.path.join(self.root, "cgroup.subtree_control"), "+cpu")
                _write(os.path.join(path, "cpu.max"), f"{quota_us} {period_us}")
        except BaseException:
            self.remove(path)
            raise
        return path

    def add(self, path, pid):
        """Move process ``pid`` (every thread of it) into the group; False when it has gone."""
        try:
            _write(os.path.join(path, "cgroup.procs"), pid)
            return True
        except OSError as exc:
            if exc.errno in (errno.ESRCH, errno.ENOENT):
                return False
            raise

    def members(self, path):
        try:
            return [int(p) for p in open(os.path.join(path, "cgroup.procs")).read().split()]
        except OSError:
            return []

    def remove(self, path, attempts=50):
        """Move what is still in the group back to the root, then remove it (bounded: a process that
        is just exiting leaves the group a moment later)."""
        for _ in range(attempts):
            for pid in self.members(path):
                self.add(self.root, pid)
            try:
                os.rmdir(path)
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
            time.sleep(0.02)
        return False

    def close(self):
        """Unmount the hierarchy ``find`` mounted itself, and remove its mount point."""
        if self.mounted:
            subprocess.run(["umount", self.root], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
            try:
                os.rmdir(self.root)
            except OSError:
                pass
            self.mounted = False

    def remove_stale(self, prefix=GROUP_PREFIX):
        """Remove the groups a comparison that is no longer running left (its pid is in the name), and
        the mount points such a comparison made inside an emulated cluster."""
        for path in glob.glob(PRIVATE_MOUNT + "*"):
            pid = path[len(PRIVATE_MOUNT):]
            if pid.isdigit() and not exists(int(pid)) and path != self.root:
                try:
                    os.rmdir(path)          # the namespace that mounted it has gone: an empty folder here
                except OSError:
                    pass
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        gone = []
        for name in names:
            m = re.match(re.escape(prefix) + r"(\d+)-", name)
            if m and not exists(int(m.group(1))) and os.path.isdir(os.path.join(self.root, name)):
                if self.remove(os.path.join(self.root, name)):
                    gone.append(name)
        return gone


def _mounts(path):
    """[(mount point, type, options)] of the cgroup mounts in ``path`` (/proc/mounts' format)."""
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            out.append((fields[1].replace("\\040", " "), fields[2], fields[3].split(",")))
    return out


def _words(path):
    try:
        return open(path).read().split()
    except OSError:
        return []


def _writable(folder, name):
    return os.access(os.path.join(folder, name), os.R_OK) and os.access(folder, os.W_OK)


def _v1_cpu_hierarchy(own):
    """The controllers of the v1 hierarchy with ``cpu`` this process sits in ("cpu" or "cpu,cpuacct";
    /proc/self/cgroup), or None."""
    try:
        lines = open(own).read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":")
        if len(parts) >= 3 and "cpu" in parts[1].split(","):
            return parts[1]
    return None


def _own_mount_namespace(proc="/proc"):
    """True when this process's mount namespace differs from one of its ancestors' (``ip netns exec``
    makes one for the command it runs); init's own link may not be readable, even to root."""
    try:
        mine = os.readlink(os.path.join(proc, "self", "ns", "mnt"))
    except OSError:
        return False
    pid = os.getpid()
    for _ in range(64):
        try:
            stat = open(os.path.join(proc, str(pid), "stat")).read()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
        if pid <= 1:
            return False
        try:
            if os.readlink(os.path.join(proc, str(pid), "ns", "mnt")) != mine:
                return True
        except OSError:
            return False
    return False


def _mount_cpu(path, hierarchy):
    """Mount the v1 hierarchy of ``hierarchy``'s controllers at ``path`` (root, in this mount
    namespace); whether it worked."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.exists(os.path.join(path, "cpu.cfs_quota_us")):
            subprocess.run(["mount", "-t", "cgroup", "-o", hierarchy, "hvdps-cpu", path], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        return os.path.exists(os.path.join(path, "cpu.cfs_quota_us"))
    except (OSError, subprocess.SubprocessError):
        try:
            os.rmdir(path)
        except OSError:
            pass
        return False


def _write(path, value):
    with open(path, "w") as f:
        f.write(str(value))


def quota_us(factor, cores, tasks):
    """(CPU time per period, the period) in microseconds for a worker at 1/``factor`` of an even share of
    ``cores`` among ``tasks`` processes (at most one core each: a worker of a job that fits gets a core)."""
    share = min(1.0, cores / max(1, tasks))
    period = max(PERIOD_US, math.ceil(MIN_QUOTA_US * factor / share))
    return int(round(period * share / factor)), period


# ------------------------------------------------------------------ the job's process tree
def descendants(root_pid, proc="/proc"):
    """Every live process below ``root_pid`` (itself included), from each process's parent in
    /proc/<pid>/stat."""
    children = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
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
        if self.group:
            self.controller.remove(self.group)
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
        return False


def link_of(condition, links):
    """(host namespace, switch namespace, queue ms, the host's key in the cluster's records, its
    own rate in bits/s) of the host a slow link names; UsageError where the description cannot
    say (a cluster that is not hvdps emulate's, or a host it does not have)."""
    if links is None or not links.namespaces or not links.switch or not links.queue_ms:
        raise UsageError("--slow_link shapes one host's link of hvdps emulate's cluster (tc in the host's "
                         "namespace): run the comparison under hvdps emulate")
    keys = [k for k, port in links.ports.items() if port == condition.port]
    names = [ns for ns in links.namespaces.values() if ns.endswith(f"-{condition.port}")]
    if not keys or len(names) != 1:
        raise UsageError(f"--slow_link {condition.port}={condition.rate}: the cluster has no host "
                         f"{condition.port} (it has {', '.join(sorted(links.ports.values()))})")
    key = keys[0]
    return names[0], links.switch, links.queue_ms, key, (links.rates or {}).get(key, links.rate_bps)
