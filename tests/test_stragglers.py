"""hvdps/cost/stragglers.py: order statistics of the workers' paces, what each method keeps, and a
run on an unhealthy cluster predicted from its healthy twin."""
import dataclasses
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from common.formats.schemas import StepQuantiles, Unhealthy
from hvdps import methods
from hvdps.cost import stragglers as s
from hvdps.cost.projection import single_layer
from hvdps.cost.schedule import AlphaBeta
from hvdps.measure.rows import RunRow

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("values, k, expected, tol", [
    ([(0, 1), (0, 1)], 2, 1 / math.sqrt(math.pi), 1e-4),         # E[max of 2 standard normals]
    ([(0, 1), (0, 1)], 1, -1 / math.sqrt(math.pi), 1e-4),        # and of the min
    ([(0, 1)] * 3, 3, 3 / (2 * math.sqrt(math.pi)), 1e-4),       # E[max of 3] = 1.5/sqrt(pi)
    ([(5, 0), (1, 0), (3, 0)], 1, 1, 0), ([(5, 0), (1, 0), (3, 0)], 2, 3, 0), ([(5, 0), (1, 0), (3, 0)], 3, 5, 0),
    ([(1, 0.001), (4, 0.001)], 2, 4, 1e-3),                     # one far slower worker: its own pace
    ([(1, 0.001), (4, 0.001)], 1, 1, 1e-3),                     # a backup outruns it
])
def test_order_statistic(values, k, expected, tol):
    assert s.order_statistic(values, k) == pytest.approx(expected, abs=tol)


@pytest.mark.parametrize("n, cv, low, high", [
    (1, 0.03, 1.0, 1.0), (2, 0.0, 1.0, 1.0), (2, 0.03, 1.01, 1.02), (128, 0.03, 1.07, 1.08),
    (512, 0.03, 1.09, 1.095),
])
def test_wait_for_the_slowest_of_n_noisy_workers(n, cv, low, high):
    assert low <= s.wait_factor(s.described(n, cv=cv), n) <= high


@pytest.mark.parametrize("n, slow, stalled, waits, expected", [
    (2, {1: 4}, None, 2, 0.25),                     # every ring, sync PS: the slow worker's pace
    (4, {1: 4}, None, 4, 0.25),
    (2, {1: 4}, None, None, (1 + 1 / 4) / 2),       # asynchronous: the rates add up
    (4, {1: 2}, None, None, (3 + 1 / 2) / 4),
    (2, {1: 4}, None, 1, 1.0),                      # one backup outruns one slow worker
    (4, {0: 2, 1: 3}, None, 3, 0.5),               # two slow, one backup: the second slowest
    (2, None, {1: (1000, 250)}, 2, 0.75),          # stalled a quarter of the time
    (4, None, {1: (1000, 250)}, None, (3 + 0.75) / 4),
    (2, {1: 1}, None, 2, 1.0),                      # F = 1 is healthy
])
def test_kept_is_the_textbook_model(n, slow, stalled, waits, expected):
    assert s.kept(s.described(n, slow=slow, stalled=stalled), waits) == pytest.approx(expected, rel=1e-6)


def test_measured_paces_are_normals_through_the_median_and_95th_percentile():
    q = [StepQuantiles(n=10, p50=0.010, p95=0.010, max=0.02), StepQuantiles(n=10, p50=0.040, p95=0.040 + s.Z95 * 0.01, max=1)]
    paces = s.measured(q, 0.010)
    assert [p.mean for p in paces] == pytest.approx([1, 4])
    assert [p.sd for p in paces] == pytest.approx([0, 1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 2)), min_size=1, max_size=6), st.data())
