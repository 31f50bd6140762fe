"""A cluster whose workers do not keep one pace, projected.

Each worker's own step is a distribution: a mean and a spread, as multiples of a healthy worker's
(``Pace``). It is described (a slow worker at F, a stalled one, the per-step noise
``--straggler_cv``) or measured (each rank's ranks/<task>.json). How the job's step follows from
the workers' is each method's answer to how many workers a step waits for
(hvdps/cost/model.py, ``CostModel.waits_for``):

- a step that waits for w of the n workers lasts as long as the w-th fastest of them: the expected
  w-th order statistic of the n distributions. Every ring and sync PS wait for all n (the slowest);
- asynchronous workers wait for nobody: each steps at its own pace, and the job's rate is the sum
  of theirs, up to what the resources they share carry (the busiest PS link's round). Sync PS
  workers with backups, as TensorFlow runs them, do not wait for all either: an update per n
  pushes, its tokens to whoever asks (``CostModel.unwaited_step``: ps_train/tokens.py plays the
  queue out, its updates no closer than the chief's round trip over its own link), not the textbook
  backup worker's (n - K)-th order statistic.

A slow link is the same question on the network: each term of a method's step crosses a link the
method names (``CostModel.link_terms``: a worker's own, the servers', or the slowest of the job's,
where a ring moves at its slowest link's pace), and each worker's step is costed on its own.
"""
import dataclasses
import math
from statistics import NormalDist
from typing import Dict, List, Optional, Sequence

import numpy as np

from hvdps import methods
from hvdps.cost.model import Everywhere, combine, summed_rates_step
from hvdps.cost.schedule import AlphaBeta

Z95 = NormalDist().inv_cdf(0.95)
GRID = 2001                    # points the order statistic is integrated over


@dataclasses.dataclass(frozen=True)
class Pace:
    """One worker's step as a multiple of a healthy worker's: its mean and standard deviation.
    ``whole``: the factor holds the whole process (a stall: SIGSTOP stops its exchange too), not
    only its compute (a CPU quota: the exchange waits on the links, not on the CPU)."""
    mean: float = 1.0
    sd: float = 0.0
    whole: bool = False
    duty: float = 1.0            # the share of each CPU period its quota lets it run (1: no quota)
    period_s: float = 0.0        # that period (cgroup cpu.cfs_period_us)
    stop_s: float = 0.0          # a stall's one stop (FOR), for a job whose other workers go on meanwhile
    cpu_s: float = 0.0           # its process's CPU seconds per step, measured healthy (0: not measured)


def quota_floor_s(pace):
    """The shortest step a process that needs ``pace.cpu_s`` of CPU a step can make in a quota of
    ``pace.duty`` cores: the kernel runs it no more than that (0 without a quota or a measure). For a
    rank that blocks while it waits, the CPU a step needs is more than the compute: TensorFlow's gRPC
    and collective threads serialise, send and reduce, and in a quota they wait for the CPU too."""
    if pace.duty >= 1.0 or pace.cpu_s <= 0.0:
        return 0.0
    return pace.cpu_s / pace.duty


def throttled_wait_s(pace):
    """The expected time a rank in a CPU quota waits to run when its peers' data arrives, for a
    rank that spins while it waits: the spinning spends its quota early in each period, so the
    moment it must act falls in the throttled part (1 - duty) of the period with that probability,
    and then waits half of it on average, (1 - duty)^2 x period / 2 (the kernel's CFS bandwidth
    control, not a fit)."""
    return (1.0 - pace.duty) ** 2 * pace.period_s / 2.0


def stalled_factor(pace, overlap_s):
    """What a stalled worker's stops make of its step in a lock-step job: 1 / (1 - the share of the
    time the job loses). A stop of ``pace.stop_s`` costs the job its length less ``overlap_s``, what
    the other workers' exchange does meanwhile (``CostModel.continues_without``: nothing in a ring,
    the others' pushes through a PS link); without a stop length, the whole stopped share."""
    share = 1.0 - 1.0 / pace.mean
    if pace.stop_s > 0:
        share *= max(0.0, 1.0 - overlap_s / pace.stop_s)
    return 1.0 / (1.0 - share)


