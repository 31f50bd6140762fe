"""The projection by replaying each run's own timeline: its ranks' measured steps, played again at
another worker count on another network.

Every rank of a run wrote its logged steps' spans (``ranks/<task>.json``, the source of the run's
``timeline.json``: hvdps/measure/timeline.py). The replay reads each logged step as a graph of spans:

- **each worker's ``ready``**: from the step's start to its gradient being ready, the wait for its
  batch plus its compute (the step less the exchange where the method times it, bare MPI and local
  SGD; else the compute its probe timed). Their spread is the measured spread of the ranks: a slow
  rank shows as a late ``ready``.
- **the exchange**: ``exchange_s`` seconds on the network, from the method's own cost model
  (``CostModel.step_terms``: the ring's 2(n-1)/n, the PS link's n·S, a neighbourhood's degree), of
  which ``hidden_s`` run before the last worker is ready (the overlap with back-propagation) and
  after which ``overhead_s`` more follow (the library's bookkeeping: Horovod's negotiation, the
  token queue's round trip). How much hides and how much is added is what the runs measured: the
  step each run took beyond its slowest rank's ``ready``, against the cost model's exchange at
  that run's worker count, fitted as ``factor x exchange + offset`` over the runs at the two
  smallest worker counts (``fit``), so every larger run is a prediction.

``play`` gives one step: where the workers wait for each other (``lockstep``), the exchange starts
``hidden_s`` before the last ``ready`` (not before the step's start) and the step ends with the
later of the last ``ready`` and the exchange's end plus its overhead. Where they do not (asynchronous
PS), each worker's own step is its ``ready`` plus the exposed exchange, and the job's step is n over
the sum of their rates. At N workers, worker j of step k replays the measured rank j mod n of
logged step k + j // n (its own rank's distribution, another of its steps), so the slowest of N is
an order statistic of what the ranks measured, not of an assumed normal; on cores the ranks share
(the emulated cluster), a lock-step worker's ``ready`` stretches by max(1, N / cores) over what it
was at the measured n. The replayed step is the median over the logged steps, as the runs' own
step is their median.
"""
import dataclasses
import statistics
from typing import Callable, Dict, Optional, Tuple

from hvdps import methods
from hvdps.cost.model import combine, summed_rates_step

FITTED = 2                    # the worker counts the replay is fitted at: the smallest ones
FACTOR_RANGE = (0.5, 2.0)     # a fitted factor outside it is taken for noise: 1, with the offset refitted


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """One step as spans: each worker's ``ready`` (seconds from the step's start), the exchange's
    seconds, the part of it that runs before the last worker is ready, the seconds after it, and
    whether the workers wait for each other."""
    ready: Tuple[float, ...]
    exchange_s: float
    hidden_s: float = 0.0
    overhead_s: float = 0.0
    lockstep: bool = True


def play(graph):
    """The step's seconds, played out from its spans (the module's docstring)."""
    last = max(graph.ready)
    if graph.lockstep:
        start = max(0.0, last - graph.hidden_s)
        return max(last, start + graph.exchange_s + graph.overhead_s)
    exposed = max(0.0, graph.exchange_s - graph.hidden_s) + graph.overhead_s
    return summed_rates_step([r + exposed for r in graph.ready])


