"""The built-in models and data sets are declared once (common/spec/builtins.py): every declaration has
its loader or builder under the same name, and what the config, the loaders and the memory estimate
read of a built-in comes from its declaration."""
import pytest

from common.inputs.data import LOADERS, input_spec
from common.model.models import BUILDERS
from common.spec import builtins
from common.spec.config import DATASETS, MODELS, make_config
from common.spec.memory import MODEL_MEMORY, memory_estimate

pytestmark = pytest.mark.unit


def test_every_declared_data_set_has_a_loader_and_every_model_a_builder():
    assert set(LOADERS) == {d.name for d in builtins.DATA.values() if not d.streamed}
    assert set(BUILDERS) == {m.name for m in builtins.MODELS.values() if not m.application}
    assert set(MODEL_MEMORY) <= set(builtins.MODELS)
    assert DATASETS == tuple(builtins.DATA) and MODELS == tuple(builtins.MODELS)


@pytest.mark.parametrize("dataset, extra, shape, classes", [
    ("digits", {}, (8, 8, 1), 10),
    ("synthetic", {"image_shape": (12, 10, 3), "num_classes": 7}, (12, 10, 3), 7),
    ("clicks", {"model": "rec"}, (4,), 2),
])
def test_the_input_is_the_declarations(dataset, extra, shape, classes):
    assert input_spec(make_config(dataset=dataset, **extra)) == (shape, classes)


@pytest.mark.parametrize("flags, message", [
    ({"model": "rec"}, "--model rec embeds categorical ids: it needs --dataset clicks, not digits"),
    ({"dataset": "clicks"}, "--dataset clicks holds categorical ids, not pixels: use --model rec (or a plug-in "
                            "that embeds them), not mlp"),
    ({"dataset": "mnist"}, "--dataset mnist needs --data_dir"),
    ({"dataset": "tfrecord"}, "--dataset tfrecord needs --data_dir"),
    ({"model": "inception_v3"}, "--model inception_v3 needs 3-channel images of at least 75x75: --dataset "
                                "synthetic --image_shape 75,75,3 (or larger), or your own data"),
    ({"model": "resnet50", "dataset": "synthetic", "image_shape": (16, 16, 3)},
     "--model resnet50 needs --image_shape of at least 32,32,3"),
])
def test_what_a_built_in_works_with_is_its_declarations(flags, message):
    from common.base.errors import UsageError
    with pytest.raises(UsageError) as e:
        make_config(**flags)
    assert str(e.value).startswith(message), str(e.value)


def test_the_memory_estimate_reads_the_declared_shape():
    """The MLP on the 8x8 digits: 64 x hidden + hidden x 11 + 10 weights, 20 bytes each."""
    parts = {what.split("'")[0]: b for _, b, what in memory_estimate(make_config(hidden_units=100))}
    assert parts["the MLP"] == 20 * (64 * 100 + 100 * 11 + 10)
    assert not any("images" in what for _, _, what in memory_estimate(make_config()))   # the digits are not generated