def described(n, slow=None, cv=0.0, stalled=None):
    """n workers' paces: healthy ones at 1, each ``slow`` {rank: F} at F, a ``stalled`` {rank:
    (every_ms, for_ms)} at every / (every - for) of the whole process (it runs that share of the
    time); each with the per-step coefficient of variation ``cv``."""
    slow, stalled = slow or {}, stalled or {}
    out = []
    for i in range(n):
        if i in stalled:
            every, stop = stalled[i]
            mean = every / (every - stop)
            out.append(Pace(mean, cv * mean, whole=True, stop_s=stop / 1e3))
        else:
            mean = float(slow.get(i, 1.0))
            out.append(Pace(mean, cv * mean))
    return out


def measured(quantiles, reference):
    """A pace per rank from its measured step times (ranks/<task>.json's p50 and p95: a normal with
    that median and that 95th percentile) over ``reference`` seconds, a healthy worker's step."""
    return [Pace(q.p50 / reference, max(0.0, q.p95 - q.p50) / Z95 / reference) for q in quantiles]


def _normal_cdf(x, mean, sd):
    if sd <= 0:
        return (x >= mean).astype(float)
    with np.errstate(over="ignore"):          # a subnormal sd: +-inf, and erf's limit is the point's step
        return 0.5 * (1.0 + np.vectorize(math.erf)((x - mean) / (sd * math.sqrt(2.0))))


def _binomial(m, p):
    """pmf of Binomial(m, p) at 0..m for each p of an array: shape (len(p), m + 1)."""
    k = np.arange(m + 1)
    logfact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, m + 1)))])
    logc = logfact[m] - logfact[k] - logfact[m - k]
    p = np.clip(p, 0.0, 1.0)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        logpmf = logc + k * np.log(p) + (m - k) * np.log1p(-p)
    pmf = np.exp(np.nan_to_num(logpmf, nan=-np.inf))
    pmf[p[:, 0] == 0.0, 0] = 1.0
    pmf[p[:, 0] == 1.0, m] = 1.0
    return pmf


def _convolve_rows(a, b):
    """Row i is ``np.convolve(a[i], b[i])``: at each point of the grid, the distribution of how many
    workers are at or below it, two independent groups summed. One pass per column of the narrower
    array, not one call per grid point: the projection asks for many order statistics."""
    if a.shape[1] > b.shape[1]:
        a, b = b, a
    out = np.zeros((a.shape[0], a.shape[1] + b.shape[1] - 1))
    for i in range(a.shape[1]):
        out[:, i:i + b.shape[1]] += a[:, i:i + 1] * b
    return out


