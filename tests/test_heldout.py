"""The held-out check (hvdps/cost/heldout.py): terms fitted at the two smallest worker counts, the larger
runs predicted from them, on hand-built runs whose answers are worked out here."""
import math

import pytest

from hvdps.measure.rows import RunRow

from hvdps.cost import heldout
from hvdps.render import heldout as rheld

pytestmark = pytest.mark.unit


def model(row):
    """A stand-in cost model: one term of 50 ms x n (a PS link's n copies) after the compute."""
    return {"PS link": (True, 0.05 * row.workers)}


def two_links(row):
    """A sync PS model: a worker's own link (push M, pull M: 100 ms) or the busiest of k PS links
    (every worker's copy of its 1/k each way: 100 ms x n / k), whichever is longer."""
    return {"own link": (True, 0.1), "PS link": (True, 0.1 * row.workers / dict(row.tasks)["ps"])}


def run(backend, mode, n, step, compute=0.002, num_ps=None, busy=None):
    return RunRow(run_dir=f"runs/{backend}-{mode}-w{n}", backend=backend, mode=mode, workers=n, tasks=(("ps", num_ps),) if num_ps else (),
                  model="mlp", step_s=step, compute_s=compute, cores_busy=busy)


def by_workers(entries):
    return {e.workers: e for e in entries}


def test_a_constant_exchange_factor_fitted_small_predicts_large():
    # measured = contended compute + 1.2 x the model's exchange at every n, on 2 shared cores
    rows = [run("ps", "sync", n, 0.002 * max(1, n / 2) + 1.2 * 0.05 * n, num_ps=1) for n in (2, 4, 8, 16)]
    got = by_workers(heldout.analyse(rows, model, cores=2))
    assert [got[n].held_out for n in (2, 4, 8, 16)] == [False, False, True, True]
    assert got[16].factors == {"PS link": pytest.approx(1.2)}
    assert got[16].contended_compute_s == pytest.approx(0.016)           # 8 workers a core
    assert all(e.ratio == pytest.approx(1.0) for e in got.values())
    assert rheld.summary(list(got.values())) == (2, 2)


def test_the_cores_floor_binds_when_the_fitted_runs_kept_the_cores_busy():
    # 0.1 s steps with the cores 40% busy at 2 workers and 80% at 4: 0.04 s of CPU per worker step at
    # both, so 16 workers on 2 cores keep them busy for 16 x 0.04 / 2 = 0.32 s a round
    rows = [run("ps", "async", 2, 0.1, busy=0.4, num_ps=4), run("ps", "async", 4, 0.1, busy=0.8, num_ps=4),
            run("ps", "async", 16, 0.33, busy=1.0, num_ps=4)]
    got = by_workers(heldout.analyse(rows, lambda r: {"own link": (True, 0.08)}, cores=2))
    assert got[16].cpu_per_worker_step_s == pytest.approx(0.04)
    assert got[16].floor_s == pytest.approx(0.32) and got[16].predicted_step_s == pytest.approx(0.32)
    assert got[16].binding == "cores" and got[2].binding == "own link"
    assert got[16].contended_compute_s == pytest.approx(0.002)           # async workers do not march in step


def test_the_cores_floor_is_the_mean_cpu_per_worker_step_of_the_fitted_runs():
    rows = [run("ps", "async", 2, 0.1, busy=0.8, num_ps=4), run("ps", "async", 4, 0.1, busy=0.8, num_ps=4),
            run("ps", "async", 16, 0.5, busy=1.0, num_ps=4)]
    got = by_workers(heldout.analyse(rows, lambda r: {"own link": (True, 0.08)}, cores=2))
    assert got[16].cpu_per_worker_step_s == pytest.approx((0.08 + 0.04) / 2)
    assert got[16].floor_s == pytest.approx(16 * 0.06 / 2)


@pytest.mark.parametrize("times, p, expected", [
    ([0.3, 0.4], 2.0, 0.5),                     # the Euclidean case
    ([0.3, 0.4], math.inf, 0.4),                # the longest alone
    ([0.1, 0.1], 1.0, 0.2),                     # no overlap: the sum
    ([0.1, 0.1], 4.0, 0.1 * 2 ** 0.25),         # two equal resources: 19% over either
    ([0.25], 3.0, 0.25),                        # one resource is itself
])
def test_soft_max_of_the_resources_a_step_needs(times, p, expected):
    assert heldout.soft_max(times, p) == pytest.approx(expected)


