"""The run plan (common/spec/plan.py): one meaning of update, epoch and epoch label for every backend."""
import pytest

from common.spec.config import make_config
from common.spec.plan import make_plan


@pytest.mark.unit
@pytest.mark.parametrize("update, label, done", [(1, 1, 0), (100, 1, 1), (101, 2, 1), (150, 2, 1), (200, 2, 2),
                                                 (0, 1, 0)])
@pytest.mark.parametrize("workers, per_update", [(1, 1), (2, 2), (2, 1)])   # all-reduce / sync PS, async PS
def test_epoch_label_is_the_same_for_every_backend(update, label, done, workers, per_update):
    # 100 updates per epoch whatever one update is worth
    plan = make_plan(make_config(batch_size=10), 1000 * per_update, workers, per_update)
    assert plan.updates_per_epoch == 100
    assert plan.epoch_label(update) == label and plan.epoch_of(update) == done
