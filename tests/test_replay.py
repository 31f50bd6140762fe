"""The replay projector (hvdps/cost/replay.py): a step played out from its spans, the measured ranks
resampled at other worker counts, and the held-out fit, on synthetic timelines whose answers are
worked out here."""
import pytest

from hvdps.cost import replay
from hvdps.cost.replay import Fit, Replayed, StepGraph, play
from hvdps.measure.timeline import readies
from common.formats.schemas import RankFile

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("graph, step", [
    # two ranks, compute 10 ms, rank 1 slowed to 20 ms; an 8 ms exchange overlapped by half: it starts
    # 4 ms before the slow rank is ready and ends 4 ms after it
    (StepGraph(ready=(0.010, 0.020), exchange_s=0.008, hidden_s=0.004), 0.024),
    # the same with nothing hidden: the exchange follows the slowest rank whole
    (StepGraph(ready=(0.010, 0.020), exchange_s=0.008), 0.028),
    # an exchange shorter than its hidden part: the step is the slowest rank's ready
    (StepGraph(ready=(0.010, 0.020), exchange_s=0.003, hidden_s=0.004), 0.020),
    # the library's bookkeeping after the exchange
    (StepGraph(ready=(0.010, 0.020), exchange_s=0.008, hidden_s=0.004, overhead_s=0.002), 0.026),
    # hidden longer than the ready: the exchange cannot start before the step does
    (StepGraph(ready=(0.002, 0.002), exchange_s=0.010, hidden_s=0.005), 0.010),
    # asynchronous workers: each its own ready + exposed exchange, the job n over their summed rates
    (StepGraph(ready=(0.010, 0.030), exchange_s=0.010, lockstep=False), 2 / (1 / 0.020 + 1 / 0.040)),
])
def test_play(graph, step):
    assert play(graph) == pytest.approx(step, abs=1e-12)


def test_resampled_keeps_each_rank_and_draws_other_steps():
    measured = [(1.0, 10.0), (2.0, 20.0), (3.0, 30.0)]
    got = replay.resampled(measured, 4)
    # worker 2 is rank 0 one step later, worker 3 rank 1 one step later
    assert got == [(1.0, 10.0, 2.0, 20.0), (2.0, 20.0, 3.0, 30.0), (3.0, 30.0, 1.0, 10.0)]
    assert replay.resampled(measured, 2) == [tuple(m) for m in measured]


@pytest.mark.parametrize("points, factor, offset", [
    ([(0.05, 0.065), (0.075, 0.095)], 1.2, 0.005),        # a line through both
    ([(0.05, 0.040), (0.05, 0.050)], 1.0, -0.005),        # one exchange: factor 1, the mean offset
    ([(0.05, 0.010), (0.075, 0.100)], 1.0, -0.0075),      # a factor of 3.6 is noise: factor 1
])
def test_fit(points, factor, offset):
    got = replay.fit(points, (2, 4))
    assert (got.factor, got.offset_s) == (pytest.approx(factor), pytest.approx(offset))
    assert got.fitted_at == (2, 4)


def test_fit_graph_splits_the_offset_into_hidden_and_overhead():
    assert Fit(1.0, -0.004, (2, 4)).graph((0.01,), 0.008, True).hidden_s == pytest.approx(0.004)
    # hidden as far as the ready reaches (2 ms), the rest shortens the exchange: exposed 8 - 4 ms still
    short = Fit(1.0, -0.004, (2, 4)).graph((0.002,), 0.008, True)
    assert (short.hidden_s, short.exchange_s, play(short)) == (pytest.approx(0.002), pytest.approx(0.006), pytest.approx(0.006))
    assert Fit(1.0, 0.003, (2, 4)).graph((0.01,), 0.008, True).overhead_s == pytest.approx(0.003)


def ring(n, alpha=0.001):
    """A ring's exchange of 50 ms at 2 workers: 2(n-1)/n x 50 ms + 2(n-1) alpha."""
    return 2 * (n - 1) / n * 0.05 + 2 * (n - 1) * alpha


def synthetic(n, factor=1.2, offset=-0.004, name=None):
    """A lock-step run at n workers whose every step is its slowest rank's ready + factor x the ring
    + offset: rank 1 slowed to twice the others' 10 ms compute."""
    ready = tuple(0.020 if j == 1 else 0.010 for j in range(n))
    step = 0.020 + factor * ring(n) + offset
    return Replayed(run=name or f"mpi-w{n}", label="bare MPI", family=("mlp", "mpi", "sync", "()"),
                    variant=("mlp", "mpi", "sync", "()", "()"), workers=n, step_s=step,
                    readies=(ready,) * 5, exchange_at=ring, lockstep=True)


def test_a_synthetic_timeline_is_replayed_exactly_held_out():
    entries = replay.analyse([synthetic(n) for n in (2, 4, 8, 16)])
    got = {e.workers: e for e in entries}
    assert [got[n].held_out for n in (2, 4, 8, 16)] == [False, False, True, True]
    assert got[16].factor == pytest.approx(1.2) and got[16].offset_s == pytest.approx(-0.004)
    assert got[16].replayed_from == "mpi-w4"
    for n in (2, 4, 8, 16):
        assert got[n].predicted_step_s == pytest.approx(0.020 + 1.2 * ring(n) - 0.004)
        assert got[n].ratio == pytest.approx(1.0)
    assert replay.mean_error(entries) == pytest.approx(0.0, abs=1e-12)


def test_two_counts_are_not_held_out():
    assert replay.analyse([synthetic(n) for n in (2, 4)]) == []


def test_shared_cores_stretch_the_ready_of_lockstep_workers():
    # at 8 workers on 2 cores, ready is 4x what it was alone; the fitted run at 4 had 2x
    assert replay.contention(8, 4, 2) == pytest.approx(2.0)
    assert replay.contention(8, 4, None) == 1.0
    fitted = Fit(1.0, 0.0, (2, 4))
    got = replay.replayed([(0.010, 0.010, 0.010, 0.010)], 8, 4, 0.05, fitted, True, cores=2)
    assert got == pytest.approx(0.020 + 0.05)


def test_readies_from_rank_files():
    # rank 0 waited 1 ms for its batch and spent 3 ms in MPI_Allreduce of a 10 ms step; rank 1 no exchange timed
    ranks = {"rank:0": RankFile(task="rank:0", pid=1, host="h1",
                                spans=[[5, 100.0, 100.010, 0.001, 0.003], [10, 101.0, 101.010, 0.001, 0.003]]),
             "rank:1": RankFile(task="rank:1", pid=2, host="h2", spans=[[10, 101.0, 101.010, 0.0, None]]),
             "ps:0": RankFile(task="ps:0", pid=3, host="h3", spans=[[10, 101.0, 101.010, 0.0, None]])}
    got = readies(ranks, compute_s=0.004, after_step=0)
    assert len(got) == 1                         # step 10 alone: the one both workers logged
    assert got[0] == (pytest.approx(0.007), pytest.approx(0.004))
    assert readies(ranks, compute_s=0.004, after_step=10) == ()


def test_readies_of_workers_that_number_their_steps_apart_are_taken_in_order():
    # TF2's PS: the coordinator gives step 4 to one worker, step 5 to the other
    ranks = {f"worker:{i}": RankFile(task=f"worker:{i}", pid=i + 1, host="h",
                                     spans=[[s, 100.0, 100.010, 0.002 * (i + 1), None] for s in steps])
             for i, steps in enumerate([(4, 6, 8), (5, 7)])}
    got = readies(ranks, compute_s=0.004)
    assert got == ((pytest.approx(0.006), pytest.approx(0.008)),) * 2