def test_order_statistics_are_ordered_and_bounded(values, data):
    n = len(values)
    got = [s.order_statistic(values, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-6 for a, b in zip(got, got[1:]))
    spread = max(sd for _, sd in values)
    assert min(m for m, _ in values) - 4 * spread - 1e-6 <= got[0]
    assert got[-1] <= max(m for m, _ in values) + 4 * spread + 1e-6


@pytest.mark.parametrize("sd", [0.0, 5e-324, 1e-310])
def test_a_point_or_a_subnormal_spread_is_a_step_without_a_warning(sd):
    """Hypothesis drew an sd of 5e-324: x / sd overflowed to inf, which numpy warned of on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert s._normal_cdf(np.array([0.5, 2.0]), 1.0, sd).tolist() == [0.0, 1.0]


# ------------------------------------------------------------------ a method's step on a cluster
M = 1_000_000       # gradient bytes per step


def row(backend, mode, n=2, sps=1000.0, name=None, compute=0.01, num_ps=None, step=None):
    """A run's row as hvdps/measure/rows.py reads it (frozen: the model replaces, never sets)."""
    return RunRow(run_dir=name or f"{backend}-{mode}", backend=backend, mode=mode, workers=n, compute_s=compute,
                  grad_bytes_per_step=M, samples_per_sec_median=sps, tasks=(("ps", num_ps),) if num_ps else (), step_s=step)


RING_ROLES = {"rank:0": "a", "rank:1": "b"}
PS_ROLES = {"ps:0": "p", "worker:0": "a", "worker:1": "b"}


def links(rates, roles, bps=8e6):
    """The links of a ring's ranks or of a PS job's tasks, split into servers and workers by that
    family's cost model (bare MPI's ring, classic PS)."""
    return s.link_networks(0.0, rates, roles, bps, 1.0, methods.get("ps" if roles is PS_ROLES else "mpi").cost)


@pytest.mark.parametrize("backend, mode, roles, rates, expected", [
    # a ring of 2 moves M/B each way at its slowest link's pace: 1 MB at 1 MB/s, then 0.1 MB/s
    ("mpi", "sync", RING_ROLES, {}, 0.01 + 1.0),
    ("mpi", "sync", RING_ROLES, {"b": 0.8e6}, 0.01 + 10.0),
    # sync PS: every worker pushes and pulls M on its own link; the slowest worker sets the step
    ("ps", "sync", PS_ROLES, {}, 0.01 + 2 * max(2 * M / 1e6, M / 1e6)),
    ("ps", "sync", PS_ROLES, {"b": 0.8e6}, 0.01 + 2 * M / 1e5),
    # async PS: the fast worker's rate plus the slow one's, each on its own link
    ("ps", "async", PS_ROLES, {"b": 0.8e6}, 2 / (1 / max(0.01 + 2.0, 2.0) + 1 / (0.01 + 20.0))),
    # one backup: as async, the workers' summed rates (a fast worker takes the slow one's tokens)
    ("ps", "backup1", PS_ROLES, {"b": 0.8e6}, 2 / (1 / max(0.01 + 2.0, 2.0) + 1 / (0.01 + 20.0))),
    # ... unless the slow link is the chief's: its round trip between updates, p^2 / S with p its push
    ("ps", "backup1", PS_ROLES, {"a": 0.8e6}, 10.0 ** 2 / (0.01 + 20.0)),
])
def test_job_step_on_links_of_their_own(backend, mode, roles, rates, expected):
    step = s.job_step(row(backend, mode), s.described(2), 0.01, links(rates, roles), roles)
    assert step.step_s == pytest.approx(expected, rel=1e-3)     # the token queue, played out over 240 updates


def test_a_slow_workers_compute_and_a_stalled_workers_whole_step():
    nets = lambda kind, task: AlphaBeta(bandwidth=1e6, alpha=0.0)    # noqa: E731
    slow = s.job_step(row("mpi", "sync"), s.described(2, slow={1: 4}), 0.5, nets)
    assert slow.step_s == pytest.approx(4 * 0.5 + 1.0)             # its compute only; the ring as before
    stalled = s.job_step(row("mpi", "sync"), s.described(2, stalled={1: (1000, 500)}), 0.5, nets)
    assert stalled.step_s == pytest.approx(2 * (0.5 + 1.0))          # half the time: its whole step


# A rank in a CPU quota whose ranks spin while they wait (bare MPI, Horovod, local SGD) spends the
# quota spinning and is throttled for the rest of the period; each time its neighbour's data arrives it
# then waits, on average, (1 - duty)^2 x period / 2 before it can act on it: at a quarter of a core in
# 10 ms periods, 2.8125 ms. A ring of n makes 2(n - 1) such transfers a step, local SGD once in k steps;
# ranks that block (gRPC: TensorFlow's ring and every PS) pay nothing for it.
QUARTER = s.Pace(mean=4.0, duty=0.25, period_s=0.010)
WAIT = 0.75 ** 2 * 0.010 / 2


@pytest.mark.parametrize("pace, expected", [(QUARTER, WAIT), (s.Pace(duty=0.5, period_s=0.1), 0.0125),
                                            (s.Pace(), 0.0), (s.Pace(duty=1.0, period_s=0.1), 0.0)])
def test_a_throttled_ranks_wait_for_its_next_period(pace, expected):
    assert s.throttled_wait_s(pace) == pytest.approx(expected)


@pytest.mark.parametrize("backend, mode, n, points", [
    ("mpi", "sync", 2, 2), ("horovod", "sync", 2, 2), ("mpi", "sync", 4, 6),
    ("localsgd", "8", 2, 2 / 8), ("localsgd", "1", 4, 6),
    ("mwms", "sync", 2, 0), ("ps", "sync", 2, 0), ("ps", "async", 2, 0)])
def test_a_rank_that_spins_while_it_waits_pays_its_quotas_periods(backend, mode, n, points):
    nets = lambda kind, task: AlphaBeta(bandwidth=1e6, alpha=0.0)    # noqa: E731
    slow = {1: 4.0}
    plain = s.job_step(row(backend, mode, n=n), s.described(n, slow=slow), 0.5, nets, layers=single_layer(M))
    paces = s.described(n, slow=slow)
    paces[1] = QUARTER
    throttled = s.job_step(row(backend, mode, n=n), paces, 0.5, nets, layers=single_layer(M))
    assert throttled.workers[1] - plain.workers[1] == pytest.approx(points * WAIT)
    assert throttled.workers[0] == plain.workers[0]


@pytest.mark.parametrize("backend, mode, cpu_s, floor", [
    # TensorFlow's ring and a PS worker block while they wait: a step that needs 1 s of the process's
    # CPU lasts at least 1 / 0.25 = 4 s in a quarter of a core, longer than the model's 0.5 x 4 s of
    # compute and 1 s (the ring) or 4 s (the PS worker's push and pull) of exchange
    ("mwms", "sync", 1.0, 4.0), ("ps", "sync", 2.0, 8.0), ("ps", "async", 2.0, 8.0),
    # a CPU need under the modelled step changes nothing; unmeasured (0) is no floor
    ("mwms", "sync", 0.5, None), ("mwms", "sync", 0.0, None),
    # a rank that spins is on the CPU all its step whatever it needs: its quota's costs are the two above
    ("mpi", "sync", 1.0, None), ("horovod", "sync", 1.0, None),
])
def test_a_blocking_ranks_quota_runs_the_cpu_its_step_needs_no_faster(backend, mode, cpu_s, floor):
    nets = lambda kind, task: AlphaBeta(bandwidth=1e6, alpha=0.0)    # noqa: E731
    job = row(backend, mode)
    plain = s.job_step(job, [s.Pace(), dataclasses.replace(QUARTER)], 0.5, nets, layers=single_layer(M))
    need = s.job_step(job, [s.Pace(), dataclasses.replace(QUARTER, cpu_s=cpu_s)], 0.5, nets, layers=single_layer(M))
    assert need.workers[0] == plain.workers[0]
    assert need.workers[1] == pytest.approx(floor if floor else plain.workers[1])
    assert s.quota_floor_s(s.Pace(cpu_s=cpu_s)) == 0.0                 # no quota: no floor


def test_the_slowed_workers_cpu_comes_from_its_healthy_twin():
    record = Unhealthy(condition="slow1x4", what="w", rank=1, factor=4, quota_us=2500, period_us=10000)
    paces = s.paces_of(record, 2, 0.01, 0.01, cpu_s={0: 0.03, 1: 0.02})
    assert [p.cpu_s for p in paces] == [0.0, 0.02] and s.quota_floor_s(paces[1]) == pytest.approx(0.08)
    assert s.paces_of(record, 2, 0.01, 0.01)[1].cpu_s == 0.0


def test_held_costs_the_run_with_its_twins_compute_not_its_own():
    """A held-out run's own compute was measured with its condition, or not at all (a run that failed
    before its probe): the prediction is the same whatever it recorded."""
    nets = links({}, RING_ROLES)
    healthy = row("horovod", "sync", sps=1000, name="horovod-sync-w2")
    got = [s.held(row("horovod", "sync", sps=600, name="horovod-sync-w2-slow1x4", compute=c), healthy, "slow",
                  s.described(2, slow={1: 4}), 0.01, nets, nets, single_layer(M), methods.tuning(fusion_bytes=64 << 20))
           for c in (None, 0.01, 0.5)]
    assert got[0] is not None and got[0].kept_model == got[1].kept_model == got[2].kept_model < 1


@pytest.mark.parametrize("backend, mode, healthy_step, slow_rates, kept", [
    # bare MPI's ranks spin: the 0.1 s its healthy twin measured beyond the model's 1.01 s step (0.01 s
    # compute, 1 MB at 1 MB/s) is its own work, four times as long in a quarter of the CPU
    ("mpi", "sync", 1.11, None, 1.11 / (4 * 0.11 + 1.0)),
    ("mpi", "sync", 1.01, None, 1.01 / (4 * 0.01 + 1.0)),
    ("mpi", "sync", None, None, 1.01 / (4 * 0.01 + 1.0)),
    # TensorFlow's ring blocks in gRPC: the 0.19 s beyond the model is in the exchange every rank
    # waited for, not slowed by the quota
    ("mwms", "sync", 1.2, None, 1.2 / (4 * 0.01 + 1.19)),
    # sync PS's workers block too: the PS link (four pushes and pulls of 1 MB at 1 MB/s, 4 s) took
    # 4.99 s as the twin measured it, and 2.99 s where the model is pessimistic ...
    ("ps", "sync", 5.0, None, 5.0 / (4 * 0.01 + 4.99)),
    ("ps", "sync", 3.0, None, 3.0 / (4 * 0.01 + 2.99)),
    # ... and where a slow link, not the PS link, sets the step (b's own push and pull of 1 MB at
    # 0.1 MB/s), the twin's PS link is no part of it
    ("ps", "sync", 3.0, {"b": 0.8e6}, 3.0 / (0.01 + 20.0)),
    # asynchronous workers wait for no term: the model's steps as they are (their summed rates: 2.01 s
    # a step each, then b at 20.01 s)
    ("ps", "async", 5.0, {"b": 0.8e6}, 2.01 / (2 / (1 / 2.01 + 1 / 20.01))),
])
def test_a_twins_unmodelled_time_is_a_spinning_ranks_work_or_the_term_a_blocking_job_waited_for(
        backend, mode, healthy_step, slow_rates, kept):
    roles = RING_ROLES if backend in ("mpi", "mwms") else PS_ROLES
    healthy = row(backend, mode, sps=1000, name=f"{backend}-{mode}-w2", step=healthy_step)
    paces = s.described(2) if slow_rates else s.described(2, slow={1: 4})
    got = s.held(row(backend, mode, sps=500, name=f"{backend}-{mode}-w2-slow1x4"), healthy, "slow",
                 paces, 0.01, links({}, roles), links(slow_rates or {}, roles), single_layer(M),
                 methods.tuning(fusion_bytes=64 << 20))
    assert got.kept_model == pytest.approx(kept)


@pytest.mark.parametrize("backend, mode, measured, expected", [
    ("ps", "sync", 3.0, {"PS link": 2.99 / 4.0}),       # the PS link sets the step, not a worker's own
    ("mwms", "sync", 1.2, {"ring": 1.19 / 1.0}),
    ("ps", "sync", 0.005, {}),                          # under the compute: no term can be that short
    ("ps", "sync", None, {}),                           # nothing measured
    ("ps", "async", 3.0, {}),                           # the workers wait for no term
    ("ps", "backup1", 3.0, {}),
])
def test_the_measured_term_is_the_one_a_lockstep_twin_waited_for(backend, mode, measured, expected):
    roles = RING_ROLES if backend == "mwms" else PS_ROLES
    got = s.measured_term(row(backend, mode), 0.01, links({}, roles), measured, single_layer(M))
    assert got.keys() == expected.keys()
    assert all(got[k] == pytest.approx(v) for k, v in expected.items())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([("ps", "sync"), ("mwms", "sync")]), st.floats(1e-4, 100.0), st.floats(1e-4, 1.0),
       st.integers(2, 16))
