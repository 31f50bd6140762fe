"""The machine's other load while a run measured: was the comparison alone on this machine?

A run's throughput measures its method only when the cores were its own. On a shared login node
or a busy cluster node other work takes cores from the run's tasks, and a verdict would rank the
neighbours' load. So while each run of hvdps compare trains, a thread samples every
``SAMPLE_EVERY`` seconds

* the machine's busy CPU ticks (``/proc/stat``, all cores: hvdps/measure/links.py: read_cpu),
* the CPU ticks of the job's whole process tree (``/proc/<pid>/stat`` of the launcher and every
  task below it: user and system, plus what it reaped of its own exited children), and
* this process's own (the comparison's polling and this sampler),

and keeps them in the run's ``load.json``. Over the run's measured interval (the one its
throughput is taken over), what the rest of the machine used is the machine's busy cores minus the
job's and the comparison's. A run whose neighbours used more than ``SHARED_SHARE`` of the cores
is *shared*: the report says so beside its figures and in its verdict, and the projection's check
against measured runs leaves it out. Runs across hosts (--hosts) are not sampled: their tasks'
cores are on other machines.
"""
import json
import os
import time

from common.base.files import write_atomic
from hvdps.measure.rows import measured_interval
from hvdps.measure.links import Periodic, _at, read_cpu
from common.formats.schemas import read_load

# A run is *shared* when, over its measured interval, anything but its own processes and the
# comparison used more than this share of the machine's cores.
SHARED_SHARE = 0.10

LOAD_FILE = "load.json"
SAMPLE_EVERY = 0.5
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid):
    """(parent pid, utime + stime + cutime + cstime in ticks) of one process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1]), sum(int(x) for x in fields[11:15])
    except (IndexError, ValueError):
        return None


def tree_ticks(root):
    """CPU ticks of ``root`` and every live process below it. A live task's own ticks count once;
    an exited one's were added to its parent's children's ticks when the parent reaped it."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = _stat(int(name))
            if s:
                stats[int(name)] = s
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


def own_ticks():
    t = os.times()
    return round((t.user + t.system) * HZ)


class LoadSampler(Periodic):
    """Samples [unix time, machine busy ticks, machine total ticks, job ticks, own ticks] in a
    thread while the job with launcher ``pid`` runs."""

    def __init__(self, pid, every=SAMPLE_EVERY):
        super().__init__(every)
        self.pid, self.samples = pid, []

    def sample(self):
        try:
            busy, total = read_cpu()
        except (OSError, ValueError):
            return
        self.samples.append([round(time.time(), 4), busy, total, tree_ticks(self.pid), own_ticks()])

    def save(self, run_dir):
        write_atomic(os.path.join(run_dir, LOAD_FILE),
                     json.dumps({"hz": HZ, "cores": os.cpu_count() or 1, "samples": self.samples}))


def others_cores(load, interval):
    """(cores the rest of the machine used, cores the job used) on average over the Unix-time
    ``interval`` from a run's typed load record; (None, None) without samples at both ends."""
    if not interval or not load or len(load.samples) < 2:
        return None, None
    a, b = _at(load.samples, interval[0]), _at(load.samples, interval[1])
    seconds = interval[1] - interval[0]
    if a is None or b is None or seconds <= 0:
        return None, None
    busy, job, own = ((b[i] - a[i]) / load.hz / seconds for i in (0, 2, 3))
    return max(0.0, busy - job - own), max(0.0, job)


def contention(run_dir, header, steps):
    """(others' cores, the job's cores, the machine's cores, shared?) over a run's measured interval,
    from its load.json; all None where the run was not sampled."""
    path = os.path.join(run_dir, LOAD_FILE)
    if not os.path.lexists(path):
        return None, None, None, None
    load = read_load(path)
    others, job = others_cores(load, measured_interval(header, steps))
    if others is None:
        return None, None, load.cores, None
    return others, job, load.cores, others > SHARED_SHARE * load.cores
