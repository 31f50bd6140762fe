"""A model with state of its own (BatchNormalization's moving statistics, a regularizer's loss)
trains under every backend as a single process trains it: the statistics move, the eval agrees."""
import os
import sys

import numpy as np
import pytest

from common.trainer.run_dir import load_weights_npz
from tests.conftest import REPO, row_and_records

# weights.npz in model.weights order: dense kernel, BN gamma, beta, moving mean, moving variance, ...
MOVING_MEAN, MOVING_VAR = 3, 4
# Measured on the digits with the shared job's training (tests/jobs.py): one process 0.964; at 2 workers
# Horovod, bare MPI and TF's all-reduce 0.950, PS async 0.953-0.964, PS sync 0.967, PS v2 0.961-0.964. A classic PS
# that does not apply the updates evaluates with mean 0 / variance 1 and fails the statistics check
# before the accuracy one; TF's all-reduce with statistics averaged when read fails at its first checkpoint.
TOLERANCE = 0.05


def bn_model():
    import tensorflow as tf
    from common.spec.config import make_config
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import bn_mlp
    finally:
        sys.path.pop(0)
    return bn_mlp.build(make_config(), (8, 8), 10), tf


@pytest.mark.unit
def test_total_loss_includes_the_models_own_losses():
    from common.model.models import total_loss
    model, tf = bn_model()
    x = np.random.RandomState(0).rand(16, 8, 8).astype("float32")
    y = np.arange(16) % 10
    logits = model(x, training=True)
    ce = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)))
    reg = float(tf.add_n(model.losses))
    assert reg > 0
    assert float(total_loss(model, y, logits)) == pytest.approx(ce + reg, rel=1e-6)


@pytest.mark.unit
def test_state_updates_move_the_statistics_in_a_session_graph():
    """The classic PS builds a TF1 graph: without state_updates the moving mean stays at 0."""
    from common.model.models import state_updates
    _, tf = bn_model()
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        model, _ = bn_model()
        x = tf.constant(np.random.RandomState(0).rand(32, 8, 8).astype("float32") + 3.0)
        model(x, training=True)
        updates = state_updates(model, x)
        assert len(updates) == 2                 # moving mean and moving variance
        mean = model.layers[2].moving_mean
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            assert np.all(sess.run(mean) == 0)
            sess.run(updates)
            assert np.all(sess.run(mean) != 0)


@pytest.mark.process
@pytest.mark.parametrize("backend", ["horovod", "mpi", "mwms", "ps async", "ps sync", "ps2"])
def test_batchnorm_statistics_move_and_eval_matches_one_process(jobs, backend):
    out = jobs(backend)
    row, curves = row_and_records(out)
    ref, _ = row_and_records(jobs("one process"))
    weights = load_weights_npz(os.path.join(out, "weights.npz"))
    mean, var = weights[MOVING_MEAN], weights[MOVING_VAR]
    assert mean.shape == var.shape == (64,)
    assert np.abs(mean).max() > 1e-2, "moving mean never left 0"
    assert np.abs(var - 1).max() > 1e-2, "moving variance never left 1"
    assert row.status == "ok" and row.workers == 2
    assert row.final_test_accuracy >= ref.final_test_accuracy - TOLERANCE, (
        backend, row.final_test_accuracy, ref.final_test_accuracy)