def test_the_measured_term_brings_the_healthy_step_to_the_twins_or_to_the_next_term(method, measured, compute, n):
    """Scaled to the twin, the healthy step is the twin's where the model was short of it; where the
    model was long, the term comes down to the twin's or to the next longest term, never below both."""
    backend, mode = method
    roles = RING_ROLES if backend == "mwms" else PS_ROLES
    job, nets = row(backend, mode, n=n, compute=compute), links({}, roles)
    model = s.job_step(job, s.described(n), compute, nets, layers=single_layer(M)).step_s
    factors = s.measured_term(job, compute, nets, measured, single_layer(M))
    got = s.job_step(job, s.described(n), compute, nets, layers=single_layer(M), factors=factors).step_s
    if measured <= compute:
        assert factors == {} and got == model
    elif measured >= model:
        assert got == pytest.approx(measured)
    else:
        assert measured * (1 - 1e-9) <= got <= model * (1 + 1e-9)


@pytest.mark.parametrize("record, expected", [
    (None, [1, 1]),
    # 2,500 us of every 10,000 is a quarter of a core: the probe's 10 ms alone takes 40 ms, 4x the
    # 10 ms the healthy workers compute; with them contended to 20 ms, 2x
    (Unhealthy(condition="slow1x4", what="w", rank=1, factor=4, quota_us=2500, period_us=10000), [1, 4]),
    (Unhealthy(condition="slow1x4", what="w", rank=1, factor=4), [1, 4]),
    (Unhealthy(condition="stall1-1000-250", what="w", rank=0, every_ms=1000, for_ms=250), [4 / 3, 1]),
])
def test_paces_of_what_a_comparison_did(record, expected):
    assert [p.mean for p in s.paces_of(record, 2, 0.01, 0.01)] == pytest.approx(expected)


