"""One tune, start to end: each method's defaults probed at full length, its candidates ranked and
pruned by its cost model from that probe, the rest halved on short trials, the finalists and the
defaults repeated at full length in alternating order, each method's best judged and the methods
compared best against best and defaults against defaults. The same steps rebuild a report from a
tune's folder (``Trials.live`` False): what was measured decides, so the rebuilt report is the live one."""
from dataclasses import dataclass
from typing import Optional

from hvdps import methods
from hvdps.measure.repeats import merge
from hvdps.tune import search
from hvdps.tune.search import OutOfBudget


@dataclass(frozen=True)
class MethodTuned:
    """What the tune found of one method: its space, the model's ranking from its probe (and the
    probe's fitted network), the finalists, their merged final rows, its best and how it was judged."""
    method: str
    candidates: tuple
    probe: object = None
    net: object = None
    ranked: tuple = ()
    finals: tuple = ()               # ((candidate, merged row or None), ...), the defaults first
    best: Optional[tuple] = None     # (candidate, row)
    judged_by: str = ""
    failed: Optional[str] = None     # why it has no result (its probe failed)

    @property
    def defaults(self):
        return self.candidates[0]

    @property
    def defaults_row(self):
        return next((r for c, r in self.finals if c == self.defaults), None) or self.probe


@dataclass(frozen=True)
class Tuned:
    """The whole tune: each method's, every halving trial, the final's repeats, what stopped the
    search early (the budget) and the two verdicts, best against best and defaults against defaults."""
    methods: tuple
    trials: tuple
    repeats: int
    stopped: Optional[str]
    best: tuple
    best_by: str
    defaults: tuple
    defaults_by: str
    final_rows: tuple = ()           # every final run, repeats apart


def tune(spaces, trials, steps0, repeats):
    """``spaces``: {method: [Candidate]} (the defaults first); ``trials``: trials.Trials."""
    tuned, stopped = {}, None
    for name, cands in spaces.items():                     # 1. the probe: each method's defaults, full length
        try:
            probe = trials.run(cands[0], "probe")
        except OutOfBudget as exc:
            tuned[name], stopped = MethodTuned(name, tuple(cands), failed="the budget ran out before its probe"), str(exc)
            continue
        if probe.status != "ok":
            tuned[name] = MethodTuned(name, tuple(cands), probe=probe, failed=f"its defaults failed: {probe.error or probe.status}")
            continue
        tuning = methods.tuning()
        net = search.probe_network(probe, tuning)
        predicted = {c: search.predict(c, probe, net, tuning) for c in cands}
        tuned[name] = MethodTuned(name, tuple(cands), probe, net, tuple(search.rank(cands, predicted)))
    live = [m for m in tuned.values() if m.failed is None]
    # the defaults go to the final whatever halving finds (the baseline of every gain): halving races the rest
    kept = [r.candidate for m in live for r in m.ranked if r.pruned is None and r.candidate != m.defaults]
    repeats = _fit_repeats(trials, live, kept, repeats)
    finalists, halving, cut = search.halve(kept, lambda c, rung, steps: trials.run(c, f"r{rung}-s{steps}", steps), steps0)
    finals, skipped, final_rows = _final(trials, live, finalists, repeats, final_steps(live, halving))
    stopped = stopped or cut or skipped
    for m in live:
        rows = tuple((c, finals.get(c)) for c in _final_set(m, finalists))
        best, how = search.best_of(rows, m.defaults)
        tuned[m.method] = MethodTuned(m.method, m.candidates, m.probe, m.net, m.ranked, rows, best, how)
    done = list(tuned.values())
    best, best_by = search.verdict([(m.method, m.best[1]) for m in done if m.best])
    defaults, defaults_by = search.verdict([(m.method, m.defaults_row) for m in done if m.defaults_row is not None
                                            and m.defaults_row.status == "ok"])
    return Tuned(tuple(done), tuple(halving), repeats, stopped, tuple(best), best_by, tuple(defaults), defaults_by,
                 tuple(final_rows))


def _final_set(m, finalists):
    """A method's final runs: its defaults, then its finalists."""
    return list(dict.fromkeys([m.defaults, *(c for c in finalists if c.method == m.method)]))


def _fit_repeats(trials, live, kept, repeats):
    """The final's repeats the budget leaves room for after the probes (at least 1), and the seconds
    halving keeps back for them (``trials.reserve``)."""
    clock = trials.clock
    if clock is None:
        return repeats
    groups = {(c.method, c.group) for c in kept}
    per_pass = sum(clock.estimate(m.method, None) * (1 + sum(1 for g in groups if g[0] == m.method)) for m in live)
    while repeats > 1 and per_pass * repeats > clock.left():
        repeats -= 1
    trials.reserve = per_pass * repeats
    return repeats


def final_steps(live, halving):
    """{method: the steps per worker its final runs, or None for the flags' own length}: at least the
    last rung's, so that the verdict's throughput is the steady state the halving measured and not a
    shorter run's start-up (Horovod's background thread and first negotiations weigh on 110 steps, not on
    2,700). A method whose full length is longer keeps it."""
    last = max((t.steps for t in halving), default=0)
    out = {}
    for m in live:
        plan = m.probe.header.plan if m.probe is not None and m.probe.header is not None else None
        full = plan.get("worker_steps") if isinstance(plan, dict) else None
        out[m.method] = last if last and (full is None or last > full) else None
    return out


def _final(trials, live, finalists, repeats, steps=None):
    """({candidate: its merged row}, why a run was left out or None, every run) of the final: every method's final set, ``repeats`` times, the order
    reversed on every other pass (as compare --repeat), within the budget left; ``steps`` {method: steps
    per worker or None} (final_steps)."""
    steps = steps or {}
    order = [c for m in live for c in _final_set(m, finalists)]
    rows, skipped = {c: [] for c in order}, None
    for k in range(1, repeats + 1):
        for c in (order if k % 2 else order[::-1]):
            try:
                rows[c].append(trials.run(c, "final", steps.get(c.method), repeat=k if repeats > 1 else None,
                                          reserve=0.0))
            except OutOfBudget as exc:
                skipped = skipped or f"the final: {exc}"
    return {c: merge(rs)[0] for c, rs in rows.items() if rs}, skipped, [r for rs in rows.values() for r in rs]