def test_one_overlap_p_fitted_at_the_small_runs_of_every_method():
    # two PS methods whose steps are the p = 4 soft maximum of a worker's own link (100 ms) and
    # the busiest PS link (100 ms x n / k): equal at 2 workers and 2 shards, so 19% over either
    def measured(n, k):
        return heldout.soft_max([0.002 + 0.1, 0.002 + 0.1 * n / k], 4.0)
    rows = [run(b, m, n, measured(n, k), num_ps=k) for b, m in (("ps", "sync"), ("ps2", "async"))
            for k in (1, 2, 4) for n in (2, 4, 8, 16)]
    entries = heldout.analyse(rows, two_links)
    assert {e.overlap_p for e in entries} == {4.0}
    assert all(e.factors == {"own link": 1.0, "PS link": 1.0} for e in entries)
    assert all(e.ratio == pytest.approx(1.0) for e in entries)
    assert "p = 4" in "\n".join(rheld.section(entries))


@pytest.mark.parametrize("backend, floor", [("horovod", False), ("mpi", False), ("mwms", True), ("ps", True)])
def test_no_cores_floor_for_ranks_that_spin_while_they_wait(backend, floor):
    # Open MPI's ranks and Horovod's thread keep the cores busy while they wait: 100% busy says nothing
    row = run(backend, "sync", 4, 0.1, busy=1.0)
    assert (heldout.cpu_per_worker_step(row, 2) is not None) is floor
    if floor:
        assert heldout.cpu_per_worker_step(row, 2) == pytest.approx(0.05)


@pytest.mark.parametrize("backend, mode, lockstep", [
    ("horovod", "sync", True), ("mpi", "sync", True), ("mwms", "sync", True),
    ("ps", "sync", True), ("ps", "async", False), ("ps2", "async", False),
])
def test_which_methods_compute_in_lock_step(backend, mode, lockstep):
    assert heldout.lockstep(RunRow(run_dir="r", backend=backend, mode=mode)) is lockstep
    row = run(backend, mode, 8, 0.1)
    assert heldout.contended_compute(row, 2) == pytest.approx(0.008 if lockstep else 0.002)
    assert heldout.contended_compute(row, None) == pytest.approx(0.002)    # cores not shared: alone


@pytest.mark.parametrize("rows", [
    [run("horovod", "sync", 2, 0.06), run("horovod", "sync", 4, 0.09)],            # nothing left to predict
    [run("horovod", "sync", n, 0.06) for n in (1, 2, 4)],                             # one worker exchanges nothing
    [run("nccl", "sync", n, 0.06) for n in (2, 4, 8)],                                # a method this version lacks
    [run("horovod", "sync", n, None) for n in (2, 4, 8)],                             # no measured step
])
def test_nothing_to_hold_out_gives_no_entries(rows):
    assert heldout.analyse(rows, model, cores=2) == []
    assert rheld.section([]) == []


def test_a_link_factor_fitted_where_the_link_bound_predicts_where_it_binds_later():
    # the PS link moves at 0.9 of the model (pushes and pulls overlap), a worker's own at 1.2 of it;
    # with 1 shard the PS link binds from 2 workers, with 4 shards only from 8
    def measured(n, k):
        return 0.002 + max(1.2 * 0.1, 0.9 * 0.1 * n / k)
    rows = [run("ps", "sync", n, measured(n, k), num_ps=k) for k in (1, 4) for n in (2, 4, 16)]
    got = {(dict(e.tasks)["ps"], e.workers): e for e in heldout.analyse(rows, two_links)}
    assert got[4, 16].factors == {"own link": pytest.approx(1.2), "PS link": pytest.approx(0.9)}
    assert got[4, 2].binding == "own link" and got[4, 16].binding == "PS link"
    assert got[4, 16].predicted_step_s == pytest.approx(0.002 + 0.9 * 0.4) and got[4, 16].held_out


def test_a_link_that_never_bound_keeps_the_model_as_it_is():
    rows = [run("ps", "sync", n, 0.002 + 1.2 * 0.1, num_ps=4) for n in (2, 4)] + [run("ps", "sync", 16, 0.5, num_ps=4)]
    got = by_workers(heldout.analyse(rows, two_links))
    assert got[16].factors == {"own link": pytest.approx(1.2), "PS link": 1.0}
    assert got[16].predicted_step_s == pytest.approx(0.002 + 0.4)


def test_the_section_counts_the_held_out_runs_and_marks_the_misses():
    rows = [run("horovod", "sync", n, s) for n, s in ((2, 0.102), (4, 0.202), (8, 0.402), (16, 1.202))]
    entries = heldout.analyse(rows, model)
    text = "\n".join(rheld.section(entries))
    assert "**1 of 2 held-out runs within measured / predicted 0.85-1.15.**" in text
    assert "| Horovod | 2, 4 workers | PS link 1.00 |" in text
    assert "| horovod-sync-w16 | 16 | held out |" in text and "| **1.50** |" in text
    assert "| horovod-sync-w2 | 2 | fitted |" in text