def test_a_quota_is_recorded_as_the_share_of_each_period_the_worker_runs():
    record = Unhealthy(condition="slow1x4", what="w", rank=1, factor=4, quota_us=2500, period_us=10000)
    paces = s.paces_of(record, 2, 0.01, 0.01)
    assert [(p.duty, p.period_s) for p in paces] == [(1.0, 0.0), (0.25, 0.01)]
    assert s.paces_of(Unhealthy(condition="slow1x4", what="w", rank=1, factor=4), 2, 0.01, 0.01)[1].duty == 1.0


def test_contended_healthy_workers_narrow_the_quotas_effect():
    record = Unhealthy(condition="slow1x4", what="w", rank=1, factor=4, quota_us=2500, period_us=10000)
    assert [p.mean for p in s.paces_of(record, 2, 0.01, 0.02)] == pytest.approx([1, 2])


def test_held_predicts_from_the_twin_and_never_from_the_run_itself():
    roles = RING_ROLES
    healthy, slow = row("mpi", "sync", sps=1000, name="mpi-sync-w2"), row("mpi", "sync", sps=120, name="mpi-sync-w2")
    got = s.held(slow, healthy, "b's link at 0.8 Mbit/s", s.described(2), 0.01, links({}, roles),
                 links({"b": 0.8e6}, roles), None, methods.tuning())
    kept = (0.01 + 1.0) / (0.01 + 10.0)
    assert got.kept_model == pytest.approx(kept)
    assert got.predicted_samples_per_sec == pytest.approx(1000 * kept)
    assert got.ratio == pytest.approx(120 / (1000 * kept))
    assert got.waits == 2 and got.kept_measured == pytest.approx(0.12)


