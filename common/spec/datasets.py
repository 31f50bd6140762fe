"""Sizes of the built-in data sets that are known without loading them: what the memory estimate
(common/spec/memory.py) and the loaders (common/inputs/data.py) both read, so neither imports the other."""

SYNTHETIC_TEST_SAMPLES = 256   # at most: a quarter of --synthetic_samples, at least 8
CLICK_FEATURES = 4              # categorical features per example (user, item, context, ...)
# Values in one example as trained (H*W*C): 256 MiB of float32. A shape past it (a typo, a crafted
# dataset.json) is refused before a batch, a model or a buffer of that size is allocated.
MAX_EXAMPLE_VALUES = 1 << 26
# Values of one stored image decoded (H*W*C, before a resize): a decompression bomb (a few hundred
# bytes that declare 30000x30000 pixels) is refused from its header, before it is decoded.
MAX_DECODED_VALUES = 1 << 28


from dataclasses import dataclass
from typing import Callable, Tuple


@dataclass(frozen=True)
class InputContext:
    """What a data plug-in's pipeline factory is given, as tf.distribute's InputContext gives a
    ``dataset_fn``: which worker it builds for, of how many, at what batch, with what seed, and
    which epoch (a scalar int64 tensor: the factory runs inside ``Dataset.flat_map``; use it in a
    seed, ``seed=ctx.seed + ctx.epoch``)."""
    worker_index: int
    num_workers: int
    batch_size: int            # per worker
    seed: int
    epoch: object              # int64 scalar tensor (test: 0)


@dataclass(frozen=True)
class Pipelines:
    """A data plug-in that returns tf.data pipeline factories instead of arrays, as validated
    (common.spec.plugins.pipelines_of): ``train(ctx)`` gives worker ``ctx.worker_index``'s batches of
    ``ctx.batch_size`` for epoch ``ctx.epoch``, already sharded; ``test(ctx)`` its part of the test
    set (the workers' parts add up to the whole); the sizes the plan and the model need."""
    train: Callable
    test: Callable
    train_examples: int
    input_shape: Tuple[int, ...]
    classes: int
    source: str
