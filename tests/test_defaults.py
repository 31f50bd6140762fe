"""Defaults that train: every built-in small model, with its default optimizer and learning rate
(common.spec.config.MODEL_DEFAULTS), reaches >= 0.90 test accuracy within EPOCHS epochs at 1 and 4
workers under Horovod, and at 4 workers under PS async (ASYNC_EPOCHS): the CNN on MNIST-format 28x28
files, the MLP on them at 1 worker and on its default input, the 8x8 digits, at 4.

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
on the OS scheduler, so the final evaluation of one run is a draw. Measured on the 28x28 MLP at 4
workers, two runs at once beside a CPU hog (as CI's two test workers load the machine), 8 epochs:
final accuracy 0.933-0.967, and CI has drawn 0.894. So async is held as hvdps's verdict holds every
method, by time to accuracy: evaluated each epoch, it must reach the 0.90 target within its budget
(ASYNC_EPOCHS), and its last evaluation must stay within ASYNC_DIP of that target.
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
ASYNC_DIP = 0.05
FLAGS = ["--batch_size", "16", "--log_every", "20", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false",
         "--probe_steps", "0"]


def budget(backend):
    if backend == "ps:async":
        return ["--epochs", str(ASYNC_EPOCHS), "--eval_every_epoch", "true"]
    return ["--epochs", str(EPOCHS)]


def assert_trained(row, *what):
    """Sync: the last evaluation clears the target. Async: an evaluation reached it, and the last
    one (after the stalest gradients) stays within ASYNC_DIP of it."""
    assert row.target_accuracy == 0.90
    if row.backend == "ps" and row.mode == "async":
        best = max(e.accuracy for e in row.curves.evals)
        assert row.time_to_target is not None, (*what, best, row.final_test_accuracy)
        assert row.final_test_accuracy >= row.target_accuracy - ASYNC_DIP, (*what, best, row.final_test_accuracy)
    else:
        assert row.final_test_accuracy >= row.target_accuracy, (*what, row.final_test_accuracy)


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
# The CNN at both ends under both; the MLP's 4-worker ends are held on its own input, the 8x8 digits
# (DIGITS): the rate as given is the 1-worker run here, and 28x28 files change only its input layer.
MNIST = [("mlp", "horovod", 1)] + [("cnn", b, w) for b in BACKENDS for w in (1, 4) if w == 4 or b == "horovod"]
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
    assert_trained(row, model, backend, workers)


@pytest.mark.parametrize("model, backend, workers", DIGITS)
@pytest.mark.process
def test_defaults_train_on_8x8_digits(tmp_path, model, backend, workers):
    out = str(tmp_path / "run")
    r = _launch(backend, workers, ["--model", model, "--dataset", "digits", *FLAGS, *budget(backend), "--train_dir", out])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    row, _ = row_and_records(out)
    assert row.dataset == "digits"
    assert_trained(row, model, backend, workers)
