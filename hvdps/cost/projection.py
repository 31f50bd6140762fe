"""Projecting step time and scaling efficiency past this machine, from what was measured.

Two layers:

- the alpha-beta cost of one exchange of an M-byte gradient among n workers on
  links of bandwidth B and per-message latency alpha (ring all-reduce
  2(n-1)/n M/B + 2(n-1) alpha; PS with k shards 2 max(nM/(kB), gM/B) + 2 alpha);
- when that exchange happens: hvdps/cost/schedule.py plays out wait-free
  back-propagation layer by layer (gradients leave as they appear, Horovod's
  fusion buffer and cycle time, PS variable placement), so the share of the
  exchange that hides behind the backward pass comes from the model's own
  layers, not from a hand-set knob. Synchronous training also waits for the
  slowest of n workers every step (``--straggler_cv``, ``--straggler``: order statistics,
  hvdps/cost/stragglers.py).

With ``--from RUNS`` the compute time, the gradient size, the model's layers
and the overlap each run achieved come from hvdps runs:
overlap = (compute + exchange - step) / exchange, with the exchange measured
(bare MPI's exchange_s) or costed with the fitted alpha-beta model.
"""

import dataclasses
from typing import Optional, Tuple

from hvdps import methods
from hvdps.cost import stragglers
from hvdps.cost.model import Everywhere
from hvdps.cost.schedule import Scheduled
from hvdps.cost.shape import StepShape
from common.formats.schemas import Layer
from common.model.layer_profile import load_profiles


def efficiency(compute, comm, overlap=0.0):
    return compute / (compute + (1.0 - overlap) * comm)


def fit_from_comm(comm_results, np_=2):
    """{network: AlphaBeta or Unfitted}, one per exchange family the methods declare that comm.json
    measures (hvdps/methods.py: ``networks_measured``): Horovod's rows fit ``allreduce``, TensorFlow's
    MultiWorkerMirrored rows ``mwms``, the PS push and pull rows the parameter servers' network, each
    by its own rule (hvdps/cost/fits.py). ``comm_results``: comm.json's typed rows (CommRow). A family
    whose points cannot be fitted is Unfitted, with why (``network`` refuses to use it)."""
    fits = {}
    for net in methods.networks_measured().values():
        rows = [(r.impl, r.bytes, r.seconds) for r in comm_results if r.impl.startswith(net.prefix)]
        if rows:
            fits[net.network] = net.fit(rows, np_, net.what)
    return fits


def powers_of_two(lo, hi):
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def known_models():
    return load_profiles()


def single_layer(grad_bytes):
    """A model known only by its size: every gradient appears at the end of backprop (nothing hides)."""
    return [Layer(name="all", grad_bytes=int(grad_bytes), tensors=[int(grad_bytes)], flops=1)]


@dataclasses.dataclass(frozen=True)
class Projected:
    """One architecture at one worker count: the step (compute, the exposed exchange, the wait for
    the slowest worker), the exchange's own time and the share of it hidden, and the efficiency
    (compute / step). ``family``: the plot's panel, its cost model's (``CostModel.panel``)."""
    workers: int
    arch: str
    family: str
    comm_s: float
    overlap: float
    straggler_s: float
    step_s: float
    efficiency: float


