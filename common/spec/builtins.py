"""The models and data sets hvdps ships, each declared once with what the rest of hvdps reads of it:
its input, its classes, what it needs and what it works with. The config's checks, the memory
estimate, the loaders and the model builder read these declarations and never compare a name, so a
built-in added here is known everywhere (its loader or builder is registered beside it in
common/inputs/data.py or common/model/models.py under the same name)."""
from dataclasses import dataclass
from typing import Optional, Tuple

from common.spec.datasets import CLICK_FEATURES


@dataclass(frozen=True)
class BuiltinData:
    """A data set with a loader of hvdps' own."""
    name: str
    shape: Optional[Tuple[int, ...]] = None   # one example's input; None: see shape_from_flags / streamed
    classes: Optional[int] = None             # None: --num_classes (or the shards' description)
    needs: str = ""                           # the line that refuses it without --data_dir
    ids: bool = False                         # categorical ids, not pixels: a model that embeds them
    shape_from_flags: bool = False            # generated at --image_shape x --num_classes
    streamed: bool = False                    # read from files as it trains, never loaded as arrays
    writable: bool = True                     # hvdps data writes it as TFRecord shards
    text: bool = False                        # byte sequences of --seq_len, a label per position (the next byte)

    def pixels(self, cfg):
        """The image shape (H, W, C) of its examples, or None (ids, text, or known only from its files)."""
        if self.ids or self.streamed or self.text:
            return None
        return tuple(cfg.image_shape) if self.shape_from_flags else self.shape

    def input_shape(self, cfg):
        """One example's input as the model takes it, or None (known only from its files)."""
        if self.text:
            return (cfg.seq_len,)
        return self.shape or self.pixels(cfg)

    def num_classes(self, cfg):
        return self.classes if self.classes is not None else cfg.num_classes


@dataclass(frozen=True)
class BuiltinModel:
    """A model hvdps builds itself."""
    name: str
    ids: bool = False               # embeds categorical ids (needs a data set of ids)
    application: str = ""           # tf.keras.applications' class (weights=None)
    min_side: int = 0               # an application's smallest input side (3-channel images)
    text: bool = False              # a language model: byte sequences in, a next-byte distribution per position out


@dataclass(frozen=True)
class TransformerSize:
    """A decoder-only transformer's shape (``--transformer_size``): blocks, width, heads, the MLP's
    width, and the vocabulary and context it was published with (what the projection builds; training
    takes the data's: 256 bytes, ``--seq_len``)."""
    name: str
    layers: int
    width: int
    heads: int
    mlp: int
    vocab: int
    context: int


# tiny: what CI and the demo train in seconds (0.12 M weights); gpt2_small: GPT-2's 124 M-weight shape
# (Radford et al. 2019: 12 blocks of 768 wide, 12 heads, a 50,257-token vocabulary, 1,024 positions).
TRANSFORMER_SIZES = {t.name: t for t in (
    TransformerSize("tiny", layers=2, width=64, heads=4, mlp=256, vocab=256, context=64),
    TransformerSize("gpt2_small", layers=12, width=768, heads=12, mlp=3072, vocab=50257, context=1024),
)}


DATA = {d.name: d for d in (
    BuiltinData("digits", shape=(8, 8, 1), classes=10),
    BuiltinData("mnist", shape=(28, 28, 1), classes=10,
                needs="--dataset mnist needs --data_dir (a folder with mnist.npz or the IDX files)"),
    BuiltinData("synthetic", shape_from_flags=True),
    BuiltinData("clicks", shape=(CLICK_FEATURES,), classes=2, ids=True, writable=False),
    BuiltinData("pysrc", classes=256, text=True),
    BuiltinData("tfrecord", streamed=True, writable=False,
                needs="--dataset tfrecord needs --data_dir (a folder of TFRecord shards written by `hvdps data`)"),
)}

# Keras applications: the models of Horovod's and tf_cnn_benchmarks' published scaling tables, with the
# smallest input side each accepts.
MODELS = {m.name: m for m in (
    BuiltinModel("mlp"), BuiltinModel("cnn"), BuiltinModel("rec", ids=True), BuiltinModel("transformer", text=True),
    BuiltinModel("resnet50", application="ResNet50", min_side=32),
    BuiltinModel("resnet101", application="ResNet101", min_side=32),
    BuiltinModel("inception_v3", application="InceptionV3", min_side=75),
    BuiltinModel("vgg16", application="VGG16", min_side=32),
    BuiltinModel("mobilenet_v2", application="MobileNetV2", min_side=32),
)}


def data_of(cfg):
    """The declaration of ``cfg.dataset``, or None for a plug-in."""
    return DATA.get(cfg.dataset)


def model_of(cfg):
    """The declaration of ``cfg.model``, or None for a plug-in."""
    return MODELS.get(cfg.model)
