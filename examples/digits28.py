"""The bundled digits as MNIST-sized 28x28 images (each pixel 3x3, 2 pixels of border).

    hvdps compare --model cnn --dataset examples/digits28.py:load --batch_size 128 ...

The demo's compute-bound workload: real data at MNIST's shape without a download.
"""
import numpy as np


def load(cfg):
    from common.inputs.data import load_digits      # hvdps' own split of scikit-learn's digits
    x_train, y_train, x_test, y_test = load_digits()

    def to28(x):
        return np.pad(np.kron(x[..., 0], np.ones((3, 3), np.float32)), ((0, 0), (2, 2), (2, 2)))
    return to28(x_train), y_train, to28(x_test), y_test