def project(layers, compute_s, workers, nets, shards=(1, 8), per_server=1, tuning=None,
            straggler_cv=0.0, measured=None, own=None, slow=None):
    """Rows of projected step time and efficiency for each worker count and architecture, each costed on
    the network of ``nets`` ({network: AlphaBeta}) its own model picks (``CostModel.net``).

    ``own``: {label: (method, fit, mode, settings)} for collective methods measured with a network of
    their own (TensorFlow's ring), with a step of their own (local SGD) or at settings of their own that
    its cost model takes (Horovod's cycle time): each adds rows by its method's step model
    (hvdps/methods.py) in that mode at those settings, on that fit.

    The generic rows are each panel's cost model's (hvdps/methods.py: ``schedulers``; ``generic_rows``):
    the ring's wait-free schedule, the parameter servers' at a fixed number of shards each (``shards``)
    and at one PS per server (k = n / per_server), BytePS-style summation servers, each with the knobs
    its method declares read off ``tuning`` (their defaults if None). ``workers`` counts GPUs.
    ``slow``: {rank: F}, workers whose compute is F times slower than the others' (where n has
    that rank); with ``straggler_cv``, the per-worker step distribution a synchronous step waits
    for the slowest of (hvdps/cost/stragglers.py).
    ``measured``: {arch label: (overlap, the run's cost model)} from runs; each adds rows where that
    overlap is applied to the alpha-beta exchange time of its panel's generic model
    (``generic_exchange_s``) instead of the schedule. Every row names its panel (``family``).
    """
    grad = sum(x.grad_bytes for x in layers)
    rows = []
    tuning = tuning or methods.tuning()

    waits = {n: stragglers.wait_factor(stragglers.described(n, {r: f for r, f in (slow or {}).items() if r < n},
                                                            straggler_cv), n) for n in workers}

    def add(n, arch, res, family):
        wait = compute_s * (waits[n] - 1.0)
        step = res.step_s + wait
        rows.append(Projected(workers=n, arch=arch, family=family, comm_s=res.comm_s, overlap=res.overlap,
                              straggler_s=wait, step_s=step, efficiency=compute_s / step))

    for n in workers:
        for model in methods.schedulers():
            for label, res in model.generic_rows(layers, compute_s, n, nets, tuning, shards, per_server):
                add(n, label, res, model.panel)
        for label, (method, net, mode, settings) in (own or {}).items():
            add(n, label, _own_step(method, net, mode, settings, layers, compute_s, n, grad, tuning),
                method.cost.panel)
        for label, (overlap, cost) in (measured or {}).items():
            generic = methods.panel_of(cost)
            t = generic.generic_exchange_s(n, grad, nets, shards[0], per_server)
            step = compute_s + (1 - overlap) * t
            add(n, label, Scheduled(step_s=step, comm_s=t, exposed_s=step - compute_s, buffers=0, overlap=overlap),
                generic.panel)
    return rows


def _own_step(method, net, mode, settings, layers, compute_s, n, grad, tuning):
    """A method's own rows: its step model in ``mode`` at its own ``settings`` on its own fit ``net``,
    as a schedule."""
    row = StepShape(workers=n, compute_s=compute_s, grad_bytes_per_step=grad, backend=method.name, mode=mode,
                    settings=settings)
    step, _ = method.cost.projected_step(row, None, layers, Everywhere(net), methods.tuning_at(row, tuning))
    t = method.cost.exchange_s(row, Everywhere(net)) or 0.0
    return Scheduled(step_s=step, comm_s=t, exposed_s=step - compute_s, buffers=0,
                     overlap=max(0.0, min(1.0, (compute_s + t - step) / t)) if t else 0.0)


@dataclasses.dataclass(frozen=True)
class Checked:
    """One multi-worker run set against the projection: its measured step, the model's for its
    shape, their ratio, and how the model reached its figure."""
    run: str
    backend: str
    mode: Optional[str]
    workers: int
    tasks: Tuple[Tuple[str, int], ...]
    how: str
    measured_step_s: float
    projected_step_s: float
    ratio: float


def run_exchange_s(row, nets):
    """The run's exchange time per step: measured where the backend times it, else the alpha-beta
    cost of its method (hvdps/methods.py)."""
    if row.exchange_s:
        return row.exchange_s, "measured"
    method = row.method
    t = method.cost.exchange_s(row, nets) if method else None
    return (t, "alpha-beta") if t is not None else (None, None)


def measured_overlap(row, exchange_s):
    """(compute + exchange - step) / exchange, clipped to [0, 1]: how much of the exchange the run hid."""
    if not exchange_s or not row.compute_s or not row.step_s:
        return None
    return max(0.0, min(1.0, (row.compute_s + exchange_s - row.step_s) / exchange_s))


# ------------------------------------------------- projected against measured
# What TCP carries of a link's rate: 1448 payload bytes (IPv4, TCP with timestamps) per 1514-byte
# frame of a 1500-byte MTU, the bytes tbf counts.
TCP_GOODPUT = 1448 / 1514


def projected_step(row, shard_bytes, layers, nets, tuning):
    """(the step time the network model gives this run, how): its own compute, its gradient M, its
    worker count n and, for a method with server tasks, the bytes each holds (``RunRow.shard_bytes``), by
    its method's step model (hvdps/methods.py); (None, None) for a method this version lacks."""
    method = row.method
    if method is None:
        return None, None
    return method.cost.projected_step(row, shard_bytes, layers, nets, methods.tuning_at(row, tuning))

