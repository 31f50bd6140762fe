import numpy as np
import pytest

from common.spec.config import make_config
from common.model.models import build_model, gradient_bytes, num_parameters


@pytest.mark.parametrize("kw, in_shape, params", [
    (dict(model="mlp"), (8, 8, 1), 64 * 100 + 100 + 100 * 10 + 10),
    (dict(model="mlp", hidden_units=7), (8, 8, 1), 64 * 7 + 7 + 7 * 10 + 10),
    (dict(model="mlp", dataset="synthetic", image_shape=(28, 28, 1)), (28, 28, 1), 784 * 100 + 100 + 1010),
    (dict(model="cnn"), (8, 8, 1), None),
    (dict(model="cnn", dataset="synthetic", image_shape=(28, 28, 1), num_classes=5), (28, 28, 1), None),
])
def test_shapes(kw, in_shape, params):
    cfg = make_config(**kw)
    model = build_model(cfg)
    assert tuple(model.input_shape[1:]) == in_shape
    out = model(np.zeros((3,) + in_shape, np.float32))
    assert out.shape == (3, cfg.num_classes if cfg.dataset == "synthetic" else 10)
    if params is not None:
        assert num_parameters(model) == params
    assert gradient_bytes(model) == 4 * num_parameters(model)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_seeded_init_is_deterministic(name):
    a = build_model(make_config(model=name, seed=3)).get_weights()
    b = build_model(make_config(model=name, seed=3)).get_weights()
    c = build_model(make_config(model=name, seed=4)).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_same_init_in_graph_mode():
    """The PS backend builds in graph mode; its start must equal the eager start."""
    import tensorflow as tf
    eager = build_model(make_config(seed=9)).get_weights()
    g = tf.Graph()
    with g.as_default():
        model = build_model(make_config(seed=9))
        with tf.compat.v1.Session(graph=g) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            graph = s.run(model.weights)
    assert all(np.array_equal(x, y) for x, y in zip(eager, graph))


def test_resnet50_builds_on_small_synthetic():
    cfg = make_config(model="resnet50", dataset="synthetic", image_shape=(32, 32, 3), num_classes=10)
    model = build_model(cfg)
    assert num_parameters(model) > 23_000_000
