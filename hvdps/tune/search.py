"""How hvdps tune chooses: the method's cost model ranks its candidates from its probe and prunes
those it predicts to be far worse (``rank``); successive halving then runs the rest on measured
trials, short ones first, the best third of each arithmetic group going on to runs three times
longer (``halve``); the finalists' repeated full runs decide each method's best (``best_of``) and the
verdict best against best (``verdict``). Every function here takes what was measured and decides;
running a trial is trials.py's."""
import math
from dataclasses import dataclass
from typing import Optional

from hvdps import methods
from hvdps.cost.model import Everywhere
from hvdps.cost.projection import projected_step, single_layer
from hvdps.cost.schedule import AlphaBeta
from hvdps.cost.shape import StepShape
from hvdps.measure.rows import unresolved

PRUNE = 1.5       # a candidate the model predicts this many times its group's best step is not run
SAME = 0.02       # two predictions this close: the setting between them moves nothing the model sees
KEEP = 3          # each rung keeps the best third of each group
RUNGS = 3         # at most this many rungs of halving (steps x1, x3, x9)
ACCURACY_SLACK = 0.01   # a candidate trained no worse than its defaults' final accuracy less this
TIME_TIE = 0.2    # times to the target within this of the fastest are a tie, which throughput breaks


# the network whose scale a probe's step fits: a 10 Gbit/s link with 50 us a message (loopback and a
# data-centre link alike are latency-bound for the small models whose cycle and fusion matter)
NOMINAL = AlphaBeta(bandwidth=10e9 / 8, alpha=50e-6)


class OutOfBudget(Exception):
    """A trial that the budget left no time for (or, rebuilding a report, one that never ran)."""


# ------------------------------------------------------------------ the cost model's ranking
def probe_network(probe, tuning, nominal=None):
    """The network (AlphaBeta) on which the method's cost model gives the probe's measured step at the
    probe's own settings: the ``nominal`` network (default NOMINAL) with its latency and its time per
    byte both scaled by one factor, found by bisection, so the balance between a message's cost and a
    byte's stays the nominal one and only the scale is measured. None where the probe measured no
    compute (--probe_steps 0) or no gradient, or its method has no model of the step."""
    if not (probe.compute_s and probe.step_s and probe.grad_bytes_per_step) or probe.method is None:
        return None
    nominal = nominal or NOMINAL
    layers = single_layer(probe.grad_bytes_per_step)
    at = lambda scale: AlphaBeta(bandwidth=nominal.bandwidth / scale, alpha=nominal.alpha * scale)

    def step_at(scale):
        return projected_step(_shape(probe, probe.mode, probe.tasks, probe.settings), None, layers,
                              Everywhere(at(scale)), tuning)[0]
    lo, hi = 1e-4, 1e5
    if step_at(lo) is None:
        return None
    if step_at(lo) >= probe.step_s:
        return at(lo)
    if step_at(hi) <= probe.step_s:
        return at(hi)
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if step_at(mid) > probe.step_s else (mid, hi)
    return at(lo)


def _shape(probe, mode, tasks, settings):
    return StepShape(workers=probe.workers or 1, compute_s=probe.compute_s, grad_bytes_per_step=probe.grad_bytes_per_step,
                     backend=probe.backend, mode=mode, tasks=tuple(tasks or ()), settings=tuple(settings))


def predict(candidate, probe, net, tuning):
    """The step the cost model gives ``candidate`` from its method's probe, on the probe's network."""
    if net is None:
        return None
    v = candidate.variant
    return projected_step(_shape(probe, v.mode, v.tasks, v.settings), None, single_layer(probe.grad_bytes_per_step),
                          Everywhere(net), tuning)[0]


@dataclass(frozen=True)
class Ranked:
    """A candidate as the model placed it: its predicted step (None: not modelled) and, if it is not
    run, why."""
    candidate: object
    predicted_s: Optional[float]
    pruned: Optional[str] = None


def _modelled(method):
    """The axes the method's cost model sees: its options' settings and its task counts."""
    return {o.flag for o in method.cost.options}


def _twins(a, b):
    """Whether two candidates differ only in what the model sees (the same mode and unmodelled settings)."""
    seen = _modelled(methods.get(a.method))
    rest = lambda c: (c.variant.mode, c.precision, tuple(s for s in c.variant.settings if s[0] not in seen))
    return rest(a) == rest(b)


def rank(cands, predicted):
    """[Ranked] of one method's candidates (the defaults first in ``cands``), kept ones first in order
    of their predicted step: pruned where the model predicts PRUNE times the best step of the same
    arithmetic, or the step of a kept candidate nearer the defaults that differs only in what the
    model sees (within SAME: that setting would change nothing here). The defaults are always run."""
    defaults = cands[0]
    out, kept = [], []
    for group in dict.fromkeys(c.group for c in cands):
        mine = [c for c in cands if c.group == group]
        known = [predicted[c] for c in mine if predicted.get(c)]
        best = min(known) if known else None
        for c in sorted(mine, key=lambda c: (c is not defaults, c.changed, predicted.get(c) or math.inf)):
            p = predicted.get(c)
            if c is not defaults and p and best and p > PRUNE * best:
                out.append(Ranked(c, p, f"predicted {p / best:.2f}x the best step of its kind"))
                continue
            twin = next((k for k in kept if p and predicted.get(k) and _twins(k, c)
                         and abs(p / predicted[k] - 1) <= SAME), None)
            if c is not defaults and twin is not None:
                out.append(Ranked(c, p, f"predicted the step of {twin.label} (within {SAME:.0%}): nothing to move"))
                continue
            kept.append(c)
    ranked = [Ranked(c, predicted.get(c)) for c in sorted(kept, key=lambda c: (predicted.get(c) or math.inf, c.changed))]
    return ranked + out


