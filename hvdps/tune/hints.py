"""Where a plain comparison ran a method far from its best: the method's cost model, fed the run's own
step and compute (search.probe_network: the network on which it gives that step), predicts the step
at each other value of each setting it models (an axis of the method's space that its cost model
takes as an option: Horovod's cycle time, its fusion buffer); a move past the machine's noise is a
``Hint``, which the report names with the entry and the tune line that would check it."""
from dataclasses import dataclass

from hvdps import methods
from hvdps.methods import Variant, entry_text
from hvdps.tune.search import predict, probe_network
from hvdps.tune.space import Candidate

NOISE = 1.15       # a predicted move smaller than this is within this machine's run-to-run noise


@dataclass(frozen=True)
class Hint:
    """A run, one of its method's settings, the value it ran at and the value predicted to be
    ``factor`` times faster, and the ``--backends`` entry that runs it."""
    run: str
    method: str
    setting: str
    ran_at: str
    value: str
    factor: float
    entry: str
    workers: int
    step_s: float
    compute_s: float


def hints(rows):
    """[Hint] of the healthy multi-worker runs ``rows``, the largest predicted move per run and setting."""
    out = []
    tuning = methods.tuning()
    for r in rows:
        method = r.method
        if method is None or r.condition or (r.workers or 1) < 2 or r.status != "ok":
            continue
        modelled = {o.flag for o in method.cost.options}
        axes = [a for a in method.space if a.name in modelled]
        net = probe_network(r, tuning) if axes else None
        if net is None:
            continue
        own = dict(r.settings)
        here = _step(r, method, own, net, tuning)
        for axis in axes:
            ran_at = own.get(axis.name, axis.values[0])
            moves = []
            for value in axis.values:
                if value != ran_at:
                    step = _step(r, method, {**own, axis.name: value}, net, tuning)
                    if step and here:
                        moves.append((here / step, value))
            if moves and max(moves)[0] > NOISE:
                factor, value = max(moves)
                settings = _ordered(method, {**own, axis.name: value}, axis)
                entry = entry_text(Variant(method.name, r.mode, settings))
                out.append(Hint(r.name, method.name, axis.name, ran_at, value, factor, entry, r.workers,
                                r.step_s, r.compute_s))
    return out


def _ordered(method, values, axis):
    """The settings in the method's declaration order, the axis at its default left out."""
    defaults = {a.name: a.values[0] for a in method.space}
    return tuple((s.name, values[s.name]) for s in method.settings
                 if s.name in values and values[s.name] != defaults.get(s.name))


def _step(row, method, settings, net, tuning):
    variant = Variant(method.name, row.mode, _ordered(method, settings, None), tuple(row.tasks) or None)
    return predict(Candidate(variant), row, net, tuning)
