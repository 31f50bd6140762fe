"""Data sets and deterministic sharding shared by every method.

Sharding rule (the reason the backends can be compared sample for sample):
every epoch draws one permutation of the *whole* training set from
``(seed, epoch)``; worker ``i`` of ``n`` takes positions ``i, i+n, i+2n, ...``
and every shard is cut to the same length. Then, for every step ``k``, the union
of the ``n`` workers' batches of size ``b`` is exactly batch ``k`` of a single
process that uses batch ``n*b`` -- which is what makes synchronous data
parallelism provably equivalent to one big-batch process, and is tested.
"""
import gzip
import hashlib
import os
import re
import struct
import time

import numpy as np

from common.base.errors import UsageError, InputError, describe, RunError
from common.base.files import check_regular
from common.spec import builtins
from common.spec.builtins import data_of, model_of
from common.spec.datasets import CLICK_FEATURES, SYNTHETIC_TEST_SAMPLES  # noqa: F401  (read here by tests)
from common.spec.plan import make_plan, steps_per_epoch
from common.base import procs   # procs.machine_memory() read at call time: tests set the machine's memory
from common.inputs.records import (READING, SPEC, check_sharding, fingerprint, locate_damage, locate_undecodable,
                                   shard_digests, spec_of, stream)
from common.spec.config import Config
from common.spec.plugins import load_dataset, is_plugin, call
from common.inputs.pysrc import load_pysrc
from common.spec.datasets import Pipelines, InputContext

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049
MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 20240229   # fixed: the test set never depends on the training seed
MAX_INPUT = 4 << 30            # bytes read from one data file (MNIST's four files hold 55 MB)


class DataError(UsageError):
    """A data file is missing, truncated or not what it claims to be."""