# ------------------------------------------------------------------ successive halving
@dataclass(frozen=True)
class Trial:
    """One measured trial: its rung (0, 1, ...), steps, candidate, and its figure (samples/s; None: failed)."""
    rung: int
    steps: int
    candidate: object
    samples_per_s: Optional[float]
    row: object = None


def halve(kept, measure, steps0):
    """(the finalists: one per method and arithmetic group, [Trial], why it stopped early or None): each group of more than one
    candidate runs its candidates for ``steps0`` steps, keeps its best third by throughput, and runs
    those three times longer, until one is left or RUNGS rungs have run. ``kept``: [Candidate] in
    rank order (every method's); ``measure(candidate, rung, steps)``: a RunRow, or OutOfBudget raised,
    which ends the search where it is (each group's best so far goes on)."""
    groups = {}
    for c in kept:
        groups.setdefault((c.method, c.group), []).append(c)
    alive = {g: list(cs) for g, cs in groups.items()}
    trials, stopped = [], None
    try:
        for rung in range(RUNGS):
            racing = {g: cs for g, cs in alive.items() if len(cs) > 1}
            if not racing:
                break
            steps = steps0 * 3 ** rung
            scores = {}
            for c in _round_robin(racing):
                row = measure(c, rung, steps)
                rate = row.samples_per_sec_median if row is not None and row.status == "ok" else None
                trials.append(Trial(rung, steps, c, rate, row))
                if rate:
                    scores[c] = rate
            for g, cs in racing.items():
                ran = sorted((c for c in cs if c in scores), key=lambda c: -scores[c])
                alive[g] = ran[:max(1, math.ceil(len(cs) / KEEP))] if ran else cs[:1]
    except OutOfBudget as exc:
        stopped = str(exc)
        for g, cs in alive.items():
            alive[g] = [_best_so_far(cs, trials)]
    return [cs[0] for cs in alive.values()], trials, stopped


def _round_robin(groups):
    """The groups' candidates interleaved method by method, each in rank order."""
    by_method = {}
    for (method, _), cs in groups.items():
        by_method.setdefault(method, []).extend(cs)
    queues = list(by_method.values())
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def _best_so_far(cs, trials):
    """The candidate of ``cs`` with the best figure at the deepest rung any of them reached (rank order on ties)."""
    mine = [t for t in trials if t.candidate in cs and t.samples_per_s]
    if not mine:
        return cs[0]
    return max(mine, key=lambda t: (t.rung, t.samples_per_s)).candidate


# ------------------------------------------------------------------ the finalists, judged
def accuracy_ok(row, defaults_row):
    """It reached the target, or trained to no worse than its defaults' final accuracy (less the slack)."""
    if row.time_to_target is not None:
        return True
    if defaults_row is None or defaults_row.final_test_accuracy is None:
        return row.final_test_accuracy is not None
    return (row.final_test_accuracy or 0.0) >= defaults_row.final_test_accuracy - ACCURACY_SLACK


def best_of(finals, defaults):
    """(the best (candidate, row) of one method's finalists, how it was judged): ``finals`` [(candidate,
    its finalists' merged row)], ``defaults`` the defaults' candidate. Where the finalists train
    differently (async against sync, k, fp16), by time to the target accuracy; else by throughput,
    among those whose accuracy holds against the defaults'."""
    ok = [(c, r) for c, r in finals if r is not None and r.status == "ok"]
    if not ok:
        return None, "no finalist finished"
    base = next((r for c, r in ok if c == defaults), None)
    if len({c.group for c, _ in ok}) > 1:
        reached = [(c, r) for c, r in ok if r.time_to_target is not None]
        if reached and not at_first_eval([r for _, r in ok]):
            return by_time(reached)[0], BY_TIME
    held = [(c, r) for c, r in ok if accuracy_ok(r, base)] or ok
    return max(held, key=lambda cr: _rate(cr[1])), "throughput, accuracy held"


BY_TIME = f"time to the target accuracy (within {TIME_TIE:.0%} of the fastest: throughput)"


def _rate(row):
    return row.samples_per_sec_median or 0.0


def by_time(pairs):
    """``pairs`` [(x, row)] fastest to the target first: those within TIME_TIE of the fastest time (a
    tie at this machine's noise and an evaluation's granularity) by throughput, then the rest by time."""
    pairs = sorted(pairs, key=lambda xr: xr[1].time_to_target)
    fastest = pairs[0][1].time_to_target
    tied = [p for p in pairs if p[1].time_to_target <= fastest * (1 + TIME_TIE)]
    return sorted(tied, key=lambda xr: -_rate(xr[1])) + [p for p in pairs if p not in tied]


FIRST_EVAL = ("throughput (every run reached the target accuracy within its first few evaluations, too far apart "
              "to time the crossing: the time to it measures how soon each evaluated, not how fast it trained)")


def at_first_eval(rows):
    """Whether time to the target cannot judge ``rows`` (two or more): every one reached its target at
    its first evaluation, or each crossed it within the fastest's evaluation window (rows.unresolved)."""
    return len(rows) > 1 and unresolved(rows)


def verdict(bests):
    """[(method, row)] fastest first, and by what: time to the target where every one reached it
    (``by_time``), unless every one reached it at its first evaluation; else throughput."""
    rows = [(m, r) for m, r in bests if r is not None]
    by_rate = sorted(rows, key=lambda mr: -_rate(mr[1]))
    if at_first_eval([r for _, r in rows]):
        return by_rate, FIRST_EVAL
    if rows and all(r.time_to_target is not None for _, r in rows):
        return by_time(rows), BY_TIME
    return by_rate, "throughput"
