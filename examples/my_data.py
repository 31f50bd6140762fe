"""A dataset plug-in: hvdps-compare --dataset examples/my_data.py:load ...

hvdps calls ``load(cfg)`` on every worker and shards what it returns exactly like
the built-in data sets. Return (x_train, y_train, x_test, y_test) as NumPy arrays:
x of shape (N, H, W[, C]) or (N, features), y integer class ids 0..classes-1.
Load from local files (nothing can be downloaded on a cluster without internet);
this example builds 16x16 images from scikit-learn's bundled digits.
"""
import numpy as np


def load(cfg):
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = np.kron(digits.images, np.ones((2, 2))).astype(np.float32) / 16.0   # 8x8 -> 16x16
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(0).permutation(len(x))                   # fixed split, not cfg.seed
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]
