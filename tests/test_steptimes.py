"""common/trainer/steptimes.py: each rank's own step times, one way for every loop."""
import json
import time

import pytest

from common.formats.schemas import SchemaError, read_rank_file
from common.trainer.steptimes import StepTimes, quantiles


@pytest.mark.parametrize("durations, want", [
    ([], None),
    ([0.002], {"n": 1, "p50": 0.002, "p95": 0.002, "max": 0.002}),
    ([0.001] * 19 + [0.1], {"n": 20, "p50": 0.001, "p95": pytest.approx(0.00595), "max": 0.1}),
])
def test_quantiles(durations, want):
    assert quantiles(durations) == want


def test_steps_are_timed_with_their_input_and_the_backends_own_exchange(tmp_path):
    """Warm-up steps leave the distribution; every log_every-th step is a span; the exchange is what
    the backend's list grew by during the step."""
    exchanges = []
    times = StepTimes("rank:1", log_every=2, warmup_steps=1, exchange_times=exchanges)
    for step in range(1, 5):
        times.begin()
        time.sleep(0.002)
        exchanges.extend([0.0005, 0.0005])
        times.end(step, input_s=0.001)
    times.end(5)                               # no begin: nothing
    assert len(times.durations) == 3 and all(d >= 0.002 for d in times.durations)
    assert [s[0] for s in times.spans] == [2, 4]
    assert all(s[3] == 0.001 and s[4] == pytest.approx(0.001) and s[2] - s[1] >= 0.002 for s in times.spans)
    times.save(str(tmp_path))
    rank = read_rank_file(str(tmp_path / "ranks" / "rank-1.json"))
    assert rank.task == "rank:1" and rank.step_s.n == 3 and len(rank.spans) == 2
    assert rank.cpu_s_per_step is not None and rank.cpu_s_per_step < 0.002   # it slept: little CPU


@pytest.mark.parametrize("spin_s, warmup, least, most", [
    (0.0, 0, 0.0, 0.002),              # steps that do nothing cost next to nothing
    (0.01, 0, 0.008, 0.02),            # a step that computes 10 ms costs 10 ms of CPU
    (0.01, 2, 0.008, 0.02),            # the warm-up's steps are left out, as from the distribution
])
def test_a_ranks_cpu_per_step_is_its_process_time_over_its_timed_steps(spin_s, warmup, least, most):
    """What a CPU quota stretches: the process's CPU between the first timed step's start and the last
    one's end, per step (a sleeping step's wall time is not CPU)."""
    times = StepTimes("rank:0", log_every=1, warmup_steps=warmup)
    for step in range(1, 6):
        times.begin()
        until = time.process_time() + spin_s
        while time.process_time() < until:
            pass
        times.end(step)
    assert least <= times.cpu_per_step() <= most


def test_steps_reported_from_elsewhere_count_no_cpu_here():
    """TF2's PS: the coordinator records each worker's steps from the worker's clock; its own CPU is
    not the worker's, so none is given."""
    times = StepTimes("worker:0", log_every=1)
    times.add(1, 10.0, 10.5)
    times.add(2, 10.5, 11.0)
    assert times.record()["cpu_s_per_step"] is None


@pytest.mark.parametrize("spans, words", [
    ([[1, 10.0, 9.0, None, None]], "step 1 ends before it starts"),
    ([[1.5, 10.0, 11.0, None, None]], "a whole step"),
    ([[1, 10.0, 11.0, None]], "at least 5 items"),
    ([[1, 10.0, 11.0, -1, None]], "greater than or equal to 0"),
])
def test_a_rank_file_that_does_not_hold_is_refused(tmp_path, spans, words):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"task": "rank:0", "pid": 1, "host": "h", "spans": spans}))
    with pytest.raises(SchemaError, match=words):
        read_rank_file(str(path))