def resampled(readies, n):
    """[tuple of n readies] per logged step: worker j of step k is the measured rank j mod m of
    step k + j // m (m measured ranks), so every rank keeps its own distribution."""
    steps = len(readies)
    out = []
    for k in range(steps):
        m = len(readies[k])
        out.append(tuple(readies[(k + j // m) % steps][j % m] for j in range(n)))
    return out


@dataclasses.dataclass(frozen=True)
class Fit:
    """What the runs at the fitted worker counts say of a method's exchange: measured exposed
    exchange = ``factor`` x the cost model's exchange + ``offset`` (a negative offset is the part
    that hides behind the compute, a positive one bookkeeping after it)."""
    factor: float
    offset_s: float
    fitted_at: Tuple[int, ...]

    def graph(self, ready, exchange_s, lockstep):
        """The step of ``ready`` with the cost model's ``exchange_s``: factor x it, of which a negative
        offset hides behind the compute as far as the last ready reaches and shortens the rest (the
        cost model's fixed part above what the runs took); a positive one is bookkeeping after it.
        Either way the exposed exchange is factor x exchange + offset, as fitted."""
        scaled = self.factor * exchange_s
        if self.offset_s >= 0:
            return StepGraph(ready=ready, exchange_s=scaled, overhead_s=self.offset_s, lockstep=lockstep)
        hidden = min(-self.offset_s, max(ready))
        return StepGraph(ready=ready, exchange_s=max(0.0, scaled + self.offset_s + hidden), hidden_s=hidden,
                         lockstep=lockstep)


def fit(points, fitted_at):
    """A ``Fit`` from [(the cost model's exchange, the measured step less the replayed readies)] of
    the fitted runs: least squares of a line where the exchanges differ, a factor outside
    FACTOR_RANGE (or one exchange alone) leaving the factor at 1 and the offset their mean."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    if len(set(round(x, 12) for x in xs)) >= 2:
        mx, my = statistics.mean(xs), statistics.mean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        factor = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        if FACTOR_RANGE[0] <= factor <= FACTOR_RANGE[1]:
            return Fit(factor=factor, offset_s=my - factor * mx, fitted_at=tuple(fitted_at))
    return Fit(factor=1.0, offset_s=statistics.mean(y - x for x, y in points), fitted_at=tuple(fitted_at))


def contention(n, measured_n, cores, measured_cores=None):
    """How much longer a lock-step worker's ``ready`` is at n workers sharing ``cores`` cores than it
    was at ``measured_n`` on ``measured_cores`` (each None: cores not shared, a cluster whose hosts
    have their own). ``measured_cores`` defaults to ``cores``: the same machine."""
    then = measured_cores if measured_cores is not None else cores
    now = max(1.0, n / cores) if cores else 1.0
    return now / (max(1.0, measured_n / then) if then else 1.0)


def replayed(readies, n, measured_n, exchange_s, fitted, lockstep, cores=None, measured_cores=None):
    """The median step of ``readies`` (a run's logged steps, one tuple of its ranks' readies each)
    replayed at n workers with the cost model's ``exchange_s`` at n and the method's ``fitted``."""
    stretch = contention(n, measured_n, cores, measured_cores) if lockstep else 1.0
    steps = [play(fitted.graph(tuple(r * stretch for r in ready), exchange_s, lockstep))
             for ready in resampled(readies, n)]
    return statistics.median(steps)


@dataclasses.dataclass(frozen=True)
class Replayed:
    """One measured run as the replay reads it: its identity's parts the fit groups by, its
    measured median step, its logged steps' readies, and its method's cost model: the exchange
    of this run's shape (gradient, other tasks, compute) at n workers on the projection's network."""
    run: str
    label: str
    family: Tuple[str, ...]
    variant: Tuple[str, ...]
    workers: int
    step_s: float
    readies: Tuple[Tuple[float, ...], ...]
    exchange_at: Callable[[int], Optional[float]]
    lockstep: bool

    @property
    def exchange_s(self):
        return self.exchange_at(self.workers)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One run in the replay's held-out check: measured, replayed from the fitted runs' timelines,
    their ratio, and whether it was fitted or held out. ``projector``: "replay"."""
    run: str
    backend: str
    workers: int
    measured_step_s: float
    predicted_step_s: float
    ratio: float
    held_out: bool
    fitted_at: Tuple[int, ...]
    factor: float
    offset_s: float
    replayed_from: str
    projector: str = "replay"


def exposed(r):
    """What the run's step took beyond its replayed readies alone (no exchange): its exposed exchange."""
    return r.step_s - statistics.median(max(ready) for ready in r.readies) if r.lockstep else \
        r.step_s - statistics.median(summed_rates_step(list(ready)) for ready in r.readies)


def families(runs):
    """{family: (its runs, the worker counts it is fitted at, its Fit)} of ``runs`` ([Replayed]):
    fitted at the two smallest counts, or the one it has."""
    by: Dict[Tuple[str, ...], list] = {}
    for r in runs:
        if r.readies and r.exchange_s is not None:
            by.setdefault(r.family, []).append(r)
    out = {}
    for family in sorted(by):
        group = by[family]
        fitted_at = sorted({r.workers for r in group})[:FITTED]
        chosen = [r for r in group if r.workers in fitted_at]
        out[family] = (group, fitted_at, fit([(r.exchange_s, exposed(r)) for r in chosen], fitted_at))
    return out


def analyse(runs, cores=None):
    """An ``Entry`` per run of every method family measured at three or more worker counts: each
    predicted from the timeline of the largest fitted run of its own variant (its other tasks),
    with the ``Fit`` of its family's runs at the two smallest counts. ``runs``: [Replayed]."""
    out = []
    for group, fitted_at, fitted in families(runs).values():
        if len({r.workers for r in group}) <= FITTED:
            continue
        chosen = [r for r in group if r.workers in fitted_at]
        for r in sorted(group, key=lambda r: (r.variant, r.workers, r.run)):
            source = _source([c for c in chosen if c.variant == r.variant] or chosen, r)
            predicted = replayed(source.readies, r.workers, source.workers, source.exchange_at(r.workers),
                                 fitted, r.lockstep, cores)
            out.append(Entry(run=r.run, backend=r.label, workers=r.workers, measured_step_s=r.step_s,
                             predicted_step_s=predicted, ratio=r.step_s / predicted,
                             held_out=r.workers not in fitted_at, fitted_at=tuple(fitted_at),
                             factor=fitted.factor, offset_s=fitted.offset_s, replayed_from=source.run))
    return out


@dataclasses.dataclass(frozen=True)
class AtScale:
    """A method's step replayed at n workers on the projection's network, from one measured run."""
    method: str
    workers: int
    step_s: float
    efficiency: float
    replayed_from: str
    factor: float
    offset_s: float
    projector: str = "replay"


def at_scale(runs, counts, measured_cores=None):
    """[AtScale] per method family and worker count in ``counts``: the largest measured run of the
    family (most workers, then most other tasks) replayed at each n on the projection's network,
    its workers on hosts of their own (their ready freed of the cores they shared when measured);
    efficiency = the replayed step at 1 worker's compute over the step at n (a replayed rank alone
    exchanges nothing)."""
    out = []
    for group, _, fitted in families(runs).values():
        source = max(group, key=lambda r: (r.workers, r.variant, r.run))
        alone = statistics.median(statistics.median(ready) for ready in source.readies) * \
            contention(1, source.workers, None, measured_cores)
        for n in counts:
            exchange = source.exchange_at(n) if n > 1 else None
            if n > 1 and exchange is None:
                continue
            step = alone if n == 1 else replayed(source.readies, n, source.workers, exchange, fitted,
                                                 source.lockstep, None, measured_cores)
            out.append(AtScale(method=source.label, workers=n, step_s=step, efficiency=alone / step,
                               replayed_from=source.run, factor=fitted.factor, offset_s=fitted.offset_s))
    return out


def _source(sources, run):
    """The fitted run whose timeline a run is replayed from: itself where it was fitted, else the
    one at the largest fitted worker count (the closest to it), the first by name among repeats."""
    if run in sources:
        return run
    top = max(s.workers for s in sources)
    return sorted((s for s in sources if s.workers == top), key=lambda s: s.run)[0]


def network_exchange_s(terms, compute_s):
    """The cost model's exchange from its step terms (``CostModel.step_terms``): what the step it
    gives takes beyond the compute."""
    return combine(compute_s, terms) - compute_s


def mean_error(entries):
    """Mean |measured / predicted - 1| over the held-out entries (None: none)."""
    held = [abs(e.ratio - 1.0) for e in entries if e.held_out]
    return statistics.mean(held) if held else None


def worst(entries) -> Optional[float]:
    """The held-out entry furthest from its prediction, as |ratio - 1| (None: none)."""
    held = [abs(e.ratio - 1.0) for e in entries if e.held_out]
    return max(held) if held else None


def runs_of(rows, layers, nets, tuning, readies_of):
    """[Replayed] of the multi-worker rows (hvdps.measure.rows.RunRow) whose workers logged steps, each
    with its method's exchange for its shape at any n on ``nets``, its own settings costed
    (``methods.tuning_at``); ``readies_of(row)``: its logged steps' readies (hvdps/measure/timeline.py:
    ``run_readies``). What hvdps project --from and hvdps tune --for_workers replay."""
    def terms_of(row, n):
        at = dataclasses.replace(row, workers=n)
        return row.method.cost.step_terms(at, row.shard_bytes, layers, nets, methods.tuning_at(row, tuning))

    out = []
    for row in rows:
        method = row.method
        if method is None or (row.workers or 1) < 2 or not row.step_s or not row.compute_s:
            continue
        if terms_of(row, row.workers) is None:
            continue
        ready = readies_of(row)
        if not ready:
            continue
        family = (row.model or "-", row.backend, row.mode or "", str(row.settings))
        out.append(Replayed(run=row.name, label=methods.label(row.backend, row.mode, row.settings), family=family,
                            variant=family + (str(row.tasks),), workers=row.workers, step_s=row.step_s,
                            readies=ready, exchange_at=_exchange_at(row, terms_of),
                            lockstep=method.cost.lockstep(row.mode)))
    return out


def _exchange_at(row, terms_of):
    def at(n):
        terms = terms_of(row, n)
        return None if terms is None else network_exchange_s(terms, row.compute_s)
    return at
