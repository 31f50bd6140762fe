"""SyncReplicasOptimizer's token queue played out (ps_train/tokens.py): seconds per update for
workers at their own steps, an update taking R fresh gradients and handing out N tokens."""
import pytest
from hypothesis import given, settings, strategies as st

from hvdps.methods import summed_rates_step
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


@pytest.mark.parametrize("steps, replicas", [([1, 1], 0), ([1, 1], 3), ([1, 0], 1), ([1, -1], 1)])
def test_a_count_or_step_out_of_range_is_refused(steps, replicas):
    with pytest.raises(ValueError, match="replicas must be in"):
        update_interval(steps, replicas)


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
