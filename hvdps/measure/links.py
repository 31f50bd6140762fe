"""Bytes that really crossed each host's link, beside what each method's algorithm predicts.

Measured: the interface counters of each host's link, sampled while a run
trains (``Sampler``, a thread of hvdps compare) and read at the two ends of
the run's measured interval (the same interval the throughput is taken over,
warm-up excluded), divided by the rounds in it. A *round* is one step of every
worker: one update under all-reduce and sync PS, ``n`` updates under async PS.
Counters count frames as they leave and enter the interface, headers included
(Ethernet, IP, TCP: about 4-5% over the payload at a 1500-byte MTU), so a
measurement sits a little above the payload the formula counts.

Predicted, per host link and direction, from the gradient's measured sizes
(the summary's ``gradient``) and where each task ran:

* ring all-reduce (Horovod, bare MPI): every host that holds ranks sends and
  receives 2(n-1)/n x M per round, whatever n (ranks on one host pass through
  shared memory, and the ring crosses each host boundary once each way);
* PS: a worker pushes each PS task its share of the gradient and pulls that
  task's share of the weights every batch, so a PS task's link carries
  n x share in and n x share out per round, and a worker's link M each way
  (traffic between tasks on one host stays off the link).

On the emulated cluster (hvdps emulate) the counters are the switch ports of
the hosts' veths, read from /proc/PID/net/dev of a process in the switch's
namespace: one read for every link, no process started per sample.
"""
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from common.base.files import write_atomic
from hvdps.measure.rows import measured_interval
from hvdps import methods
from common.formats.schemas import read_links

LINKS_FILE = "links.json"
SAMPLE_EVERY = 0.25


def read_cpu(path="/proc/stat"):
    """(busy, total) clock ticks of all the machine's cores since boot, from /proc/stat's ``cpu`` line:
    busy is user, nice, system, irq, softirq and steal; total adds idle and iowait. On the emulated
    cluster every host is this machine, so these are the cores all of a run's tasks share."""
    return read_cpu_steal(path)[:2]


def read_cpu_steal(path="/proc/stat"):
    """(busy, total, steal): read_cpu's ticks and, of busy, the *steal*: ticks in which this virtual
    machine's cores wanted to run and the hypervisor ran something else (another tenant)."""
    with open(path) as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:9]]
                v += [0] * (8 - len(v))
                busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
                return busy, busy + v[3] + v[4], v[7]
    raise OSError(f"{path}: no cpu line")


def read_net_dev(path):
    """{interface: (rx_bytes, tx_bytes)} from a /proc/.../net/dev file."""
    out = {}
    with open(path) as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if len(fields) >= 9:
                out[name.strip()] = (int(fields[0]), int(fields[8]))
    return out


class Periodic:
    """A context that calls ``sample()`` on entry, every ``every`` seconds in a thread while it
    is open, and once more on exit: the ends of a run's interval are always sampled."""

    def __init__(self, every):
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        raise NotImplementedError

    def _run(self):
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()


class Sampler(Periodic):
    """Samples every host's link counters in a thread: {host: [[unix time, bytes in, bytes out]]},
    and the machine's cores (``cpu``: [[unix time, busy ticks, total ticks]], read_cpu).

    ``ports``: {host: interface in the counters file}; the interface is the switch's side of the
    host's link, so the host's *in* is the port's transmit and its *out* the port's receive."""

    def __init__(self, counters, ports, every=SAMPLE_EVERY):
        super().__init__(every)
        self.counters, self.ports = counters, ports
        self.series = {h: [] for h in ports}
        self.cpu = []

    def sample(self):
        try:
            now, dev = time.time(), read_net_dev(self.counters)
        except OSError:
            return
        try:
            self.cpu.append([round(now, 4), *read_cpu()])
        except (OSError, ValueError):
            pass
        for host, port in self.ports.items():
            if port in dev:
                rx, tx = dev[port]
                self.series[host].append([round(now, 4), tx, rx])

    def save(self, run_dir, extra):
        path = os.path.join(run_dir, LINKS_FILE)
        write_atomic(path, json.dumps({"series": self.series, "cpu": self.cpu, "cores": os.cpu_count(), **extra}))


def _at(points, t):
    """Counter value at ``t``, linear between samples; None outside them."""
    before = [p for p in points if p[0] <= t]
    after = [p for p in points if p[0] >= t]
    if not before or not after:
        return None
    (t0, *a), (t1, *b) = before[-1], after[0]
    if t1 == t0:
        return tuple(a)
    w = (t - t0) / (t1 - t0)
    return tuple(x + (y - x) * w for x, y in zip(a, b))


