"""The crossover: from which worker count the ring all-reduce beats one parameter server, and how
many PS shards a PS job needs to match the ring at each worker count, measured and projected.

This is the answer a user comparing the two comes for, so it is read from one comparison's runs
(``make emulate-scale``: every method at 2 to 16 workers, PS jobs with 1, 2 and 4 shards) and set
beside what the projection's step model gives for the same shapes (hvdps/cost/projection.py). The
model's lines also fill the worker and shard counts that were not run: each line is fed the
compute the runs of its method measured at the nearest worker count, since on a shared machine a
step's compute grows with the processes beside it.

The ring side at each n is the fastest exact ring method measured there (each is a drop-in for the
others; local SGD, which averages less often, is drawn beside them, not counted among them); each PS variant (classic sync, classic async, TF2's PS) is set against it on its own.
Which methods are rings and which are PS jobs comes from the method registry (hvdps/methods.py).
"""
import dataclasses
import statistics
from typing import Optional, Tuple

from hvdps import methods
from hvdps.cost.shape import StepShape

MAX_SHARDS = 64      # the projected shard count searched: a PS job needing more than this never matches


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of the crossover's plot: a ring method, or a PS variant at k shards; its measured
    and projected (workers, step seconds)."""
    name: str
    ring: bool
    k: Optional[int]
    measured: Tuple[Tuple[int, float], ...]
    projected: Tuple[Tuple[int, float], ...]
    # the measured points whose run measured contention for the cores (shared, oversubscribed), and
    # whether every run the line is projected from did: drawn apart, so no ranking rests on them unsaid
    contended: Tuple[Tuple[int, float], ...] = ()
    contended_line: bool = False


@dataclasses.dataclass(frozen=True)
class AtWorkers:
    """One worker count n of a PS variant against the ring: the fastest exact ring measured at n and
    its step (measured, projected), one PS's step, and the fewest shards that match the ring (measured:
    None, having tried up to ``shards_measured_tried``; projected: None, the nearest in ``closest_projected``)."""
    workers: int
    ring: Optional[str]
    ring_measured_s: Optional[float]
    ring_projected_s: Optional[float]
    ps1_measured_s: Optional[float]
    ps1_projected_s: Optional[float]
    shards_measured: Optional[int]
    shards_measured_tried: Optional[int]
    shards_projected: Optional[int]
    closest_projected: Optional[Tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class Versus:
    """One PS variant against the ring: from which n the ring is faster than one PS (measured,
    projected), and each measured n."""
    ps: str
    by_n: Tuple[AtWorkers, ...]
    ring_wins_from_measured: Optional[int]
    ring_wins_from_projected: Optional[int]


@dataclasses.dataclass(frozen=True)
class Workload:
    """The crossover of one model: its gradient bytes, the worker counts run, each PS variant
    against the ring, and the plot's lines."""
    model: str
    grad_bytes: float
    workers: Tuple[int, ...]
    variants: Tuple[Versus, ...]
    series: Tuple[Series, ...]


def is_ring(row):
    method = row.method
    return bool(method and method.cost.collective)


def is_exact(variant):
    """A ring whose every update is the all-ranks average (hvdps/cost/ring.py: ``Ring.exact``): one of
    the crossover's ring side, where a ring that averages less often (local SGD) is only drawn."""
    return methods.lookup(variant[0]).cost.exact


def points(rows):
    """The runs the crossover reads: known methods, a measured step and compute, one model each."""
    out = []
    for r in rows:
        if r.method is None or not r.step_s or not r.compute_s:
            continue
        if not r.grad_bytes_per_step:
            continue
        out.append(dataclasses.replace(r, model=r.model or "-", workers=r.workers or 1))
    return out


def _variant(r):
    """What one line of the crossover is: a method, its mode and its own settings."""
    return r.backend, r.mode, r.settings


def _name(variant):
    return methods.label(*variant)


