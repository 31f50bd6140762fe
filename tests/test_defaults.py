"""Defaults that train: every built-in small model, with its default optimizer and learning rate
(common.spec.config.MODEL_DEFAULTS), reaches >= 0.90 test accuracy on MNIST-format 28x28 files within
EPOCHS epochs at 1 and 4 workers under Horovod, and at 4 workers under PS async (ASYNC_EPOCHS).

Horovod stands for every synchronous method. What a method can do to the defaults is the learning
rate it scales by the workers and the gradients it averages, and the sync methods share both: each
one's 2-worker run is held to one process with the double batch, weight for weight
(test_horovod.py, test_mwms.py, test_ps.py): MultiWorkerMirroredStrategy and PS sync make the
updates of big-batch SGD, as Horovod does. PS async is the one that differs (stale gradients), and it also
trains the TF1 optimizers PS sync uses. One worker is run once: every method's single worker is
the same optimizer at the same rate on the same batches.

The files are written here from the bundled digits (upscaled 3x and padded to 28x28),
read through the real IDX loader. Only the batch (16) and the epoch budget are set; 4 workers are
oversubscribed on this 2-core machine, which slows them but does not change what they compute.
1 and 4 workers are the ends of what the defaults face here: the rate as given, and the rate scaled
4x (sync) or the stalest gradients (async); 2 workers lie between them.

Except under PS async: there, a descheduled worker pushes stale gradients, and how stale depends
on the OS scheduler. Measured on the 28x28 MLP at 4 workers (10 runs each): 5 epochs gave
0.891-0.972 (CI once saw 0.8997), 8 epochs gave 0.947-0.967. Horovod and PS sync at 4 workers gave
the same accuracy every run (0.950, 0.955). So async gets the budget at which its worst case still
clears the bar, rather than a lower bar.
"""
import os
import sys

import numpy as np
import pytest

from common.spec.config import MODEL_DEFAULTS
from common.inputs.data import load_digits, write_idx
from tests.conftest import BIN, REPO, py, run, row_and_records

EPOCHS = 5
ASYNC_EPOCHS = 8
FLAGS = ["--batch_size", "16", "--log_every", "20", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false",
         "--probe_steps", "0"]


def budget(backend):
    return ["--epochs", str(ASYNC_EPOCHS if backend == "ps:async" else EPOCHS)]


@pytest.fixture(scope="module")
def mnist28(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist28")
    x_train, y_train, x_test, y_test = load_digits()

    def to28(x):
        x = np.kron((x[..., 0] * 255).astype(np.uint8), np.ones((3, 3), np.uint8))   # 8x8 -> 24x24
        return np.pad(x, ((0, 0), (2, 2), (2, 2)))                                     # -> 28x28
    write_idx(str(folder / "train-images-idx3-ubyte.gz"), to28(x_train))
    write_idx(str(folder / "train-labels-idx1-ubyte.gz"), y_train)
    write_idx(str(folder / "t10k-images-idx3-ubyte.gz"), to28(x_test))
    write_idx(str(folder / "t10k-labels-idx1-ubyte.gz"), y_test)
    return str(folder)


def _launch(backend, workers, flags, timeout=420):
    if backend == "horovod":
        if workers == 1:
            return run([sys.executable, os.path.join(REPO, "horovod_train", "main.py"), *flags], timeout=timeout)
        return run([os.path.join(BIN, "horovodrun"), "-np", str(workers), "-H", f"localhost:{workers}", "--gloo",
                    sys.executable, os.path.join(REPO, "horovod_train", "main.py"), *flags], timeout=timeout)
    mode = backend.split(":")[1]
    return py("-m", "ps_train.launch", "--num_workers", str(workers), f"--{mode}", *flags, timeout=timeout)


BACKENDS = ["horovod", "ps:async"]
MNIST = [(m, b, w) for m in ("mlp", "cnn") for b in BACKENDS for w in (1, 4) if w == 4 or b == "horovod"]
# 8x8 digits: the MLP (the default workload) at 4 workers; at 1 and 2 it is already held to 0.90 by
# test_horovod/test_ps. The CNN's workloads are the 28x28 ones above and the demo's.
DIGITS = [("mlp", b, 4) for b in BACKENDS]


@pytest.mark.parametrize("model, backend, workers", MNIST)
@pytest.mark.process
def test_defaults_train_on_28x28(tmp_path, mnist28, model, backend, workers):
    out = str(tmp_path / "run")
    flags = ["--model", model, "--dataset", "mnist", "--data_dir", mnist28, *FLAGS, *budget(backend)]
    r = _launch(backend, workers, [*flags, "--train_dir", out])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    row, curves = row_and_records(out)
    assert curves["header"]["plan"]["workers"] == workers
    cfg = curves["header"]["config"]
    assert (cfg["optimizer"], cfg["learning_rate"]) == MODEL_DEFAULTS.get(model, MODEL_DEFAULTS["*"])
    assert row.final_test_accuracy >= 0.90, (model, backend, workers, row.final_test_accuracy)


@pytest.mark.parametrize("model, backend, workers", DIGITS)
@pytest.mark.process
def test_defaults_train_on_8x8_digits(tmp_path, model, backend, workers):
    out = str(tmp_path / "run")
    r = _launch(backend, workers, ["--model", model, "--dataset", "digits", *FLAGS, *budget(backend), "--train_dir", out])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    row, _ = row_and_records(out)
    assert row.dataset == "digits"
    assert row.final_test_accuracy >= 0.90, (model, backend, workers, row.final_test_accuracy)
