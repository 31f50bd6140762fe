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
from common.spec.builtins import MODELS
from common.formats.schemas import Layer, read_profiles

# The benchmark models at the input size of their published figures (ImageNet).
PUBLISHED_INPUTS = {"resnet50": (224, 224, 3), "resnet101": (224, 224, 3), "inception_v3": (299, 299, 3),
                    "vgg16": (224, 224, 3), "mobilenet_v2": (224, 224, 3)}
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
    rows = []
    for layer in _leaf_layers(model):
        weights = layer.trainable_weights
        if not weights:
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
        if kernel is not None:
            flops = 2 * int(np.prod(kernel.shape)) * (_spatial(out) if out else 1)
        elif out is not None:
            flops = 4 * int(np.prod([int(d) for d in out[1:] if d is not None]))
        else:
            flops = 2 * nbytes // 4
        rows.append(Layer(name=layer.name, grad_bytes=int(nbytes), tensors=tensors, flops=int(flops)))
    return rows


def _leaf_layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:     # nested model: its layers in order
            yield from _leaf_layers(layer)
        else:
            yield layer


def build_profile(name, classes=1000):
    import tensorflow as tf
    build = getattr(tf.keras.applications, MODELS[name].application)
    model = build(weights=None, input_shape=PUBLISHED_INPUTS[name], classes=classes)
    rows = layer_profile(model)
    tf.keras.backend.clear_session()
    return rows


def load_profiles(path=PROFILES):
    return read_profiles(path)


def main(argv=None):
    names = (sys.argv[1:] if argv is None else argv) or list(PUBLISHED_INPUTS)
    data = {k: v.model_dump(exclude_none=True) for k, v in load_profiles().items()} if os.path.exists(PROFILES) else {}
    for name in names:
        layers = build_profile(name)
        data[name] = {"input_shape": list(PUBLISHED_INPUTS[name]), "classes": 1000,
                      "layers": [x.model_dump(exclude_none=True) for x in layers]}
        total = sum(x.grad_bytes for x in layers) / 4e6
        print(f"{name}: {len(layers)} weighted layers, {total:.1f} M parameters, "
              f"{sum(x.flops for x in layers) / 1e9:.2f} GFLOPs forward")
    write_atomic(PROFILES, json.dumps(data, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
