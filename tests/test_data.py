import numpy as np
import pytest

from common.spec.config import make_config
from common.inputs.data import (DataError, load_mnist, make_dataset, shard_indices, steps_per_epoch,
                         train_index_stream, write_idx)
from common.base.errors import UsageError


def _mnist_arrays(n_train=50, n_test=20, size=28):
    rng = np.random.RandomState(0)
    return {
        "x_train": rng.randint(0, 256, (n_train, size, size)).astype(np.uint8),
        "y_train": rng.randint(0, 10, n_train).astype(np.uint8),
        "x_test": rng.randint(0, 256, (n_test, size, size)).astype(np.uint8),
        "y_test": rng.randint(0, 10, n_test).astype(np.uint8),
    }


NAMES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
         "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}


def write_idx_set(d, arrays, gz=False):
    for key, name in NAMES.items():
        write_idx(str(d / (name + (".gz" if gz else ""))), arrays[key])


@pytest.mark.parametrize("gz", [False, True])
def test_idx_round_trip(tmp_path, gz):
    arrays = _mnist_arrays()
    write_idx_set(tmp_path, arrays, gz)
    x, y, xt, yt = load_mnist(str(tmp_path))
    assert x.shape == (50, 28, 28, 1) and xt.shape == (20, 28, 28, 1)
    np.testing.assert_allclose(x[..., 0], arrays["x_train"] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(y, arrays["y_train"])
    assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0


def test_npz(tmp_path):
    arrays = _mnist_arrays()
    np.savez(tmp_path / "mnist.npz", **arrays)
    x, y, xt, yt = load_mnist(str(tmp_path))
    np.testing.assert_array_equal(yt, arrays["y_test"])


def _corrupt(path, how):
    raw = open(path, "rb").read()
    if how == "truncate":
        open(path, "wb").write(raw[:-7])
    elif how == "magic":
        open(path, "wb").write(b"\x00\x00\x08\x04" + raw[4:])
    elif how == "header":
        open(path, "wb").write(raw[:5])


@pytest.mark.parametrize("target, how, message", [
    ("train-images-idx3-ubyte", "truncate", "train-images-idx3-ubyte: truncated"),
    ("train-labels-idx1-ubyte", "magic", "bad magic number 2052, expected 2049"),
    ("t10k-images-idx3-ubyte", "header", "truncated header"),
    ("t10k-labels-idx1-ubyte", "delete", r"neither mnist.npz nor t10k-labels-idx1-ubyte\[.gz\] found"),
])
def test_bad_idx_files(tmp_path, target, how, message):
    write_idx_set(tmp_path, _mnist_arrays())
    path = tmp_path / target
    if how == "delete":
        path.unlink()
    else:
        _corrupt(str(path), how)
    with pytest.raises(DataError, match=message):
        load_mnist(str(tmp_path))


def test_label_out_of_range(tmp_path):
    arrays = _mnist_arrays()
    arrays["y_test"][3] = 12
    write_idx_set(tmp_path, arrays)
    with pytest.raises(DataError, match="test label out of range 0..9"):
        load_mnist(str(tmp_path))


def test_count_mismatch_npz(tmp_path):
    arrays = _mnist_arrays()
    arrays["y_train"] = arrays["y_train"][:-1]
    np.savez(tmp_path / "mnist.npz", **arrays)
    with pytest.raises(DataError, match="50 train images but labels of shape"):
        load_mnist(str(tmp_path))


def test_garbage_npz(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_mnist(str(tmp_path))


def test_gzip_truncated(tmp_path):
    write_idx_set(tmp_path, _mnist_arrays(), gz=True)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz"):
        load_mnist(str(tmp_path))


@pytest.mark.parametrize("n, shards", [(100, 1), (100, 2), (101, 3), (1438, 4), (7, 7)])
@pytest.mark.parametrize("epoch", [0, 3])
def test_shards_disjoint_and_cover(n, shards, epoch):
    parts = [shard_indices(n, i, shards, epoch, seed=5) for i in range(shards)]
    flat = np.concatenate(parts)
    assert len(set(flat.tolist())) == len(flat)                       # disjoint
    assert len(flat) == (n // shards) * shards                          # the whole set, minus < shards
    assert all(len(p) == n // shards for p in parts)                    # equal work per worker
    assert set(range(n)) - set(flat.tolist()) == set() or n % shards    # union is everything


def test_shards_change_per_epoch_and_seed():
    a = shard_indices(100, 0, 2, 0, seed=1)
    assert not np.array_equal(a, shard_indices(100, 0, 2, 1, seed=1))
    assert not np.array_equal(a, shard_indices(100, 0, 2, 0, seed=2))
    np.testing.assert_array_equal(a, shard_indices(100, 0, 2, 0, seed=1))


@pytest.mark.parametrize("workers, batch", [(2, 8), (3, 5), (4, 4)])
def test_union_of_worker_batches_is_the_big_batch(workers, batch):
    """The property that makes n workers x batch b equal one process x batch n*b."""
    cfg = make_config(batch_size=batch, epochs=2)
    big = train_index_stream(cfg.replace(batch_size=batch * workers), 1438, 0, 1, 2).reshape(-1, batch * workers)
    streams = [train_index_stream(cfg, 1438, i, workers, 2).reshape(-1, batch) for i in range(workers)]
    assert all(len(s) == len(big) for s in streams)
    for k in range(len(big)):
        assert sorted(np.concatenate([s[k] for s in streams]).tolist()) == sorted(big[k].tolist())


def test_steps_per_epoch_errors_when_batch_too_big():
    assert steps_per_epoch(100, 2, 10) == 5
    with pytest.raises(UsageError, match="lower --batch_size"):
        steps_per_epoch(100, 4, 30)


def test_make_dataset_shapes_and_length():
    cfg = make_config(batch_size=16, epochs=2)
    ds = make_dataset(cfg, 1, 2)
    batches = list(ds)
    assert len(batches) == 2 * steps_per_epoch(1438, 2, 16)
    x, y = batches[0]
    assert x.shape == (16, 8, 8, 1) and y.shape == (16,)
    test = list(make_dataset(cfg, 0, 1, split="test"))
    assert sum(int(b[1].shape[0]) for b in test) == 359


def test_make_dataset_resume_skips_steps():
    cfg = make_config(batch_size=16, epochs=1)
    full = [b[1].numpy() for b in make_dataset(cfg, 0, 2)]
    later = [b[1].numpy() for b in make_dataset(cfg, 0, 2, start_step=3)]
    assert len(later) == len(full) - 3
    np.testing.assert_array_equal(later[0], full[3])


def test_test_split_sharding_covers_test_set():
    cfg = make_config(batch_size=50)
    counts = [sum(int(b[1].shape[0]) for b in make_dataset(cfg, i, 3, split="test")) for i in range(3)]
    assert sum(counts) == 359


def test_synthetic_shape():
    cfg = make_config(dataset="synthetic", image_shape=(12, 10, 3), num_classes=7, synthetic_samples=64,
                      batch_size=8)
    x, y = next(iter(make_dataset(cfg, 0, 1)))
    assert x.shape == (8, 12, 10, 3) and int(np.max(y)) < 7


def test_digits_is_real_and_split_fixed():
    from common.inputs.data import load_digits
    x, y, xt, yt = load_digits()
    assert len(x) + len(xt) == 1797 and len(xt) == 359
    assert set(np.unique(y)) == set(range(10))
    x2, y2, _, _ = load_digits()
    np.testing.assert_array_equal(y, y2)
    # the file scikit-learn 1.5.2 ships as sklearn/datasets/data/digits.csv.gz, byte for byte
    import hashlib
    from common.inputs.data import DIGITS_FILE
    with open(DIGITS_FILE, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == \
            "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    assert x.dtype == np.float32 and x.shape[1:] == (8, 8, 1) and 0 <= x.min() and x.max() == 1.0


# A py_function's exception as TensorFlow 2.21 hands it on: under TF2 PS the coordinator's step raises it with
# each remote task's frames replaced by "<stack traces unavailable>", and the worker that read it named.
_REMOTE = ("Graph execution error:\n\nDetected at node EagerPyFunc defined at (most recent call last):\n"
           "<stack traces unavailable>\nError in user-defined function passed to MapDataset:14 transformation with "
           "iterator: Iterator::Root::Prefetch::Map:  {cause}\nTraceback (most recent call last):\n\n  File "
           "\"p.py\", line 13, in bad\n\nValueError: record 30\n\n\t [[{{{{node EagerPyFunc}}}}]]\n"
           "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
           "/tensorflow.eager.EagerService/Enqueue:\n:UNKNOWN:Error received from peer")


@pytest.mark.unit
@pytest.mark.parametrize("text, line", [
    (_REMOTE.format(cause="ValueError: record 30 of my_store is damaged"),
     "chief: reading the training data: the input pipeline on worker 1: it raised ValueError: record 30 of my_store "
     "is damaged"),
    (_REMOTE.format(cause="2 root error(s) found.\n  (0) INVALID_ARGUMENT: my_pkg.BadRecord: record 30"),
     "chief: reading the training data: the input pipeline on worker 1: it raised my_pkg.BadRecord: record 30"),
    ("Error in user-defined function passed to MapDataset:3 transformation with iterator: Iterator::Root::Map:  "
     "Incompatible shapes: [3] vs [4]", "chief: reading the training data: the input pipeline: it raised "
                                       "Incompatible shapes: [3] vs [4]"),
])
def test_a_pipeline_that_raises_is_named_by_its_exception_not_by_frames(text, line):
    import tensorflow as tf
    from common.inputs.data import input_failure
    assert str(input_failure(tf.errors.InvalidArgumentError(None, None, text), "chief")) == line
