"""The machine's other load while a run measured: was the comparison alone on this machine?

A run's throughput measures its method only when the cores were its own. On a shared login node
or a busy cluster node other work takes cores from the run's tasks, and a verdict would rank the
neighbours' load. So while each run of hvdps compare trains, a thread samples every
``SAMPLE_EVERY`` seconds

* the machine's busy CPU ticks (``/proc/stat``, all cores: hvdps/measure/links.py: read_cpu),
* the CPU ticks of the job's whole process tree (``/proc/<pid>/stat`` of the launcher and every
  task below it: user and system, plus what it reaped of its own exited children),
* this process's own (the comparison's polling and this sampler),
* the hypervisor's *steal* (``/proc/stat``: ticks a virtual machine's cores wanted and another
  tenant got), and
* the kernel's own threads' ticks (memory reclaim and monitoring, deferred network work: the
  machine's housekeeping, much of it for the job itself),

and keeps them in the run's ``load.json``. Over the run's measured interval (the one its
throughput is taken over), what the rest of the machine used is the machine's busy cores minus the
job's, the comparison's, the steal and the kernel threads'. A run whose neighbours, processes on
this machine or the hypervisor's other tenants, took more than ``SHARED_SHARE`` of the cores is
*shared*: the report says so beside its figures and in its verdict, naming each, and the
projection's check against measured runs leaves it out. Runs across hosts (--hosts) are not
sampled: their tasks' cores are on other machines.
"""
import json
import os
import time
from typing import NamedTuple, Optional

from common.base.files import write_atomic
from hvdps.measure.rows import measured_interval
from hvdps.measure.links import Periodic, _at, read_cpu_steal
from common.formats.schemas import read_load
from common.base.numbers import whole

# A run is *shared* when, over its measured interval, other processes than its own and the
# comparison's, and the hypervisor's other tenants, took more than this share of the machine's cores.
SHARED_SHARE = 0.10

LOAD_FILE = "load.json"
SAMPLE_EVERY = 0.5
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PF_KTHREAD = 0x00200000          # /proc/<pid>/stat flags: a kernel thread (include/linux/sched.h)


def _stat(pid):
    """(parent pid, utime + stime + cutime + cstime in ticks, a kernel thread?) of one process, or
    None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1]), sum(int(x) for x in fields[11:15]), bool(int(fields[6]) & PF_KTHREAD)
    except (IndexError, ValueError):
        return None


def split_ticks(root):
    """(CPU ticks of ``root`` and every live process below it, ticks of the kernel's threads), from
    one pass over /proc. A live task's own ticks count once; an exited one's were added to its
    parent's children's ticks when the parent reaped it."""
    stats = {}
    for name in os.listdir("/proc"):
        if whole(name) is not None:
            s = _stat(whole(name))
            if s:
                stats[int(name)] = s
    children = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total, sum(ticks for _, ticks, kernel in stats.values() if kernel)


def tree_ticks(root):
    """CPU ticks of ``root`` and every live process below it (split_ticks)."""
    return split_ticks(root)[0]


def own_ticks():
    t = os.times()
    return round((t.user + t.system) * HZ)


class LoadSampler(Periodic):
    """Samples [unix time, machine busy ticks, machine total ticks, job ticks, own ticks, steal ticks,
    kernel threads' ticks] in a thread while the job with launcher ``pid`` runs."""

    def __init__(self, pid, every=SAMPLE_EVERY):
        super().__init__(every)
        self.pid, self.samples = pid, []

    def sample(self):
        try:
            busy, total, steal = read_cpu_steal()
        except (OSError, ValueError):
            return
        job, kernel = split_ticks(self.pid)
        self.samples.append([round(time.time(), 4), busy, total, job, own_ticks(), steal, kernel])

    def save(self, run_dir):
        write_atomic(os.path.join(run_dir, LOAD_FILE),
                     json.dumps({"hz": HZ, "cores": os.cpu_count() or 1, "samples": self.samples}))


class Cores(NamedTuple):
    """Cores used on average over a run's measured interval: by the rest of the machine (its other
    processes), by the job, taken by the hypervisor for other tenants (steal), and by the kernel's
    own threads. The last two are None for a load file without them (5 values a sample)."""
    others: float
    job: float
    hypervisor: Optional[float] = None
    kernel: Optional[float] = None


def others_cores(load, interval):
    """The ``Cores`` used over the Unix-time ``interval`` from a run's typed load record; None
    without samples at both ends, or over less than two sampling periods: a job's tick sum drops
    when its processes exit between two samples, which over a failed run's last tenth of a second
    read as dozens of other cores."""
    if not interval or not load or len(load.samples) < 2:
        return None
    a, b = _at(load.samples, interval[0]), _at(load.samples, interval[1])
    seconds = interval[1] - interval[0]
    if a is None or b is None or seconds < 2 * SAMPLE_EVERY:
        return None
    busy, job, own = ((b[i] - a[i]) / load.hz / seconds for i in (0, 2, 3))
    if len(a) < 6:
        return Cores(max(0.0, busy - job - own), max(0.0, job))
    # kernel threads come and go (a kworker's ticks leave the sum when it exits): never below 0
    steal, kernel = (b[4] - a[4]) / load.hz / seconds, max(0.0, (b[5] - a[5]) / load.hz / seconds)
    return Cores(max(0.0, busy - job - own - steal - kernel), max(0.0, job), steal, kernel)


def contention(run_dir, header, steps):
    """(the ``Cores`` used over a run's measured interval, the machine's cores, shared?) from its
    load.json: shared when other processes and the hypervisor together took more than
    ``SHARED_SHARE`` of the cores; None where the run was not sampled."""
    path = os.path.join(run_dir, LOAD_FILE)
    if not os.path.lexists(path):
        return None, None, None
    load = read_load(path)
    cores = others_cores(load, measured_interval(header, steps))
    if cores is None:
        return None, load.cores, None
    return cores, load.cores, cores.others + (cores.hypervisor or 0.0) > SHARED_SHARE * load.cores