# ---------------------------------------------------------------- MNIST files
def _open(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_idx(path, expect_magic):
    """Read one IDX file (images: magic 2051, 3 dims; labels: magic 2049, 1 dim)."""
    name = os.path.basename(path)
    check_regular(path, "an IDX file", MAX_INPUT)
    try:
        with _open(path) as f:
            raw = f.read(MAX_INPUT + 1)          # bounded also for a .gz that inflates without end
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read: {exc}")
    if len(raw) > MAX_INPUT:
        raise DataError(f"{path}: more than {MAX_INPUT >> 20} MiB: not an MNIST-format file")
    if len(raw) < 8:
        raise DataError(f"{path}: truncated header ({len(raw)} bytes)")
    magic, count = struct.unpack(">II", raw[:8])
    if magic != expect_magic:
        raise DataError(f"{path}: bad magic number {magic}, expected {expect_magic} for {name}")
    ndim = 3 if expect_magic == IDX_IMAGES_MAGIC else 1
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header ({len(raw)} bytes)")
    dims = struct.unpack(">" + "I" * ndim, raw[4:header])
    if ndim == 3 and (dims[1] == 0 or dims[2] == 0):
        raise DataError(f"{path}: image size {dims[1]}x{dims[2]} is empty")
    want = int(np.prod(dims))
    have = len(raw) - header
    if have != want:
        raise DataError(f"{path}: {'truncated' if have < want else 'trailing data'}: "
                        f"header says {dims} = {want} bytes, file has {have}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find(data_dir, stem):
    for candidate in (stem, stem + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.exists(path):
            return path
    return None


def load_mnist(data_dir):
    """MNIST from a local folder: Keras' ``mnist.npz`` or the four IDX files."""
    if not data_dir or not os.path.isdir(data_dir):
        raise DataError(f"MNIST data dir {data_dir!r} does not exist")
    npz = os.path.join(data_dir, "mnist.npz")
    if os.path.exists(npz):
        check_regular(npz, "an .npz file", MAX_INPUT)
        try:
            with np.load(npz, allow_pickle=False) as z:
                missing = [k for k in MNIST_FILES if k not in z.files]
                if missing:
                    raise DataError(f"{npz}: missing arrays {', '.join(missing)}")
                arrays = {k: z[k] for k in MNIST_FILES}
        except DataError:
            raise
        except Exception as exc:  # zipfile/pickle errors: many types, one message
            raise DataError(f"{npz}: not a readable .npz file: {exc}")
        source = npz
    else:
        arrays = {}
        for key, stem in MNIST_FILES.items():
            path = _find(data_dir, stem)
            if path is None:
                raise DataError(f"{data_dir}: neither mnist.npz nor {stem}[.gz] found")
            magic = IDX_IMAGES_MAGIC if key.startswith("x") else IDX_LABELS_MAGIC
            arrays[key] = read_idx(path, magic)
        source = data_dir
    for split in ("train", "test"):
        x, y = arrays["x_" + split], arrays["y_" + split]
        if x.ndim != 3:
            raise DataError(f"{source}: x_{split} should be N x H x W, has shape {x.shape}")
        if x.shape[1:] != (28, 28):
            raise DataError(f"{source}: {split} images are {x.shape[1]}x{x.shape[2]}; MNIST-format files hold "
                            f"28x28 images (other data: --dataset synthetic or your own loader)")
        if y.ndim != 1 or len(x) != len(y):
            raise DataError(f"{source}: {len(x)} {split} images but labels of shape {y.shape}")
        if y.dtype.kind not in "iu":
            raise DataError(f"{source}: {split} labels have dtype {y.dtype}; expected integer class ids 0..9")
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise DataError(f"{source}: {split} label out of range 0..9 (found {int(y.min())}..{int(y.max())})")
    scale = lambda x: (x.astype(np.float32) / 255.0)[..., None]
    return scale(arrays["x_train"]), arrays["y_train"], scale(arrays["x_test"]), arrays["y_test"]


def write_idx(path, array):
    """Write an IDX file (used by tests and by users converting their own data)."""
    array = np.asarray(array, dtype=np.uint8)
    magic = IDX_IMAGES_MAGIC if array.ndim == 3 else IDX_LABELS_MAGIC
    payload = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape) + array.tobytes()
    with _open_write(path) as f:
        f.write(payload)


def _open_write(path):
    return gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")


# ---------------------------------------------------------------- digits
DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")


def load_digits():
    """The 8x8 handwritten digits: 1797 images of 0..16 pixel counts, one "64 pixels, label" row each.
    The file is the copy scikit-learn ships (the test set of the UCI ML "Optical Recognition of
    Handwritten Digits", E. Alpaydin and C. Kaynak, CC BY 4.0), byte for byte. It is read here, not
    through scikit-learn, because with scikit-learn installed every ``import tensorflow`` also imports
    it and SciPy (Keras' scikit-learn wrappers), about 1 s more in every process a run starts."""
    rows = np.loadtxt(DIGITS_FILE, delimiter=",", dtype=np.int64)
    x = (rows[:, :-1].reshape(-1, 8, 8).astype(np.float32) / 16.0)[..., None]
    y = rows[:, -1].astype(np.int32)
    perm = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(x))
    n_test = int(round(len(x) * DIGITS_TEST_FRACTION))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def load_synthetic(cfg):
    rng = np.random.RandomState(cfg.seed)
    shape = tuple(cfg.image_shape)
    make = lambda n: (rng.standard_normal((n,) + shape).astype(np.float32),
                      rng.randint(0, cfg.num_classes, size=n).astype(np.int32))
    x_train, y_train = make(cfg.synthetic_samples)
    x_test, y_test = make(min(SYNTHETIC_TEST_SAMPLES, max(8, cfg.synthetic_samples // 4)))
    return x_train, y_train, x_test, y_test


CLICK_TRAIN, CLICK_TEST = 32768, 4096
CLICK_ZIPF = 1.1               # id frequency ~ 1 / rank^1.1, as in click logs: a few hot ids, a long tail
CLICK_SPLIT_SEED = 20240301    # fixed: the ids' popularity and the hidden rule never depend on --seed


def load_clicks(cfg):
    """A synthetic click log: ``CLICK_FEATURES`` categorical ids per example, each drawn from
    ``--embedding_rows`` ids with Zipf-distributed popularity, and a binary label (click or not)
    that a hidden weight per id decides (their sum's sign). A model learns it by learning an
    embedding per id; a batch touches few of a table's rows, and those it touches are mostly the
    hot ones, which is what makes the gradient of an embedding table sparse and the workload the
    one where a parameter server's sparse pull and push should beat a dense all-reduce.
    Labels are balanced; an id seen in training is predictable, an unseen tail id is not, so
    accuracy tops out near 0.80 (measured with the rec model)."""
    rows = cfg.embedding_rows
    rng = np.random.RandomState(CLICK_SPLIT_SEED)
    popularity = 1.0 / np.arange(1, rows + 1) ** CLICK_ZIPF
    popularity /= popularity.sum()
    weight = rng.standard_normal((CLICK_FEATURES, rows)).astype(np.float32)
    ids = rng.permutation(rows)                # hot ids spread over the table, not its first rows

    def draw(n):
        x = np.stack([ids[rng.choice(rows, n, p=popularity)] for _ in range(CLICK_FEATURES)], 1)
        return x.astype(np.int64), sum(weight[f, x[:, f]] for f in range(CLICK_FEATURES))
    x_train, score_train = draw(CLICK_TRAIN)
    x_test, score_test = draw(CLICK_TEST)
    # the hottest ids' weights would tip most labels one way: the threshold is the training median
    threshold = np.median(score_train)
    return (x_train, (score_train > threshold).astype(np.int32), x_test,
            (score_test > threshold).astype(np.int32))


def streamed(cfg):
    """Whether ``cfg.dataset`` is read from its files as it trains (TFRecord shards), never as arrays."""
    data = data_of(cfg)
    return bool(data and data.streamed)


def input_spec(cfg):
    """(input shape, classes): from the config for the built-ins, from the arrays for a plug-in."""
    data = data_of(cfg)
    if data and data.streamed:
        spec = record_spec(cfg)
        return tuple(spec.shape), spec.classes
    if data:
        return data.input_shape(cfg), data.num_classes(cfg)
    pipes = plugin_pipelines(cfg)
    if pipes is not None:
        return pipes.input_shape, pipes.classes
    x_train, y_train, _, y_test = load_arrays(cfg)
    return tuple(x_train.shape[1:]), int(max(y_train.max(), y_test.max())) + 1


def input_fed(cfg):
    """What the pipeline feeds the model, for the run's header: the shape of an example and the classes."""
    shape, classes = input_spec(cfg)
    return {"shape": [int(n) for n in shape], "classes": int(classes)}


_CACHE = {}

# Each built-in's loader and how its arrays' checks name it, under the name common/spec/builtins.py
# declares it by (a streamed set has none: it is read as it trains).
LOADERS = {
    "digits": (lambda cfg: load_digits(), lambda cfg: "digits"),
    "mnist": (lambda cfg: load_mnist(cfg.data_dir), lambda cfg: cfg.data_dir),
    "clicks": (load_clicks, lambda cfg: "clicks"),
    "synthetic": (load_synthetic, lambda cfg: "synthetic"),
    "pysrc": (load_pysrc, lambda cfg: "pysrc"),
}


MAX_CLASSES = 2 ** 24         # a label above this is a corrupt file, not a class (ImageNet-21k has 21,841)


def check_arrays(arrays, source, num_classes=None, ids=False, text=False):
    """Every data set, built-in or plug-in, before any process joins a job: arrays that would
    train silently wrong are refused in one line. Features must be real numbers (a complex
    part would be dropped), finite (one NaN turns every weight NaN within a step or two) and
    of a non-empty shape; labels integers (a float label would be truncated) within
    ``num_classes`` (or at most MAX_CLASSES for a plug-in, whose classes the labels define),
    checked before the cast to int32 that would wrap 2**32 + 1 to 1. ``ids``: the features are
    categorical ids (clicks), kept as integers. ``text``: byte sequences with a label per position
    (pysrc), both kept as they are (uint8: a corpus is 4 bytes a byte less as int32)."""
    out = []
    memory = procs.machine_memory()
    for split, x, y in (("train", arrays[0], arrays[1]), ("test", arrays[2], arrays[3])):
        x, y = np.asarray(x), np.asarray(y)
        # Sizes before any check touches the values: a broadcast view of 10^10 rows is a few bytes
        # until it is checked or cast, then tens of GiB (what training holds: float32 features)
        need = 4 * int(x.size) + 4 * int(y.size)
        if memory and need > memory:
            raise DataError(f"{source}: x_{split} {tuple(x.shape)} is {need / 2**30:,.1f} GiB as float32 examples "
                            f"and labels, more than this machine's {memory / 2**30:.1f} GiB; stream it instead "
                            f"(a data plug-in returning tf.data pipelines, or TFRecord files: docs/data.md)")
        if x.dtype.kind not in "buif":
            raise DataError(f"{source}: x_{split} has dtype {x.dtype}; expected real numbers (bool, int or float)")
        if x.ndim < 2 or 0 in x.shape[1:]:
            raise DataError(f"{source}: x_{split} has shape {x.shape}; each example needs at least one feature")
        if len(x) == 0:
            raise DataError(f"{source}: the {split} split is empty")
        if x.dtype.kind == "f":
            bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
            if bad.any():
                raise DataError(f"{source}: x_{split} has NaN or infinite values in {int(bad.sum())} example(s), "
                                f"the first at index {int(np.argmax(bad))}")
        if not ids and x.dtype.kind in "iuf" and x.dtype.itemsize > 4:
            # float64 (or int64) features are trained as float32: past 3.4e38 they become inf, and the
            # error would come steps later, blaming the learning rate
            big = (np.abs(x.reshape(len(x), -1)) > np.finfo(np.float32).max).any(axis=1)
            if big.any():
                raise DataError(f"{source}: x_{split} has values beyond float32's range (|x| > 3.4e38) in "
                                f"{int(big.sum())} example(s), the first at index {int(np.argmax(big))}: they "
                                f"would train as infinity; scale the features")
        labels = x.shape if text else (len(x),)
        if y.dtype.kind not in "iu" or y.shape != labels:
            raise DataError(f"{source}: y_{split} has shape {y.shape} and dtype {y.dtype}; expected "
                            f"{' x '.join(map(str, labels))} integer class ids")
        low, high = int(y.min()), int(y.max())
        limit = num_classes if num_classes is not None else MAX_CLASSES
        if low < 0 or high >= limit:
            what = f"{num_classes} classes" if num_classes is not None else f"at most {MAX_CLASSES} classes"
            raise DataError(f"{source}: y_{split} holds class ids {low}..{high}; expected 0..{limit - 1} "
                            f"({what})")
        if text:
            out += [x, y]
        else:
            out += [x if ids else x.astype(np.float32, copy=False), y.astype(np.int32, copy=False)]
    return tuple(out)


def record_spec(cfg):
    """--dataset tfrecord: the shards' description (common/inputs/records.py), its files checked once per process."""
    key = ("tfrecord", os.path.abspath(cfg.data_dir))
    if key not in _CACHE:
        _CACHE[key] = spec_of(cfg.data_dir)
    check_layout(cfg, _CACHE[key])
    return _CACHE[key]


def check_layout(cfg, spec):
    """A built-in model and the shards' layout agree, and a flag the shards fix is the shards' value:
    a language model reads text sequences of ``--seq_len`` bytes, any other model no text (the run's
    header records the flags, so a flag the data overrode would record what the model never saw)."""
    model = model_of(cfg)
    if model is None:
        return
    where = f"--data_dir {cfg.data_dir}"
    if model.text and spec.layout != "text":
        raise DataError(f"{where}: its shards are the {spec.layout} layout; --model {cfg.model} reads the text "
                        f"layout's byte sequences (hvdps data --dataset pysrc)")
    if spec.layout == "text" and not model.text:
        lms = " or ".join(m.name for m in builtins.MODELS.values() if m.text)
        raise DataError(f"{where}: its shards are text, a next byte to predict at every position: use --model "
                        f"{lms}, not {cfg.model}")
    if spec.layout == "text" and spec.shape[0] != cfg.seq_len:
        raise DataError(f"{where}: its sequences are {spec.shape[0]} bytes; --seq_len is {cfg.seq_len} (pass "
                        f"--seq_len {spec.shape[0]}, or write the shards at --seq_len {cfg.seq_len})")
    defaults = Config()
    shape = "x".join(map(str, spec.shape))
    if spec.layout == "imagenet" and tuple(cfg.image_shape) not in (tuple(defaults.image_shape), tuple(spec.shape)):
        raise DataError(f"{where}: its {SPEC} feeds the model {shape} images"
                        f"{' (resized)' if spec.resize else ''}; --image_shape {','.join(map(str, cfg.image_shape))} "
                        f"would not be what it trains on: leave it out, or describe the files again")
    if cfg.num_classes not in (defaults.num_classes, spec.classes):
        raise DataError(f"{where}: its {SPEC} holds {spec.classes} classes; --num_classes {cfg.num_classes} would "
                        f"not be what it trains on: leave it out, or describe the files again")


def _plugin_output(cfg):
    """What a data plug-in returned (called once per process): its arrays, unchecked, or Pipelines."""
    key = ("plugin", cfg.dataset, cfg.data_dir, cfg.seed, tuple(cfg.image_shape), cfg.num_classes,
           cfg.synthetic_samples, cfg.embedding_rows)
    if key not in _CACHE:
        _CACHE[key] = load_dataset(cfg)
    return _CACHE[key]


def plugin_pipelines(cfg):
    """The tf.data pipeline factories of a data plug-in that returns them (common.spec.datasets.Pipelines),
    else None (the built-ins, TFRecord shards, a plug-in's arrays)."""
    if data_of(cfg) or not is_plugin(cfg.dataset):
        return None
    out = _plugin_output(cfg)
    return out if isinstance(out, Pipelines) else None


def load_arrays(cfg):
    data = data_of(cfg)
    if data and data.streamed:
        raise DataError(f"--dataset {cfg.dataset} streams {cfg.data_dir}'s shards: it is not loaded as arrays")
    if plugin_pipelines(cfg) is not None:
        raise DataError(f"--dataset {cfg.dataset} gives tf.data pipelines: they are read as they are, not as arrays")
    key = (cfg.dataset, cfg.data_dir, cfg.seed, tuple(cfg.image_shape), cfg.num_classes,
           cfg.synthetic_samples, cfg.embedding_rows, cfg.seq_len)
    if key not in _CACHE:
        if data is None:
            arrays, source, classes = _plugin_output(cfg), f"--dataset {cfg.dataset}", None
        else:
            load, source = LOADERS[data.name]
            arrays, source, classes = load(cfg), source(cfg), data.num_classes(cfg)
        _CACHE[key] = check_arrays(arrays, source, classes, ids=bool(data and data.ids), text=bool(data and data.text))
    return _CACHE[key]


def data_shards(cfg, verify=False):
    """{file: content digest} of a TFRecord set's shards (``records.shard_digest``), once per process
    unless ``verify``; None for data not read from shards. What a resumed run compares file by file."""
    if not streamed(cfg):
        return None
    if verify:
        return shard_digests(cfg.data_dir, record_spec(cfg), verify=True)
    key = ("digests", os.path.abspath(cfg.data_dir))
    if key not in _CACHE:
        _CACHE[key] = shard_digests(cfg.data_dir, record_spec(cfg))
    return _CACHE[key]


def data_fingerprint(cfg, shards=None):
    """SHA-256 of the training arrays as trained on: a resumed run must see the same data. TFRecord
    shards: of their description and each file's content digest (``shards``, if already taken)."""
    if streamed(cfg):
        return fingerprint(record_spec(cfg), shards or data_shards(cfg))
    pipes = plugin_pipelines(cfg)
    if pipes is not None:      # the plug-in's own records are not seen: what it declares about them
        return hashlib.sha256(repr((pipes.source, pipes.train_examples, pipes.input_shape,
                                    pipes.classes)).encode()).hexdigest()
    x, y = load_arrays(cfg)[:2]
    h = hashlib.sha256()
    for a in (x, y):
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def num_examples(cfg):
    """Training examples the plan divides into steps: counted on the arrays this process then
    builds its datasets from (loaded once per process, in ``load_arrays``' cache); TFRecord shards:
    the records their description counts."""
    if streamed(cfg):
        return sum(record_spec(cfg).train.records)
    pipes = plugin_pipelines(cfg)
    if pipes is not None:
        return pipes.train_examples
    return len(load_arrays(cfg)[0])


# ---------------------------------------------------------------- sharding
def check_shard(shard_index, num_shards):
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise UsageError(f"shard {shard_index} of {num_shards} is out of range")


def shard_indices(num_examples, shard_index, num_shards, epoch, seed, shuffle=True):
    """Example indices worker ``shard_index`` sees in ``epoch`` (equal length for all shards)."""
    check_shard(shard_index, num_shards)
    if shuffle:
        order = np.random.RandomState((seed * 1000003 + epoch) % (2 ** 32)).permutation(num_examples)
    else:
        order = np.arange(num_examples)
    return order[shard_index::num_shards][: num_examples // num_shards]


def train_index_stream(cfg, num_examples, shard_index, num_shards, epochs):
    """Concatenated per-epoch indices, each epoch trimmed to whole batches."""
    spe = steps_per_epoch(num_examples, num_shards, cfg.batch_size)
    parts = [shard_indices(num_examples, shard_index, num_shards, e, cfg.seed, cfg.shuffle)
             [: spe * cfg.batch_size] for e in range(epochs)]
    return np.concatenate(parts).astype(np.int64)


PIPELINES = []   # the plug-in whose tf.data pipelines this process reads (its flag): what an empty one names


def input_failure(exc, who):
    """The InputError for a TensorFlow error raised by the input pipeline (its iterator, or a check
    in it naming a record), else None: any other failure keeps its own wording."""

    import tensorflow as tf
    if isinstance(exc, (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError,
                        tf.errors.CancelledError)):
        return None      # a lost peer or an aborted collective (a strategy's iterator runs them too)
    text = str(exc)
    damaged = re.search(r"(?:corrupted|truncated) record at (\d+)", text)
    if damaged:
        where = locate_damage(READING, int(damaged.group(1)))
        return InputError(f"{who}: reading the training data: {' or '.join(where) or 'a file'}: a damaged "
                          f"record (bad CRC, or cut short) at byte {damaged.group(1)}")
    gone = next((path for path in READING if path in text), None) if isinstance(exc, tf.errors.NotFoundError) else None
    if gone:                     # TensorFlow's line ends "; No such file or directory": the path is kept
        return InputError(f"{who}: reading the training data: {gone}: {describe(exc)} (the file went away "
                          f"during training)")
    if "assertion failed: [" in text:          # a check of ours: its own words name the file and record
        return InputError(f"{who}: reading the training data: {describe(exc)}")
    if READING and re.search(r"jpeg::Uncompress|Invalid JPEG|Invalid PNG|Unknown image file format|Not a JPEG",
                             text):             # TensorFlow's decoders name no file: looked for
        where = locate_undecodable(READING)
        return InputError(f"{who}: reading the training data: {where or 'a file of the data set'}: image/encoded "
                          f"does not decode ({describe(exc)})")
    if PIPELINES and re.search(r"expected to contain \d+ elements? but contained only", text):
        return InputError(f"{who}: reading the training data: {PIPELINES[-1]}: its train pipeline gave no batch "
                          f"(an empty training split)")
    raised = re.search(r"Error in user-defined function passed to \S+ transformation with iterator: \S+:\s+(.+)", text)
    if raised:                   # Python code inside the pipeline raised (a py_function, a plug-in's parser)
        worker = re.search(r"remote target /job:worker/replica:\d+/task:(\d+) while calling /tensorflow\.eager", text)
        python = re.search(r"(?:^|\s)((?:[\w.]*\.)?[A-Z]\w*[a-z]\w*: [^\n]*)\nTraceback \(most recent call last\)", text)
        cause = (python or raised).group(1).strip()     # a py_function's: "ValueError: ...", then its traceback
        return InputError(f"{who}: reading the training data: {PIPELINES[-1] if PIPELINES else 'the input pipeline'}"
                          f"{f' on worker {worker.group(1)}' if worker else ''}: it raised {cause}")
    if "Iterator" in text:
        return InputError(f"{who}: reading the training data: {describe(exc)}")
    return None


def read_batches(ds, who, waits=None, first_step=1):
    """Iterate a dataset as training reads it. Each batch's wait (the seconds ``next`` blocked: the
    input's share of the step, measured at the iterator) is appended to ``waits``. An error raised
    while reading (TensorFlow's reader on a damaged record, or a check in the pipeline naming the
    file and record) ends the run as one line from the worker that read it (exit 1); any other
    error there (a strategy's iterator taking part in an aborted collective) as a failed step,
    ``first_step`` being the step the first batch is for."""

    import tensorflow as tf
    it, step = iter(ds), first_step
    while True:
        started = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        except tf.errors.OpError as exc:
            raise input_failure(exc, who) or RunError(f"{who}: training step {step} failed: {describe(exc)}")
        if waits is not None:
            waits.append(time.perf_counter() - started)
        step += 1
        yield batch


def input_wait(waits):
    """The mean wait for a batch, the first left out (it waits for the pipeline to start and the
    shuffle buffer to fill, once per run); None with fewer than two batches."""
    return sum(waits[1:]) / (len(waits) - 1) if len(waits) > 1 else None


def make_dataset(cfg, shard_index, num_shards, split="train", start_step=0, num_steps=None):
    """A tf.data pipeline of ``(x, y)`` batches for one worker.

    train: this worker's shard for the whole run (all epochs), batched with
    ``cfg.batch_size``, starting at ``start_step`` (for resume), ``num_steps``
    batches long (default: the run plan's; async PS workers may have to run
    longer when a peer is lost); later epochs continue the same permutations.
    test: this worker's slice ``i::n`` of the held-out set, no shuffling, last
    batch kept, so the shards' sums add up to the full test set.
    """
    import tensorflow as tf
    check_shard(shard_index, num_shards)
    if streamed(cfg):
        return _record_dataset(cfg, shard_index, num_shards, split, start_step, num_steps)
    pipes = plugin_pipelines(cfg)
    if pipes is not None:
        return _pipeline_dataset(cfg, pipes, shard_index, num_shards, split, start_step, num_steps)
    x_train, y_train, x_test, y_test = load_arrays(cfg)
    if split == "test":
        x, y = x_test[shard_index::num_shards], y_test[shard_index::num_shards]
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(cfg.batch_size).prefetch(2)
    if split != "train":
        raise UsageError(f"unknown split '{split}' (valid: train, test)")
    if num_steps is None:
        num_steps = make_plan(cfg, len(x_train), num_shards, num_shards).worker_steps
    spe = steps_per_epoch(len(x_train), num_shards, cfg.batch_size)
    total, epochs = num_steps, -(-num_steps // spe)
    idx = train_index_stream(cfg, len(x_train), shard_index, num_shards, epochs)[: total * cfg.batch_size]
    xs, ys = tf.constant(x_train), tf.constant(y_train)
    # start_step may be a tensor (a PS worker learns its position only once the session runs);
    # skipping batches of indices costs nothing, the images are gathered after it.
    ds = tf.data.Dataset.from_tensor_slices(idx).batch(cfg.batch_size, drop_remainder=True).skip(start_step)
    # a gather has no control flow to convert: AutoGraph would only parse this file's source once more
    gather = tf.autograph.experimental.do_not_convert(lambda i: (tf.gather(xs, i), tf.gather(ys, i)))
    ds = ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


def check_input(cfg, workers):
    """What every run of ``workers`` would be refused for, checked once before any task starts: the
    data themselves (read and checked, or the shards' description and first records), a batch
    that the data set cannot fill, and file sharding's counts. Returns the steps per epoch."""
    spe = steps_per_epoch(num_examples(cfg), workers, cfg.batch_size)
    if streamed(cfg):
        check_sharding(record_spec(cfg), cfg.shard_by, workers, spe, cfg.batch_size)
    return spe


def _record_dataset(cfg, shard_index, num_shards, split, start_step, num_steps):
    """make_dataset for --dataset tfrecord: the same steps, epochs and resume position, streamed."""
    spec = record_spec(cfg)
    if split not in ("train", "test"):
        raise UsageError(f"unknown split '{split}' (valid: train, test)")
    if split == "test":
        return stream(cfg.data_dir, spec, "test", shard_index, num_shards, cfg.batch_size)
    total = sum(spec.train.records)
    if num_steps is None:
        num_steps = make_plan(cfg, total, num_shards, num_shards).worker_steps
    spe = steps_per_epoch(total, num_shards, cfg.batch_size)
    check_sharding(spec, cfg.shard_by, num_shards, spe, cfg.batch_size)
    return stream(cfg.data_dir, spec, "train", shard_index, num_shards, cfg.batch_size, seed=cfg.seed,
                  shuffle=cfg.shuffle, shard_by=cfg.shard_by, shuffle_buffer=cfg.shuffle_buffer,
                  steps_per_epoch=spe, start_step=start_step, num_steps=num_steps)


def _pipeline_dataset(cfg, pipes, shard_index, num_shards, split, start_step, num_steps):
    """make_dataset for a plug-in's tf.data factories: the plug-in reads, shards and batches; hvdps
    counts. Each epoch is exactly the plan's ``steps_per_epoch`` batches of the epoch's pipeline
    (repeated if it ends early), a resumed run skips the batches it had read, and every batch is
    checked for its shape, its batch size and its labels (one line naming the plug-in, exit 1)."""
    import tensorflow as tf
    if split not in ("train", "test"):
        raise UsageError(f"unknown split '{split}' (valid: train, test)")
    flag, shape, classes = f"--dataset {pipes.source}", list(pipes.input_shape), pipes.classes
    ids = bool(model_of(cfg) and model_of(cfg).ids)

    def build(factory, epoch):
        ctx = InputContext(worker_index=shard_index, num_workers=num_shards, batch_size=cfg.batch_size, seed=cfg.seed,
                           epoch=epoch)
        ds = call(factory, pipes.source, "--dataset", ctx)
        if not isinstance(ds, tf.data.Dataset):
            raise UsageError(f"{flag}: its {split} factory returned {type(ds).__name__}, expected a tf.data.Dataset")
        spec = ds.element_spec
        if not (isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(s, tf.TensorSpec) for s in spec)):
            raise UsageError(f"{flag}: its {split} pipeline gives {spec}; expected (x, y) batches")
        if not spec[0].shape.is_compatible_with([None, *shape]) or not spec[1].shape.is_compatible_with([None]):
            raise UsageError(f"{flag}: its {split} pipeline gives x {spec[0].shape} and y {spec[1].shape}; expected "
                             f"batches of x [batch, {', '.join(map(str, shape))}] and y [batch] (input_shape "
                             f"{tuple(shape)})")
        if not spec[1].dtype.is_integer:
            raise UsageError(f"{flag}: its {split} labels are {spec[1].dtype.name}; expected integer class ids")
        if not (spec[0].dtype.is_floating or spec[0].dtype.is_integer or spec[0].dtype.is_bool):
            raise UsageError(f"{flag}: its {split} features are {spec[0].dtype.name}; expected numbers (float or "
                             f"integer ids)")
        return ds.map(check, num_parallel_calls=tf.data.AUTOTUNE)

    def check(x, y):
        rules = [tf.debugging.assert_greater_equal(tf.cast(y, tf.int64), tf.constant(0, tf.int64),
                                                   message=f"{flag}: a label below 0"),
                 tf.debugging.assert_less(tf.cast(y, tf.int64), tf.constant(classes, tf.int64),
                                          message=f"{flag}: a label past its {classes} classes"),
                 tf.debugging.assert_equal(tf.shape(y)[0], tf.shape(x)[0],
                                           message=f"{flag}: a batch with more labels or examples than the other")]
        if x.dtype.is_floating:                  # as the array path refuses them: NaN trains silently
            rules.append(tf.debugging.Assert(tf.reduce_all(tf.math.is_finite(x)),
                                             [f"{flag}: a batch with NaN or infinite features"]))
        if split == "train":
            rules.append(tf.debugging.assert_equal(tf.shape(x)[0], cfg.batch_size,
                                                   message=f"{flag}: a training batch not of --batch_size "
                                                           f"{cfg.batch_size}"))
        with tf.control_dependencies(rules):
            return tf.identity(x if ids else tf.cast(x, tf.float32)), tf.cast(y, tf.int32)

    if split == "test":
        return build(pipes.test, tf.constant(0, tf.int64)).prefetch(2)
    if num_steps is None:
        num_steps = make_plan(cfg, pipes.train_examples, num_shards, num_shards).worker_steps
    spe = steps_per_epoch(pipes.train_examples, num_shards, cfg.batch_size)
    build(pipes.train, tf.constant(0, tf.int64))      # the factory's errors here, as one line, not in a trace
    epochs = -(-num_steps // spe)
    # each epoch exactly spe batches: repeated if it ends early; one that gives none (an empty split)
    # fails its cardinality, read as training reads it (input_failure names the plug-in)
    PIPELINES.append(flag)
    ds = tf.data.Dataset.range(epochs, output_type=tf.int64).flat_map(
        lambda e: build(pipes.train, e).repeat().take(spe).apply(tf.data.experimental.assert_cardinality(spe)))
    return ds.take(num_steps).skip(start_step).prefetch(tf.data.AUTOTUNE)
