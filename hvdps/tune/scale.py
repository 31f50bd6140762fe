"""The tune for the cluster the user names (``--for_workers N --bandwidth_gbps B --latency_us L``): each
method's final runs, measured at the tune's own worker count, replayed at N workers on that network
(hvdps/cost/replay.py: each run's ranks' logged steps, its method's exchange at N for its settings),
and ranked there by projected throughput.

Only a candidate of the same arithmetic as the method's measured best is ranked at N: one that trains
differently (async, backup workers, local SGD's k, another precision) was judged by time to the
target accuracy, which a replay of step times cannot project. Every rank at N is the projection's
alone; where the best at N is not the measured best, the report says that it was not checked by
measurement."""
import dataclasses
import os
import sys
from typing import Optional, Tuple

from hvdps.cost.model import Everywhere
from hvdps.cost.replay import at_scale, runs_of
from hvdps.cost.schedule import AlphaBeta
from hvdps.measure.repeats import configuration_of
from hvdps.measure.runs import model_layers_of
from hvdps.measure.timeline import run_readies
from hvdps.tune.space import Candidate


@dataclasses.dataclass(frozen=True)
class Target:
    """The cluster a tune is for: its worker count and its links' bandwidth and latency."""
    workers: int
    bandwidth_gbps: float
    latency_us: float

    @property
    def net(self):
        return Everywhere(AlphaBeta(bandwidth=self.bandwidth_gbps * 1e9 / 8, alpha=self.latency_us * 1e-6))

    @property
    def said(self):
        return f"{self.workers} workers on {self.bandwidth_gbps:g} Gbit/s links, {self.latency_us:g} us latency"


@dataclasses.dataclass(frozen=True)
class AtTarget:
    """One final candidate at the target: its measured throughput at the tune's worker count, its step
    replayed at the target's and the throughput that gives (the target's workers x its batch / step)."""
    candidate: Candidate
    measured_rate: float
    step_s: float
    rate: float
    replayed_from: str


@dataclasses.dataclass(frozen=True)
class MethodAtTarget:
    """A method's finals ranked at the target (best first), its best there, the tune's measured best,
    and the candidates not ranked (another arithmetic, or no logged steps to replay) with why."""
    method: str
    ranked: Tuple[AtTarget, ...]
    best: Optional[Candidate]
    measured_best: Optional[Candidate]
    left_out: Tuple[Tuple[str, str], ...] = ()

    @property
    def by_projection_alone(self):
        """Whether the best at the target differs from the best measured: chosen by the replay alone."""
        return self.best is not None and self.best != self.measured_best


def _measured_run(merged, final_rows):
    """The final run a merged row stands for (the repeat with the median throughput): its ranks' files."""
    mine = [r for r in final_rows if configuration_of(r)[0] == merged.run_dir] or [merged]
    mine = [r for r in mine if r.samples_per_sec_median] or mine
    return sorted(mine, key=lambda r: r.samples_per_sec_median or 0)[(len(mine) - 1) // 2]


def model_layers(rows):
    """The model's per-layer gradients, rebuilt from a final run's config.json (the wait-free ring's
    schedule needs them), or None where no run's model rebuilds."""
    for row in rows:
        try:
            return model_layers_of(row.run_dir)
        except Exception as exc:     # a plug-in that no longer imports: the ring is costed whole
            print(f"note: could not rebuild the run's model ({exc})", file=sys.stderr)
    return None


def rank(tuned, target, tuning):
    """[MethodAtTarget] of ``tuned`` (hvdps/tune/tuner.py: Tuned) at ``target``."""
    out = []
    runs = {c: _measured_run(r, tuned.final_rows) for m in tuned.methods for c, r in m.finals if r is not None}
    layers = model_layers(list(runs.values()))
    for m in tuned.methods:
        measured = m.best[0] if m.best else None
        ranked, left = [], []
        for c, merged in m.finals:
            if merged is None or not merged.samples_per_sec_median:
                continue
            if measured is not None and c.group != measured.group:
                left.append((c.label, "trains differently from its best, judged by time to the target: not projected"))
                continue
            row = runs[c]
            replays = runs_of([row], layers, target.net, tuning, run_readies) if layers else []
            scaled = [s for s in at_scale(replays, [target.workers]) if s.workers == target.workers]
            if not scaled:
                left.append((c.label, "no logged steps of its workers to replay (ranks/*.json)"))
                continue
            step = scaled[0].step_s
            batch = row.batch_per_worker or (row.global_batch or 0) / max(1, row.workers or 1)
            ranked.append(AtTarget(candidate=c, measured_rate=merged.samples_per_sec_median, step_s=step,
                                   rate=target.workers * batch / step, replayed_from=os.path.basename(row.run_dir)))
        ranked.sort(key=lambda a: -a.rate)
        out.append(MethodAtTarget(method=m.method, ranked=tuple(ranked),
                                  best=ranked[0].candidate if ranked else None, measured_best=measured,
                                  left_out=tuple(left)))
    return out


def retuned(tuned, at):
    """``tuned`` with each method's best the one ranked first at the target (its merged row kept) and
    the winner the method whose best projects the highest throughput there: what best/ is written from."""
    best_of = {m.method: m for m in at}
    methods, winners = [], []
    for m in tuned.methods:
        mine = best_of.get(m.method)
        if mine is not None and mine.best is not None:
            row = next(r for c, r in m.finals if c == mine.best)
            m = dataclasses.replace(m, best=(mine.best, row), judged_by="throughput replayed at the target")
            winners.append((mine.ranked[0].rate, m.method, row))
        methods.append(m)
    winners.sort(key=lambda w: -w[0])
    return dataclasses.replace(tuned, methods=tuple(methods), best=tuple((name, row) for _, name, row in winners),
                               best_by="throughput replayed at the target")


def section(at, target):
    """report.md's lines: each method's finals at the target, ranked, and what the measurement did not check."""
    lines = [f"## For {target.said}: each method's finals replayed there", "",
             "Each final run's ranks' logged steps replayed at the target's worker count on its network, with its "
             "method's exchange for its settings (hvdps/cost/replay.py, docs/tune.md); samples/s = workers x batch / "
             "replayed step. **Every figure here is the replay's, not measured at that size.** best/ is written for it.",
             "", "| method | candidate | measured samples/s (tune's workers) | replayed step (ms) | projected samples/s | "
             "rank at the target |", "|---|---|---|---|---|---|"]
    for m in at:
        for k, a in enumerate(m.ranked, start=1):
            lines.append(f"| {m.method} | {a.candidate.label} | {a.measured_rate:,.0f} | {1e3 * a.step_s:.1f} | "
                         f"{a.rate:,.0f} | {k} |")
    lines.append("")
    for m in at:
        if m.best is None:
            lines.append(f"- {m.method}: nothing to replay at the target; its best stays the measured one.")
        elif m.by_projection_alone:
            lines.append(f"- {m.method}: **{m.best.label} was ranked first by the projection alone**: at the tune's "
                         f"own size {m.measured_best.label if m.measured_best else 'another'} measured best. "
                         f"Check it on the cluster before relying on it.")
        else:
            lines.append(f"- {m.method}: {m.best.label}, best at the tune's size and at the target.")
        for label, why in m.left_out:
            lines.append(f"  - {label}: {why}.")
    return lines + [""]
