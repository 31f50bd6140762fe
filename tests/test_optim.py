"""The learning-rate warm-up (common/model/optim.py): its Python value is the graph's, bit for bit."""
import pytest

from common.model.optim import _schedule_class

STEPS = [0, 1, 2, 37, 99, 100, 101, 1234, 10 ** 6]


@pytest.mark.parametrize("base, peak, warmup", [
    (0.01, 0.01, 0),            # no warm-up: the constant
    (0.01, 0.04, 100),          # 4 workers, scaled
    (0.1, 0.8, 7),
    (1e-3, 3e-3, 123),
    (0.05, 0.0125, 40),         # a peak below the base still moves linearly
])
def test_python_value_is_the_graphs(base, peak, warmup):
    """A PS chief logs ``at(step)`` instead of reading the rate the PS computed: every bit must agree."""
    import tensorflow as tf
    schedule = _schedule_class()(base, peak, warmup)
    for step in STEPS:
        graph = float(schedule(tf.constant(step, tf.int64)))
        assert schedule.at(step) == graph, (step, schedule.at(step), graph)
    assert schedule.at(0) == pytest.approx(base if warmup else peak, rel=1e-6)
    assert schedule.at(10 ** 6) == pytest.approx(peak, rel=1e-6)