def rounds_between(steps, interval, batch_per_worker, workers, start_time):
    """Rounds (one step of every worker) between the step records at the interval's ends
    (``interval`` in Unix time, the records' ``wall_time`` from the run's ``start_time``)."""
    at = [(start_time + s.wall_time, s) for s in steps]
    start = next((s for t, s in at if abs(t - interval[0]) < 1e-6), None)
    end = next((s for t, s in at if abs(t - interval[1]) < 1e-6), None)
    if start is None or end is None or not batch_per_worker or not workers:
        return None
    return (end.samples_seen - start.samples_seen) / (batch_per_worker * workers)


def measured(links, interval, rounds):
    """{host: {"in": bytes per round, "out": ...}} over the Unix-time ``interval``."""
    if not links or not interval or not rounds or rounds <= 0:
        return None
    out = {}
    for host, points in links.series.items():
        a, b = _at(points, interval[0]), _at(points, interval[1])
        if a is None or b is None:
            return None
        out[host] = {"in": (b[0] - a[0]) / rounds, "out": (b[1] - a[1]) / rounds}
    return out


def predicted(backend, mode, roles, gradient, shard_bytes=None):
    """{host: {"in": bytes per round, "out": ...}} by the method's algorithm (its cost model in
    hvdps/methods.py); None when the run's placement, sizes or method are unknown, or the method
    has no per-link rule for them. ``roles``: {task name: host} (``worker:i``, ``rank:i``, ``ps:i``)."""
    method = methods.lookup(backend)
    if not roles or not gradient or method is None:
        return None
    return method.cost.predict_links(mode, roles, gradient, shard_bytes)


def cores_busy(links, interval):
    """The share of the machine's cores that were busy over the Unix-time ``interval`` (links.json's
    ``cpu`` samples); None without samples at both ends. Near 1, the cores the emulated hosts share,
    not the links, may set the step."""
    points = links.cpu if links else []
    if not interval or not points:
        return None
    a, b = _at(points, interval[0]), _at(points, interval[1])
    if a is None or b is None or b[1] <= a[1]:
        return None
    return max(0.0, min(1.0, (b[0] - a[0]) / (b[1] - a[1])))


def run_cores(run_dir, header, steps):
    """(cores busy over the run's measured interval, the machine's cores) from the run's links.json,
    (None, None) where hvdps emulate's sampler did not record them."""
    path = os.path.join(run_dir, LINKS_FILE)
    if not os.path.lexists(path):
        return None, None
    links = read_links(path)
    return cores_busy(links, measured_interval(header, steps)), links.cores


@dataclass(frozen=True)
class LinkRow:
    """One host's link over a run's measured interval: the run's tasks on it, the bytes per round it
    carried each way (its counters) and what the method's formula says it should (None: no formula)."""
    host: str
    tasks: Tuple[str, ...]
    in_bytes: float
    out_bytes: float
    predicted_in: Optional[float]
    predicted_out: Optional[float]
    rounds: Optional[float]

    def carried(self, way):
        """Bytes per round ``way`` ("in" or "out")."""
        return self.in_bytes if way == "in" else self.out_bytes

    def expected(self, way):
        """The formula's bytes per round ``way``, or None."""
        return self.predicted_in if way == "in" else self.predicted_out


def link_rows(run, row, links, interval):
    """The run's per-link table rows (LinkRow): host, its tasks, measured and predicted bytes per round."""
    header = row.curves.header
    rounds = rounds_between(row.curves.steps, interval, row.batch_per_worker, row.workers,
                            header.start_time or 0) if interval and header else None
    got = measured(links, interval, rounds)
    roles = (links.roles if links else None) or {}
    want = predicted(row.backend, row.mode, roles, row.gradient, row.shard_bytes)
    if not got:
        return []
    out = []
    for host in got:
        tasks = [t for t, h in roles.items() if h == host]
        p = (want or {}).get(host) or {}
        out.append(LinkRow(host=host, tasks=tuple(tasks), in_bytes=got[host]["in"], out_bytes=got[host]["out"],
                           predicted_in=p.get("in"), predicted_out=p.get("out"), rounds=rounds))
    return out


def ratio(measured_bytes, predicted_bytes):
    if predicted_bytes is None or measured_bytes is None or predicted_bytes <= 0:
        return None
    return measured_bytes / predicted_bytes