def _compute_at(runs, n):
    """The compute the runs measured at the worker count nearest ``n`` (median over them)."""
    nearest = min({r.workers for r in runs}, key=lambda w: (abs(w - n), w))
    return statistics.median(r.compute_s for r in runs if r.workers == nearest)


def shards(row):
    """The server tasks a run's model is split over (its tasks besides the workers, by its method's
    roles), 1 where it names none."""
    return sum(n for _, n in row.tasks) or 1


def analyse(rows, project, layers=None, grid=None, contended=()):
    """[Workload]: per model, the fastest ring at each n, each PS variant against it, and the lines to plot.

    ``project(shape, shard_bytes)`` gives the model's step for a run's shape (hvdps/cost/shape.py)
    and, for PS, the bytes each PS task holds, or None. ``contended``: the names of the runs that
    measured contention for the cores, marked in the series."""
    crowded = set(contended)

    def marks(runs):
        """(the contended points, whether every run is contended) of a series' runs."""
        return (tuple(sorted((r.workers, r.step_s) for r in runs if r.name in crowded)),
                bool(runs) and all(r.name in crowded for r in runs))
    pts = points(rows)
    out = []
    for model in dict.fromkeys(r.model for r in pts):
        mine = [r for r in pts if r.model == model and r.workers >= 2]
        rings = [r for r in mine if is_ring(r)]
        pss = [r for r in mine if not is_ring(r)]
        if rings and pss:
            out.append(_workload(model, mine, rings, pss, project, layers, grid, marks))
    return out


@dataclasses.dataclass(frozen=True)
class _Rings:
    """One workload's rings: what every PS variant is held to."""
    ns: tuple              # every worker count projected
    measured_ns: tuple     # the worker counts run
    best: dict             # n -> (measured s, variant) of the fastest exact ring measured there
    best_line: dict        # n -> (projected s, variant) of the fastest exact ring's line


def _workload(model, mine, rings, pss, project, layers, grid, marks):
    grad = statistics.median(r.grad_bytes_per_step for r in mine)
    measured_ns = sorted({r.workers for r in mine})
    ns = sorted(set(measured_ns) | set(grid or schedule_grid(measured_ns[-1])))

    def projected(variant, runs, n, k=1):
        cost = methods.lookup(variant[0]).cost
        tasks = () if cost.collective else cost.tasks_at(k)
        row = StepShape(backend=variant[0], mode=variant[1], settings=variant[2], workers=n, tasks=tasks,
                        compute_s=_compute_at(runs, n), grad_bytes_per_step=grad)
        return project(row, None if cost.collective else cost.shard_bytes_at(layers, grad, k))

    ring_variants = list(dict.fromkeys(_variant(r) for r in rings))
    ring_runs = {v: [r for r in rings if _variant(r) == v] for v in ring_variants}
    ring_lines = {v: {n: projected(v, ring_runs[v], n) for n in ns} for v in ring_variants}
    exact = [v for v in ring_variants if is_exact(v)]   # drop-ins for each other (hvdps/cost/ring.py: Ring.exact)
    best_ring = {}
    for n in measured_ns:
        here = [(r.step_s, _variant(r)) for r in rings if r.workers == n and _variant(r) in exact]
        if here:
            best_ring[n] = min(here)
    best_line = {n: min((ring_lines[v][n], v) for v in exact if ring_lines[v][n] is not None)
                 for n in ns if any(ring_lines[v][n] is not None for v in exact)}
    held = _Rings(tuple(ns), tuple(measured_ns), best_ring, best_line)
    series = [Series(name=_name(v), ring=True, k=None,
                     measured=tuple(sorted((r.workers, r.step_s) for r in ring_runs[v])),
                     projected=tuple((n, s) for n, s in ring_lines[v].items() if s is not None),
                     contended=marks(ring_runs[v])[0], contended_line=marks(ring_runs[v])[1])
              for v in ring_variants]
    variants = []
    for v in dict.fromkeys(_variant(r) for r in pss):
        runs = [r for r in pss if _variant(r) == v]
        more, versus = _ps_variant(v, runs, held, lambda n, k, v=v, runs=runs: projected(v, runs, n, k), marks)
        series += more
        variants.append(versus)
    return Workload(model=model, grad_bytes=grad, workers=tuple(measured_ns), variants=tuple(variants),
                    series=tuple(series))