def order_statistic(values, k):
    """E[X_(k)], the expected k-th smallest of independent normals ``values`` ((mean, sd) each; an sd
    of 0 is a point), k from 1 (the fastest) to n (the slowest). Workers with the same distribution
    are counted together (a binomial), so 512 workers cost what a few groups do."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    if all(sd <= 0 for _, sd in values):
        return sorted(m for m, _ in values)[k - 1]
    groups = {}
    for v in values:
        groups[v] = groups.get(v, 0) + 1
    lo = min(m - 8 * sd for m, sd in values)
    hi = max(m + 8 * sd for m, sd in values)
    x = np.linspace(lo, hi, GRID)
    count = np.zeros((GRID, 1))
    count[:, 0] = 1.0                      # P(none of the workers so far is <= x)
    for (mean, sd), m in groups.items():
        count = _convolve_rows(count, _binomial(m, _normal_cdf(x, mean, sd)))
    at_least_k = count[:, k:].sum(axis=1)   # P(X_(k) <= x)
    # E[X] = lo + integral of P(X > x) from lo, where P(X <= lo) is nil
    integrate = getattr(np, "trapezoid", None) or np.trapz      # numpy 2, or 1 (TF 2.15's stack)
    return float(lo + integrate(1.0 - at_least_k, x))


def wait_factor(paces, waits):
    """The step a lock-step job takes over a healthy worker's when it waits for ``waits`` of its
    workers: the expected waits-th fastest pace."""
    return order_statistic([(p.mean, p.sd) for p in paces], waits)


def kept(paces, waits, healthy=None, unwaited=summed_rates_step):
    """The share of the healthy job's throughput a job of these workers keeps, where a step waits
    for ``waits`` of them (None: none, each at its own pace, the round of their steps as
    ``unwaited`` plays it out: ``CostModel.unwaited_step``, the summed rates by default);
    ``healthy``: the healthy workers' paces (their per-step noise is paid healthy too), all 1 by
    default."""
    healthy = healthy or [Pace() for _ in paces]
    if waits is None:
        return unwaited([p.mean for p in healthy]) / unwaited([p.mean for p in paces])
    return wait_factor(healthy, waits) / wait_factor(paces, waits)


# ------------------------------------------------------------------ a method's step
def _terms(cost, row, nets, roles, task, layers, tuning, shard_bytes):
    """The method's step terms as worker ``task`` pays them: each term costed on the link it crosses
    (``cost.link_terms``): the worker's own, the servers' (the slowest PS host's), or the job's
    slowest (a ring's pace)."""
    kinds = getattr(cost, "link_terms", {})
    out = {}
    for kind in dict.fromkeys([*kinds.values(), "slowest"]):
        net = nets(kind, task)
        terms = cost.step_terms(row, shard_bytes, layers, Everywhere(net), methods.tuning_at(row, tuning))
        if terms is None:
            return None
        for name, term in terms.items():
            if kinds.get(name, "slowest") == kind:
                out[name] = term
    return out


@dataclasses.dataclass(frozen=True)
class Step:
    """A job's step on a cluster: each worker's own step (seconds, its mean) and the job's (the
    waited-for order statistic, or for workers that do not wait the round their method plays out:
    ``CostModel.unwaited_step``)."""
    workers: List[float]
    step_s: float
    waits: Optional[int]


def job_step(row, paces, compute_s, nets, roles=None, layers=None, tuning=None, shard_bytes=None, factors=None):
    """The step of ``row``'s method (its backend, mode, workers, gradient) when its workers keep
    ``paces``: each worker's own step is its method's (``combine`` of its terms) with its compute
    at its pace (the whole step for a stalled one), and the job's as ``waits_for`` says.

    ``nets(kind, task)``: the alpha-beta network of a link kind ("own", "server", "slowest") for the
    worker ``task``; ``roles``: {task: host}, for the worker names; ``tuning``: the methods' declared
    knobs (hvdps/methods.py: ``Tuning``; their defaults if None); ``factors``: {term: factor} each
    such term's seconds are multiplied by, on every worker (``measured_term``)."""
    method = row.method
    tuning = tuning or methods.tuning()
    cost = method.cost
    n = row.workers or 1
    # every term is costed with the compute given, not the row's own: a held-out run's compute was
    # measured with its condition (or not at all, in a run that failed before its probe)
    row = dataclasses.replace(row, compute_s=compute_s)
    prefix = "worker" if not cost.collective else "rank"
    waits = cost.waits_for(row.mode, n)
    own, spread, shared, costed = [], [], 0.0, []
    for i, pace in enumerate(paces):
        terms = _terms(cost, row, nets, roles, f"{prefix}:{i}", layers, tuning, shard_bytes)
        if terms is None:
            return None
        terms = {k: (w, s * (factors or {}).get(k, 1.0)) for k, (w, s) in terms.items()}
        compute = compute_s * (1.0 if pace.whole else pace.mean)
        if waits is None:
            # asynchronous: a term that does not wait for the compute is a resource the workers share
            # (the busiest PS link, n steps' worth a round); it caps the job's rate, not each worker's
            mine = {k: v for k, v in terms.items() if v[0]} or terms
            shared = max([shared, *(combine(0.0, {k: v}) for k, v in terms.items() if not v[0])])
        else:
            mine = terms
        t = combine(compute, mine)
        if pace.whole:
            overlap = cost.continues_without(row.mode, n, mine) if waits is not None else 0.0
            t *= stalled_factor(pace, overlap)
        if cost.polls and pace.duty < 1.0:
            t += cost.wait_points(row.mode, n) * throttled_wait_s(pace)
        elif not cost.polls:
            # a rank that spins is on the CPU for all of its step whatever it needs (the two costs
            # above); one that blocks needs its measured CPU, which the quota stretches
            t = max(t, quota_floor_s(pace))
        own.append(t)
        spread.append(compute_s * pace.sd)
        costed.append(mine)
    if waits is None:
        return Step(workers=own, step_s=max(cost.unwaited_step(row.mode, own, terms=costed), shared), waits=None)
    return Step(workers=own, step_s=order_statistic(list(zip(own, spread)), waits), waits=waits)


def measured_term(row, compute_s, nets, measured_s, layers=None, tuning=None, shard_bytes=None):
    """{term: factor} that makes a lock-step job's modelled healthy step its measured one
    (``measured_s``), on the term that sets the step, or {} where no term can: the healthy twin
    measures that term, the link or exchange every worker waits for. A condition that leaves the term
    as it was (a slow link elsewhere: sync PS's PS link beside its slow worker's own) keeps the twin's
    measure of it, and one that changes it (the ring on its slowest link) scales the measure."""
    cost = row.method.cost
    n = row.workers or 1
    if not measured_s or cost.waits_for(row.mode, n) is None:
        return {}
    row = dataclasses.replace(row, compute_s=compute_s)
    prefix = "worker" if not cost.collective else "rank"
    terms = _terms(cost, row, nets, None, f"{prefix}:0", layers, tuning or methods.tuning(), shard_bytes)
    if not terms:
        return {}
    name = max(terms, key=lambda k: combine(compute_s, {k: terms[k]}))
    waits, seconds = terms[name]
    rest = measured_s - (compute_s if waits else 0.0)
    return {name: rest / seconds} if seconds > 0 and rest > 0 else {}


def link_networks(alpha, rates, roles, default_bps, goodput, cost):
    """``nets`` for ``job_step`` on an emulated cluster: {host: rate} (cluster.json ``rates``) and the
    run's {task: host}, split into its servers' and its workers' hosts by the method's cost model
    (``CostModel.split_roles``); a link's alpha-beta is its rate at TCP's goodput and the cluster's latency."""
    def rate(host):
        return (rates or {}).get(host, default_bps)

    hosts = dict(roles or {})
    servers, workers = cost.split_roles(hosts)

    def nets(kind, task):
        if kind == "own" and task in hosts:
            bps = rate(hosts[task])
        elif kind == "server" and servers:
            bps = min(rate(h) for h in servers)
        else:
            bps = min([rate(h) for h in workers + servers] or [default_bps])
        return AlphaBeta(bandwidth=bps / 8 * goodput, alpha=alpha)

    return nets


# ------------------------------------------------------------------ held out: measured unhealthy runs
def stopped_share(unhealthy, interval):
    """The share of ``interval`` ((start, end), Unix time) the stalled worker spent stopped, from its
    record's stops (``Unhealthy.stopped_at``), or None where the record lists none one by one. Over
    an interval of a few periods that share is not FOR / EVERY: one stop more or less, by where the
    interval falls in the period, moves it by up to FOR / the interval."""
    if unhealthy is None or unhealthy.stopped_at is None or interval is None or interval[1] <= interval[0]:
        return None
    begin, end = interval
    stopped = sum(max(0.0, min(end, b) - max(begin, a)) for a, b in unhealthy.stopped_at)
    return stopped / (end - begin)


def paces_of(unhealthy, workers, compute_alone_s, compute_s, interval=None, cpu_s=None):
    """The paces a comparison's record of what it did (common/formats/schemas.py: Unhealthy) describes:
    a worker in a CPU quota of q cores takes compute_alone / q for the compute the probe timed alone
    (the healthy workers' ``compute_s``, contended where they share cores, when that is longer), and
    no less than the CPU its process needed a step on the healthy twin over q (``cpu_s``: {worker
    index: seconds}, ranks/<task>.json); a stalled one runs the share of the run's measured
    ``interval`` it was not stopped in (its recorded stops), else (every - for) / every of the time;
    None: a healthy run, or a slow link (every worker at its pace; the link is in the network).
    What was done to the worker and when is the condition, not a measurement of its effect: it may
    enter the prediction."""
    if unhealthy is None or unhealthy.rate_bps:
        return described(workers)
    if unhealthy.every_ms and unhealthy.for_ms:
        paces = described(workers, stalled={unhealthy.rank: (unhealthy.every_ms, unhealthy.for_ms)})
        share = stopped_share(unhealthy, interval)
        if share is not None and unhealthy.rank < workers:
            paces[unhealthy.rank] = dataclasses.replace(paces[unhealthy.rank], mean=1.0 / (1.0 - min(share, 0.99)))
        return paces
    factor = unhealthy.factor or 1.0
    if unhealthy.quota_us and unhealthy.period_us and compute_alone_s and compute_s:
        factor = max(1.0, compute_alone_s * unhealthy.period_us / unhealthy.quota_us / compute_s)
    paces = described(workers, slow={unhealthy.rank: factor})
    if unhealthy.quota_us and unhealthy.period_us and unhealthy.rank < workers:
        paces[unhealthy.rank] = dataclasses.replace(paces[unhealthy.rank],
                                                    duty=min(1.0, unhealthy.quota_us / unhealthy.period_us),
                                                    period_s=unhealthy.period_us / 1e6,
                                                    cpu_s=(cpu_s or {}).get(unhealthy.rank) or 0.0)
    return paces


@dataclasses.dataclass(frozen=True)
class Held:
    """One run on an unhealthy cluster (a slow or stalled worker, or a slow link) against the same
    method's healthy run: the throughput each measured (its median logging interval's; for a stall,
    the samples over its whole measured interval), what the model keeps of the healthy one
    (``kept_model``, its step on the healthy cluster over its step on this one), the throughput that
    predicts (healthy measured x kept_model) and measured / predicted."""
    run: str
    healthy_run: str
    backend: str
    mode: Optional[str]
    workers: int
    condition: str
    waits: Optional[int]
    healthy_samples_per_sec: float
    measured_samples_per_sec: float
    kept_measured: float
    kept_model: float
    predicted_samples_per_sec: float
    ratio: float


def held(run, healthy, condition, paces, compute_s, nets_healthy, nets, layers, tuning, kept=None):
    """``Held`` for one unhealthy run (a RunRow with samples/s and a shape) and its healthy twin, on
    the healthy cluster's network and its own; None where the method has no step model. ``kept``:
    (healthy, run) samples/s as hvdps/measure/rows.py's kept_rates takes them (the report's "keeps"
    too), else each row's median."""
    base = job_step(healthy, described(healthy.workers or 1), compute_s, nets_healthy, layers=layers,
                    tuning=tuning, shard_bytes=healthy.shard_bytes)
    factors = {}
    if base is not None and healthy.step_s and run.method.cost.polls:
        # a rank that spins while it waits is on the CPU for all of its step: what the model does not
        # put on the network (the healthy twin's measured step less the model's: the training loop,
        # the library's own bookkeeping) is its own work, slowed by a quota as its compute is
        compute_s = compute_s + max(0.0, healthy.step_s - base.step_s)
        base = job_step(healthy, described(healthy.workers or 1), compute_s, nets_healthy, layers=layers,
                        tuning=tuning, shard_bytes=healthy.shard_bytes)
    elif base is not None:
        # a rank that blocks (TensorFlow's gRPC) is not on the CPU while it waits: what the model
        # misses of a lock-step twin is in the term every worker waited for, as the twin measured it
        factors = measured_term(healthy, compute_s, nets_healthy, healthy.step_s, layers, tuning,
                                healthy.shard_bytes)
        if factors:
            base = job_step(healthy, described(healthy.workers or 1), compute_s, nets_healthy, layers=layers,
                            tuning=tuning, shard_bytes=healthy.shard_bytes, factors=factors)
    slow = job_step(run, paces, compute_s, nets, layers=layers, tuning=tuning,
                    shard_bytes=run.shard_bytes, factors=factors)
    h, m = kept if kept else (healthy.samples_per_sec_median, run.samples_per_sec_median)
    if base is None or slow is None or not h or not m:
        return None
    kept_model = base.step_s / slow.step_s
    return Held(run=run.name, healthy_run=healthy.name, backend=run.backend, mode=run.mode,
                workers=run.workers or 1, condition=condition, waits=slow.waits, healthy_samples_per_sec=h,
                measured_samples_per_sec=m, kept_measured=m / h, kept_model=kept_model,
                predicted_samples_per_sec=h * kept_model, ratio=m / (h * kept_model))
