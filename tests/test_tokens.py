"""SyncReplicasOptimizer's token queue played out (ps_train/tokens.py): seconds per update for
workers at their own steps, an update taking R fresh gradients and handing out N tokens."""
import pytest
from hypothesis import given, settings, strategies as st

from hvdps.cost.model import summed_rates_step
from ps_train.method import apply_round_trip
from ps_train.tokens import update_interval


@pytest.mark.parametrize("steps, replicas, seconds", [
    ([1, 1], 2, 1.0),                 # sync, every worker: one update a step
    ([1, 1], 1, 1.0),                 # one backup, healthy: both push, one kept, one dropped
    ([1, 2], 1, 4 / 3),               # two workers, one backup: the summed rates, (1 + 1/2) / 2 an update
    ([1, 4], 1, 1.6),                 # ... (1 + 1/4) / 2
    ([1, 1.5], 1, 1.2),
    ([1, 1, 1, 1], 3, 1.0),           # four workers, one backup, healthy
    ([1, 2, 1, 1], 3, 4 / 3),         # a fast worker holding a stale token waits for the slow one's push:
    ([1, 4, 1, 1], 3, 4 / 3),         # slower than the summed rates' 8/7 and 16/13
    ([1, 2], 2, 2.0),                 # no backup: the slowest worker's step
])
def test_an_update_takes_what_the_queue_rules_give(steps, replicas, seconds):
    assert update_interval(steps, replicas) == pytest.approx(seconds, rel=1e-9)


@pytest.mark.parametrize("steps, replicas, apply_s, seconds", [
    ([1, 1], 1, 0.5, 1.0),            # a round trip shorter than the pushes' pace changes nothing
    ([1, 1], 2, 0.99, 1.0),
    ([1, 0.1], 1, 0.5, 0.5),          # a fast worker's pushes outrun the chief: its round trip sets the pace
    ([10, 1], 1, 2.0, 2.0),
    ([1, 1, 1, 1], 3, 1.5, 1.5),
    ([0.5153, 0.0527], 1, 0.121, 0.121),   # BENCHMARKS.md section 16: the chief on a 10 Mbit/s link
])
def test_updates_come_no_closer_than_the_chiefs_round_trip(steps, replicas, apply_s, seconds):
    assert update_interval(steps, replicas, apply_s) == pytest.approx(seconds, rel=1e-9)


@pytest.mark.parametrize("steps, replicas, apply_s", [([1, 1], 0, 0), ([1, 1], 3, 0), ([1, 0], 1, 0),
                                                      ([1, -1], 1, 0), ([1, 1], 1, -0.1),
                                                      ([1, 1], 1, float("nan"))])
def test_a_count_or_step_out_of_range_is_refused(steps, replicas, apply_s):
    with pytest.raises(ValueError, match="replicas must be in"):
        update_interval(steps, replicas, apply_s)


@pytest.mark.parametrize("steps, terms, seconds", [
    ([0.5], None, 0.0),                                   # no terms: no round trip
    ([0.5], [{}], 0.0),
    ([0.5, 0.05], [{"own link": (True, 0.5)}, {}], 0.125),   # p = 0.25 s each way, busy half the step
    ([0.0527, 0.0527], [{"own link": (True, 0.05)}, {}], 0.025 ** 2 / 0.0527),
    ([0.0, 1.0], [{"own link": (True, 0.5)}], 0.0),       # a step of nothing: none
])
def test_the_chiefs_round_trip_waits_behind_its_own_transfers(steps, terms, seconds):
    assert apply_round_trip(steps, terms) == pytest.approx(seconds)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=2, max_size=7), st.integers(0, 6))
def test_an_update_comes_between_the_summed_rates_and_the_slowest_worker(steps, backups):
    """Every push takes one of the N tokens an update hands out, so an update costs N pushes at best
    at the workers' summed rate (at most a percent under it over a measured window that is not a whole
    number of the queue's periods); and it never waits longer than every worker in step would, the
    slowest worker's step."""
    replicas = max(1, len(steps) - backups)
    seconds = update_interval(steps, replicas)
    assert summed_rates_step(steps) * 0.99 <= seconds <= max(steps) * (1 + 1e-9)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=2, max_size=6), st.integers(0, 5), st.floats(0.0, 20.0))
def test_a_round_trip_only_ever_spaces_the_updates_out(steps, backups, apply_s):
    """Updates at least ``apply_s`` apart: never faster than without it, nor than the round trip, and
    no slower than the two one after the other."""
    replicas = max(1, len(steps) - backups)
    free = update_interval(steps, replicas)
    seconds = update_interval(steps, replicas, apply_s)
    assert max(free * 0.99, apply_s * (1 - 1e-9)) <= seconds <= (free + apply_s) * 1.01 + max(steps) * 1e-9
