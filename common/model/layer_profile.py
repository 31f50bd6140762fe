"""Per-layer gradient sizes and forward FLOPs of a Keras model, in forward order.

The projection's wait-free back-propagation schedule needs to know *when* each
gradient becomes ready, not only how many bytes there are in all: the last
layers' gradients are ready first and can travel while earlier layers still
back-propagate. Backward time per layer is taken as proportional to its
forward FLOPs (a layer's backward pass costs about twice its forward pass,
for every layer alike), so only the shares matter.

``python -m common.model.layer_profile`` rewrites the profiles of the named
benchmark models that ship with the projection (hvdps/cost/model_profiles.json), so
projecting needs neither TensorFlow nor minutes of model building.
"""
import json
import os
import sys

import numpy as np

from common.base.files import write_atomic
from common.model.models import build_transformer
from common.spec.builtins import MODELS, TRANSFORMER_SIZES
from common.spec.config import make_config
from common.formats.schemas import Layer, read_profiles

# The benchmark models at the input size of their published figures (ImageNet).
PUBLISHED_INPUTS = {"resnet50": (224, 224, 3), "resnet101": (224, 224, 3), "inception_v3": (299, 299, 3),
                    "vgg16": (224, 224, 3), "mobilenet_v2": (224, 224, 3)}
# The transformer presets profiled at their published shape: profile name -> --transformer_size.
TRANSFORMERS = {"gpt2_small": "gpt2_small"}
PROFILES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hvdps", "cost",
                        "model_profiles.json")


def _spatial(shape):
    """Output positions a kernel is applied at: H*W for 4-D outputs, the middle dims otherwise."""
    dims = [int(d) for d in shape[1:-1] if d is not None]
    return int(np.prod(dims)) if dims else 1


def layer_profile(model):
    """[Layer] (common/formats/schemas.py: name, grad_bytes, tensors, flops) for every layer with
    trainable weights, in forward order.

    tensors are the bytes of each trainable variable (a PS places variables,
    not layers); flops are forward multiply-adds x 2 for one sample. Convolutions and dense
    layers cost 2 x kernel size per output position; other weighted layers
    (batch norm) about 4 operations per output element.
    """
    rows, tied = [], {}
    for layer in _leaf_layers(model):
        weights = layer.trainable_weights
        if not weights:
            if getattr(layer, "tied_to", None):          # weights of another layer's (tied logits)
                tied[layer.tied_to] = tied.get(layer.tied_to, 0) + _tied_flops(model, layer)
            continue
        tensors = [4 * int(np.prod(w.shape)) for w in weights]
        nbytes = sum(tensors)
        try:
            out = layer.output_shape
        except (AttributeError, RuntimeError):
            out = None
        if isinstance(out, list):
            out = out[0]
        kernel = getattr(layer, "kernel", None)
        if kernel is None:
            kernel = getattr(layer, "depthwise_kernel", None)
        if hasattr(layer, "_query_dense") and out is not None:    # Keras MultiHeadAttention
            flops = _attention_flops(layer, out)
        elif kernel is not None:
            flops = 2 * int(np.prod(kernel.shape)) * (_spatial(out) if out else 1)
        elif out is not None:
            flops = 4 * int(np.prod([int(d) for d in out[1:] if d is not None]))
        else:
            flops = 2 * nbytes // 4
        rows.append(Layer(name=layer.name, grad_bytes=int(nbytes), tensors=tensors, flops=int(flops)))
    return [row.model_copy(update={"flops": row.flops + tied[row.name]}) if row.name in tied else row
            for row in rows]


def _attention_flops(layer, out):
    """Keras MultiHeadAttention on a sequence of T positions: its four projections (query, key, value,
    output: 2 x kernel x T each) and, over all heads, the scores QK^T and their weighted sum of V
    (2 x T x T x heads x key_dim each). Its kernels sit in sublayers, which the rule for a layer's own
    kernel would miss."""
    positions = _spatial(out)
    projections = sum(int(np.prod(w.shape)) for w in layer.trainable_weights if "kernel" in w.name)
    width = layer._num_heads * layer._key_dim
    return 2 * projections * positions + 4 * positions * positions * width


def _tied_flops(model, layer):
    """The forward FLOPs of a layer that computes with another layer's weights (logits as the hidden
    state times the token embedding's transpose: 2 x T x table), counted with the layer whose
    gradient they add to. That gradient is complete only once back-propagation has reached the
    embedding, so it leaves last, as a wait-free schedule of a tied model must have it."""
    table = model.get_layer(layer.tied_to).trainable_weights[0]
    return 2 * int(np.prod(table.shape)) * _spatial(layer.output_shape)


def _leaf_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:     # nested model: its layers in order
            yield from _leaf_layers(layer)
        else:
            yield layer


def build_profile(name, classes=1000):
    import tensorflow as tf
    if name in TRANSFORMERS:
        model = _transformer_at(tf, name)
    else:
        build = getattr(tf.keras.applications, MODELS[name].application)
        model = build(weights=None, input_shape=PUBLISHED_INPUTS[name], classes=classes)
    rows = layer_profile(model)
    tf.keras.backend.clear_session()
    return rows


def _transformer_at(tf, name):
    """hvdps's transformer at a preset's own vocabulary and context (GPT-2 small: 50,257 tokens, 1,024
    positions; common/spec/builtins.py), not the byte corpus': the shape the published runs train."""
    size = TRANSFORMER_SIZES[TRANSFORMERS[name]]
    cfg = make_config(model="transformer", dataset="pysrc", transformer_size=size.name)
    return build_transformer(tf, cfg, (size.context,), size.vocab)


def load_profiles(path=PROFILES):
    return read_profiles(path)


def main(argv=None):
    names = (sys.argv[1:] if argv is None else argv) or [*PUBLISHED_INPUTS, *TRANSFORMERS]
    data = {k: v.model_dump(exclude_none=True) for k, v in load_profiles().items()} if os.path.exists(PROFILES) else {}
    for name in names:
        layers = build_profile(name)
        size = TRANSFORMER_SIZES[TRANSFORMERS[name]] if name in TRANSFORMERS else None
        data[name] = {"input_shape": [size.context] if size else list(PUBLISHED_INPUTS[name]),
                      "classes": size.vocab if size else 1000,
                      "layers": [x.model_dump(exclude_none=True) for x in layers]}
        total = sum(x.grad_bytes for x in layers) / 4e6
        print(f"{name}: {len(layers)} weighted layers, {total:.1f} M parameters, "
              f"{sum(x.flops for x in layers) / 1e9:.2f} GFLOPs forward")
    write_atomic(PROFILES, json.dumps(data, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
