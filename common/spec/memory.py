"""What a process of the configured job will hold in memory, estimated from its config alone.

A model or data set too large for the machine is refused up front with the estimate (one
``error:`` line), not met later as a MemoryError traceback or the OOM killer mid-job; ``hvdps
compare`` adds the per-process figure up over a job's tasks on one host.
"""
import math

from common.base.errors import UsageError
from common.spec import builtins
from common.spec.datasets import SYNTHETIC_TEST_SAMPLES, CLICK_FEATURES
from common.base import procs   # procs.machine_memory() read at call time: tests set the machine's memory


# What one TensorFlow task holds before its model and data: the runtime, the Python process and
# the gRPC or MPI buffers (proportional set size 0.3-0.4 GiB per task of a PS job of the MLP here).
TF_PROCESS_BYTES = 512 << 20


def memory_estimate(cfg):
    """[(flags, bytes, what)]: the least one process holds for the built-in models and data, from
    the config alone (no TensorFlow): float32 weights with their gradient, two optimizer slots and
    a broadcast copy (5 x the parameters), the generated arrays (drawn as float64, kept as
    float32), the CNN's activations for one batch (forward and backward). Plug-ins and the
    Keras applications' activations are not estimated; TensorFlow reports those itself."""
    parts = []
    data = builtins.data_of(cfg)
    shape = data.pixels(cfg) if data else None
    classes = data.num_classes(cfg) if data else cfg.num_classes
    if data and data.shape_from_flags:
        n = cfg.synthetic_samples + min(SYNTHETIC_TEST_SAMPLES, max(8, cfg.synthetic_samples // 4))
        parts.append((f"--image_shape {','.join(map(str, shape))} x --synthetic_samples {cfg.synthetic_samples}",
                      12 * n * math.prod(shape), f"the {data.name} images"))
    model = MODEL_MEMORY.get(cfg.model)
    if model:
        parts += model(cfg, shape, classes)
    return parts


def _embeddings(cfg, shape, classes):
    table = 4 * CLICK_FEATURES * cfg.embedding_rows * cfg.embedding_dim
    return [(f"--embedding_rows {cfg.embedding_rows} x --embedding_dim {cfg.embedding_dim}", 3 * table,
             f"{CLICK_FEATURES} tables of {table / 2**30:.1f} GiB with their gradient and a copy")]


def _logits(cfg, classes):
    return (f"--num_classes {classes} x --batch_size {cfg.batch_size}", 12 * cfg.batch_size * classes,
            "one batch's logits, their softmax and its gradient")


def _mlp(cfg, shape, classes):
    if not shape:
        return []
    features = math.prod(shape)
    params = features * cfg.hidden_units + cfg.hidden_units * (classes + 1) + classes
    return [(f"--hidden_units {cfg.hidden_units}", 20 * params,
             f"the MLP's {params:.3g} weights with gradient, optimizer slots and a copy"), _logits(cfg, classes)]


def _cnn(cfg, shape, classes):
    if not shape:
        return []
    h, w, c = shape
    params = 9 * c * 32 + 9 * 32 * 64 + (h // 2) * (w // 2) * 64 * 128 + 128 * classes
    activations = 4 * 3 * cfg.batch_size * h * w * (32 + 64)
    return [_logits(cfg, classes), (f"--image_shape {','.join(map(str, shape))}", 20 * params + activations,
                                    f"the CNN's {params:.3g} weights and one batch's activations")]


def transformer_parameters(size, vocab, positions):
    """The weights of common/model/models.py's transformer: embeddings (the output layer tied to the
    tokens'), per block attention (four D x D kernels and biases), the MLP and two LayerNormalizations."""
    d, m = size.width, size.mlp
    block = 4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d
    return vocab * d + positions * d + size.layers * block + 2 * d


def _transformer(cfg, shape, classes):
    size = builtins.TRANSFORMER_SIZES[cfg.transformer_size]
    tokens, d = cfg.batch_size * cfg.seq_len, size.width
    params = transformer_parameters(size, classes, cfg.seq_len)
    # per token and block: about 12 D-wide and 2 MLP-wide float32 activations kept for the backward pass,
    # and each head's row of attention scores and probabilities
    activations = 4 * tokens * size.layers * (12 * d + 2 * size.mlp + 2 * size.heads * cfg.seq_len)
    return [(f"--transformer_size {size.name} x --seq_len {cfg.seq_len} x --batch_size {cfg.batch_size}",
             20 * params + activations + 12 * tokens * classes,
             f"the transformer's {params:.3g} weights, one batch's activations and its logits")]


# What each built-in model holds beyond its data, by the name common/spec/builtins.py declares it under.
MODEL_MEMORY = {"mlp": _mlp, "cnn": _cnn, "rec": _embeddings, "transformer": _transformer}


def check_memory(cfg):
    """A model or data set that cannot fit in this machine's memory is refused up front with the
    estimate, rather than a MemoryError traceback (or the OOM killer) once the job has started."""
    memory = procs.machine_memory()
    parts = memory_estimate(cfg)
    total = sum(b for _, b, _ in parts)
    if memory and total > memory:
        flags, _, what = max(parts, key=lambda p: p[1])
        raise UsageError(f"{flags}: about {total / 2**30:,.1f} GiB per process ({what}); this machine has "
                         f"{memory / 2**30:.1f} GiB")
