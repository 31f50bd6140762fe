"""A dataset plug-in that returns tf.data pipelines: hvdps compare --dataset examples/my_pipelines.py:load ...

For data you already read with tf.data (files, a feature store, your own parsing). ``load(cfg)``
returns a dict: ``train`` and ``test``, each a function of an input context ``ctx`` (as the
``dataset_fn`` tf.distribute's ``distribute_datasets_from_function`` takes) giving a
``tf.data.Dataset`` of ``(x, y)`` batches for worker ``ctx.worker_index`` of ``ctx.num_workers``,
at ``ctx.batch_size`` per worker; and ``train_examples``, ``input_shape`` (one example's) and
``classes``, which the run plan and the model need before any batch is read.

The plug-in shards and batches (as Horovod's examples do: ``ds.shard(size, rank)``); hvdps counts:
each epoch is the plan's steps per epoch of ``train(ctx)`` (``ctx.epoch`` is that epoch, a scalar
tensor: use it in a seed), a resumed run skips the batches it had read, and every batch's shape,
size and labels are checked. Training batches must hold exactly ``ctx.batch_size`` examples.
The test parts of the workers must add up to the whole test set. This example serves the
repository's copy of the 8x8 digits (common/inputs/digits.csv.gz) from memory, split as my_data.py does.
"""
import os

import numpy as np

DIGITS = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "common", "inputs", "digits.csv.gz")


def load(cfg):
    import tensorflow as tf
    rows = np.loadtxt(DIGITS, delimiter=",", dtype=np.int64)
    x = (rows[:, :-1].reshape(-1, 8, 8, 1) / 16.0).astype(np.float32)
    y = rows[:, -1]
    order = np.random.RandomState(0).permutation(len(x))                   # fixed split, not cfg.seed
    test, train = order[:360], order[360:]

    def train_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x[train], y[train])).shard(ctx.num_workers, ctx.worker_index)
        return ds.shuffle(len(train), seed=ctx.seed + ctx.epoch).batch(ctx.batch_size, drop_remainder=True)

    def test_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((x[test], y[test])).shard(ctx.num_workers, ctx.worker_index)
        return ds.batch(256)

    return {"train": train_fn, "test": test_fn, "train_examples": len(train), "input_shape": (8, 8, 1),
            "classes": 10}