def _ps_variant(v, runs, held, projected, marks):
    """(its series, one per shard count; its Versus against the rings) of one PS variant's runs;
    ``projected(n, k)``: its modelled step at n workers and k shards."""
    ks = sorted({shards(r) for r in runs})
    measured = {(r.workers, shards(r)): r.step_s for r in runs}
    lines = {k: {n: projected(n, k) for n in held.ns} for k in sorted(set(ks) | {1})}
    series = [Series(name=f"{_name(v)}, {k} PS", ring=False, k=k,
                     measured=tuple(sorted((n, s) for (n, kk), s in measured.items() if kk == k)),
                     projected=tuple((n, s) for n, s in lines[k].items() if s is not None),
                     contended=marks([r for r in runs if shards(r) == k])[0],
                     contended_line=marks(runs)[1])            # its compute: every k's runs
              for k in ks]
    by_n = []
    for n in held.measured_ns:
        ring_s, ring_v = held.best.get(n, (None, None))
        line_s = held.best_line.get(n, (None, None))[0]
        need = [k for k in ks if (n, k) in measured and ring_s is not None and measured[(n, k)] <= ring_s]
        tried = [k for k in ks if (n, k) in measured]
        by_n.append(AtWorkers(workers=n, ring=_name(ring_v) if ring_v else None, ring_measured_s=ring_s,
                              ring_projected_s=line_s, ps1_measured_s=measured.get((n, 1)),
                              ps1_projected_s=lines[1].get(n),
                              shards_measured=min(need) if need else None,
                              shards_measured_tried=max(tried) if tried else None,
                              shards_projected=shards_to_match(lambda k: projected(n, k), line_s),
                              closest_projected=closest(lambda k: projected(n, k), line_s)))
    versus = Versus(ps=_name(v), by_n=tuple(by_n),
                    ring_wins_from_measured=wins_from(
                        {n: (held.best[n][0], measured.get((n, 1))) for n in held.best}),
                    ring_wins_from_projected=wins_from(
                        {n: (held.best_line[n][0], lines[1].get(n)) for n in held.best_line}))
    return series, versus


def schedule_grid(top):
    """The worker counts the lines are drawn at: 2, 4, 8, ... up to twice the largest run."""
    out, n = [], 2
    while n <= 2 * top:
        out.append(n)
        n *= 2
    return out


def wins_from(pairs):
    """The smallest n from which the ring is faster than one PS at every larger n given; None if
    it is not faster at the largest. ``pairs``: {n: (ring s, one PS s)}, either may be None."""
    known = sorted((n, r, p) for n, (r, p) in pairs.items() if r is not None and p is not None)
    if not known or known[-1][1] >= known[-1][2]:
        return None
    start = known[-1][0]
    for n, r, p in reversed(known):
        if r >= p:
            break
        start = n
    return start


def shards_to_match(step_with, ring_s, most=MAX_SHARDS):
    """The fewest PS shards k (1..most) whose step is no slower than the ring's ``ring_s``, or None."""
    if ring_s is None:
        return None
    for k in range(1, most + 1):
        s = step_with(k)
        if s is not None and s <= ring_s:
            return k
    return None


def closest(step_with, ring_s, most=MAX_SHARDS):
    """(k, step / ring step) of the shard count whose projected step comes nearest the ring's."""
    if not ring_s:
        return None
    steps = [(s, k) for k in range(1, most + 1) for s in [step_with(k)] if s is not None]
    if not steps:
        return None
    best = min(s for s, _ in steps)
    s, k = next((s, k) for s, k in steps if s <= best * 1.01)    # the fewest shards within 1% of the best
    return k, s / ring_s


