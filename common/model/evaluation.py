"""Test-set evaluation as sums ([loss, correct, examples]) that any backend can reduce across workers.

Every backend evaluates with these two functions, so an accuracy means the same under each.
"""
import numpy as np

from common.base.errors import InputError
from common.model.models import eval_batch_sums


def eval_sums(model, dataset, progress=None):
    """[loss sum, correct, examples] over a dataset (eager), for cross-worker reduction.
    ``progress``: called after each batch (a liveness bound that is per batch, so a long test set
    is not a hang, a pipeline that stops giving batches is)."""
    total = np.zeros(3, np.float64)
    for x, y in dataset:
        total += eval_batch_sums(model(x, training=False), y).numpy()
        if progress:
            progress()
    return total


def finish_eval(sums):
    loss_sum, correct, count = (float(v) for v in sums)
    if count == 0:          # an empty test split (a data set's, a plug-in pipeline's): no accuracy to report
        raise InputError("the test split gave no example to evaluate: an empty test set or test pipeline")
    return loss_sum / count, correct / count
