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
    sums = _batch_sums(model)
    for x, y in dataset:
        total += sums(x, y).numpy()
        if progress:
            progress()
    return total


def _batch_sums(model):
    """One batch's sums as one traced function of the model, kept on it: eager code would dispatch each
    op of the forward pass from Python, batch after batch (a transformer's hundreds; under the TF2 PS
    strategy each reading its variables from the PS tasks one by one). Traced at most twice: the full
    batches and the last, shorter one."""
    if id(model) not in _TRACED:
        import tensorflow as tf
        _TRACED[id(model)] = (model, tf.function(lambda x, y: eval_batch_sums(model(x, training=False), y),
                                                 reduce_retracing=True))
    return _TRACED[id(model)][1]


_TRACED = {}   # id(model): (the model, kept so that its id stays its own; its traced sums)


def finish_eval(sums):
    loss_sum, correct, count = (float(v) for v in sums)
    if count == 0:          # an empty test split (a data set's, a plug-in pipeline's): no accuracy to report
        raise InputError("the test split gave no example to evaluate: an empty test set or test pipeline")
    return loss_sum / count, correct / count
