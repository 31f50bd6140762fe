"""A dataset plug-in: hvdps compare --dataset examples/my_data.py:load ...

hvdps calls ``load(cfg)`` on every worker and shards what it returns exactly like
the built-in data sets. Return (x_train, y_train, x_test, y_test) as NumPy arrays:
x of shape (N, H, W[, C]) or (N, features), y integer class ids 0..classes-1.
Load from local files (nothing can be downloaded on a cluster without internet);
this example builds 16x16 images from the repository's copy of the 8x8 digits
(common/inputs/digits.csv.gz: 64 pixel counts 0..16 and the label per row).
"""
import os

import numpy as np

DIGITS = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir, "common", "inputs", "digits.csv.gz")


def load(cfg):
    rows = np.loadtxt(DIGITS, delimiter=",", dtype=np.int64)
    images = rows[:, :-1].reshape(-1, 8, 8)
    x = np.kron(images, np.ones((2, 2))).astype(np.float32) / 16.0   # 8x8 -> 16x16
    y = rows[:, -1]
    order = np.random.RandomState(0).permutation(len(x))                   # fixed split, not cfg.seed
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]