def test_async_workers_share_the_ps_link_so_a_slow_one_leaves_it_to_the_others():
    """Four async workers whose rounds the PS link sets (4 MB a round at 1 MB/s): a worker three times
    slower leaves its share of the link to the others, and the job keeps its pace; the same worker
    costs its rate when the links do not bind."""
    nets = lambda kind, task: AlphaBeta(bandwidth=1e6, alpha=0.0)           # noqa: E731
    job = row("ps", "async", n=4)
    healthy = s.job_step(job, s.described(4), 0.5, nets).step_s
    slow = s.job_step(job, s.described(4, slow={1: 3}), 0.5, nets).step_s
    assert healthy == pytest.approx(4.0) and slow == pytest.approx(4.0)
    fast = lambda kind, task: AlphaBeta(bandwidth=1e9, alpha=0.0)           # noqa: E731
    h, u = (s.job_step(job, s.described(4, slow=x), 0.5, fast).step_s for x in (None, {1: 3}))
    assert h / u == pytest.approx((3 + 1 / 3) / 4, rel=0.01)


def _stalled(stopped_at):
    return Unhealthy(condition="stall1-1000-250", what="w", rank=1, every_ms=1000, for_ms=250, stopped_at=stopped_at)


STOPS = [[10.0, 10.25], [11.0, 11.25], [12.0, 12.25]]


