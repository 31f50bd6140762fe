"""The PS chief's wait meter (ps_train/chief.py): the sync wait per worker step, per interval."""
import pytest

from ps_train.chief import WaitMeter


@pytest.mark.parametrize("feeds, means, median", [
    # (update, cumulative wait per worker, cumulative steps per worker): warm-up (update < 10) skipped,
    # the first interval after it only sets the mark
    ([(5, [0.1, 0.1], [5, 5]), (10, [0.2, 0.3], [10, 10]), (20, [0.4, 0.5], [20, 20]),
      (30, [1.4, 0.5], [30, 30])], [0.02, 0.05], 0.035),
    # nothing ran between two reads: no interval
    ([(10, [0.2, 0.2], [10, 10]), (10, [0.2, 0.2], [10, 10]), (20, [0.6, 0.6], [20, 20])], [0.04], 0.04),
    # a restarted chief zeroed the wait sums (they are not in checkpoints): that interval is dropped
    ([(10, [1.0, 1.0], [10, 10]), (20, [0.1, 0.1], [20, 20]), (30, [0.3, 0.3], [30, 30])], [0.02], 0.02),
    # never past the warm-up: no figure
    ([(3, [0.0, 0.0], [3, 3]), (6, [0.1, 0.1], [6, 6])], [], None),
])
def test_wait_per_worker_step_per_interval(feeds, means, median):
    meter = WaitMeter(warmup_steps=10)
    got = [meter.update(*feed) for feed in feeds]
    assert [m for m in got if m is not None] == pytest.approx(means)
    assert meter.median() == (None if median is None else pytest.approx(median))