@pytest.mark.parametrize("stopped_at, interval, share", [
    (STOPS, (10.0, 12.0), 0.25),          # whole periods: the nominal share
    (STOPS, (10.5, 11.75), 0.2),          # one stop in 1.25 s
    (STOPS, (10.3, 10.9), 0.0),           # between two stops: the stall never fell in it
    (STOPS, (10.1, 10.2), 1.0),
    ([], (10.0, 12.0), 0.0),              # a run that ended before the first stop
    (None, (10.0, 12.0), None),           # stops not listed (too many to keep): the nominal share
    (STOPS, None, None),                  # no measured interval
])
def test_a_stalls_share_is_what_it_stopped_in_the_measured_interval(stopped_at, interval, share):
    got = s.stopped_share(_stalled(stopped_at), interval)
    assert got == (pytest.approx(share) if share is not None else None)
    paces = s.paces_of(_stalled(stopped_at), 2, 0.01, 0.01, interval)
    nominal = 1000 / 750
    want = nominal if share is None else 1 / (1 - min(share, 0.99))
    assert paces[1].whole and paces[1].mean == pytest.approx(want) and paces[0].mean == 1.0


# Four workers on links of 1 MB/s with a 1 MB gradient and one PS: sync PS's step is its compute (0.5 s)
# and the PS link's 8 s (four pushes, then four pulls), of which the other three workers' pushes (3 s)
# go on while one worker is stopped. A ring's every transfer needs every rank: nothing goes on.
@pytest.mark.parametrize("backend, mode, stall, factor", [
    ("ps", "sync", (40_000, 10_000), 1 / (1 - 0.25 * (1 - 3 / 10))),     # each 10 s stop costs 7 s
    ("ps", "sync", (8_000, 2_000), 1.0),                                  # a 2 s stop is covered by the others' 3 s
    ("mpi", "sync", (40_000, 10_000), 40 / 30),                           # the whole stopped share
    ("horovod", "sync", (8_000, 2_000), 8 / 6),
])
def test_a_stall_costs_a_lock_step_job_its_length_less_what_the_others_exchange_meanwhile(backend, mode, stall, factor):
    nets = lambda kind, task: AlphaBeta(bandwidth=1e6, alpha=0.0)    # noqa: E731
    job = row(backend, mode, n=4, num_ps=1 if backend == "ps" else None)
    healthy = s.job_step(job, s.described(4), 0.5, nets, layers=single_layer(M))
    stalled = s.job_step(job, s.described(4, stalled={1: stall}), 0.5, nets, layers=single_layer(M))
    assert stalled.step_s == pytest.approx(healthy.step_s * factor, rel=1e-3)
    assert stalled.workers[0] == pytest.approx(healthy.workers[0])
