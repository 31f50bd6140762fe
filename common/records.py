"""TFRecord shards as a data set: written once (``hvdps data``), then streamed by every worker.

Layout ``plain``: one ``tf.train.Example`` per example, ``x`` (its values as raw little-endian
``dtype`` bytes) and ``y`` (an int64 class id). ``dataset.json`` beside the shards holds the shape,
the dtype, the classes and each file's record count (common/schemas.py: ``RecordSet``), so the run
plan knows the data set's size without reading a record, and a resumed run can tell the same data.

Reading is tf.data end to end (``stream``): files interleaved, records shuffled in a bounded buffer
(``--shuffle_buffer`` records), sharded, batched, parsed and decoded in parallel, prefetched. A
worker's memory is its buffers, never the data set.

Sharding across workers (``--shard_by``):

- ``record`` (the default): every worker reads the same seeded order of all the records and keeps
  every n-th (``Dataset.shard``, as ``AutoShardPolicy.DATA``). The k-th batches of the n workers at
  batch b together are the k-th batch of one worker at n*b, so synchronous training at n workers
  equals one process at n*b, as with arrays in memory. Each worker reads every file.
- ``file``: worker i reads files i, i+n, ... (``AutoShardPolicy.FILE``): each reads 1/n of the bytes,
  in its own order. Refused with fewer files than workers, or when one worker's files hold fewer
  records than an epoch of the plan needs.

Before any task starts, every file listed is checked to be a regular file whose first record is
whole with valid CRCs (``check_files``): a file that is not TFRecord, truncated or damaged at its
start is refused in one line naming it. Damage further in is found by TensorFlow as it reads.
"""
import hashlib
import os
import struct

from common.errors import UsageError
from common.files import MiB, check_regular

SPEC = "dataset.json"
CYCLE = 8                    # files read at once per worker (interleave): enough to mix, few open buffers
MAX_RECORD = 256 * MiB       # a first record longer than this is a damaged length, not an example


class RecordError(UsageError):
    """A TFRecord data set that cannot be trained on as it is."""


# ------------------------------------------------------------------ the description and its files
def spec_of(data_dir):
    """``dataset.json`` of ``data_dir`` as its typed record, every file it lists checked."""
    from common.schemas import read_record_set
    path = os.path.join(data_dir, SPEC)
    if not os.path.lexists(path):
        raise RecordError(f"--data_dir {data_dir}: no {SPEC} (write TFRecord shards with `hvdps data`)")
    spec = read_record_set(path)
    check_files(data_dir, spec)
    return spec


def _masked_crc(data):
    import google_crc32c
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def check_first_record(path):
    """One line naming ``path`` unless its first record is whole: an 8-byte length, its masked
    CRC-32C, the data and the data's masked CRC-32C (TFRecord's framing)."""
    check_regular(path, "a TFRecord file", 1 << 50)
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) == 0:
            raise RecordError(f"{path}: empty, not a TFRecord file")
        if len(head) < 12:
            raise RecordError(f"{path}: truncated in its first record's header ({len(head)} bytes)")
        (length,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
        if _masked_crc(head[:8]) != crc:
            raise RecordError(f"{path}: record 0: bad length CRC: not a TFRecord file, or damaged")
        if length > MAX_RECORD:
            raise RecordError(f"{path}: record 0: a length of {length} bytes: damaged")
        data, tail = f.read(length), f.read(4)
        if len(data) < length or len(tail) < 4:
            raise RecordError(f"{path}: record 0: truncated ({len(data)} of {length} bytes)")
        if _masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise RecordError(f"{path}: record 0: bad data CRC: damaged")


def check_files(data_dir, spec):
    for part in (spec.train, spec.test):
        for name in part.files:
            check_first_record(os.path.join(data_dir, name))


def fingerprint(data_dir, spec):
    """What --resume compares: the description and each file's size (not TBs of records)."""
    h = hashlib.sha256(spec.model_dump_json().encode())
    for name in spec.train.files + spec.test.files:
        h.update(f"{name}:{os.path.getsize(os.path.join(data_dir, name))}".encode())
    return h.hexdigest()


def check_sharding(spec, shard_by, num_shards, steps_per_epoch, batch_size):
    """File sharding's refusals, before any record is read: fewer files than workers, or a
    worker whose files cannot fill an epoch of the plan (every worker runs the same steps)."""
    if shard_by != "file":
        return
    files = len(spec.train.files)
    if files < num_shards:
        raise RecordError(f"--shard_by file: {files} training file(s) for {num_shards} workers; write at least "
                          f"{num_shards} shards (hvdps data --shards) or use --shard_by record")
    need = steps_per_epoch * batch_size
    for i in range(num_shards):
        have = sum(spec.train.records[i::num_shards])
        if have < need:
            raise RecordError(f"--shard_by file: worker {i}'s files hold {have} records, fewer than the "
                              f"{need} an epoch of {steps_per_epoch} steps of {batch_size} needs; write shards of "
                              f"even size (hvdps data --shards) or use --shard_by record")


# ------------------------------------------------------------------ writing
def shard_name(split, i, n):
    return f"{split}-{i:05d}-of-{n:05d}.tfrecord"


def write(out_dir, arrays, classes, shards, test_shards=1):
    """``arrays`` (x_train, y_train, x_test, y_test, as checked by common.data.check_arrays) as
    TFRecord shards of the plain layout in ``out_dir``, with dataset.json; returns the spec path.
    Each split is cut into ``shards`` (``test_shards``) files of sizes differing by one at most."""
    import numpy as np
    import tensorflow as tf
    from common.files import make_dirs, write_atomic
    x_train = np.asarray(arrays[0])
    dtype = "int32" if x_train.dtype.kind in "iu" else "float32"
    make_dirs(out_dir)
    parts = {}
    for split, x, y, n in (("train", arrays[0], arrays[1], shards), ("test", arrays[2], arrays[3], test_shards)):
        x, y = np.asarray(x).astype(dtype, copy=False), np.asarray(y)
        if n > len(x):
            raise RecordError(f"--shards {n}: the {split} split has only {len(x)} examples")
        files, counts = [], []
        for i, idx in enumerate(np.array_split(np.arange(len(x)), n)):
            name = shard_name(split, i, n)
            tmp = os.path.join(out_dir, f".{name}.tmp")
            with tf.io.TFRecordWriter(tmp) as w:
                for j in idx:
                    example = tf.train.Example(features=tf.train.Features(feature={
                        "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[j].astype(f"<{x.dtype.str[1:]}").tobytes()])),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[j])]))}))
                    w.write(example.SerializeToString())
            os.replace(tmp, os.path.join(out_dir, name))
            files.append(name)
            counts.append(len(idx))
        parts[split] = {"files": files, "records": counts}
    from common.schemas import RecordSet
    spec = RecordSet(layout="plain", shape=list(x_train.shape[1:]), dtype=dtype, classes=int(classes), **parts)
    path = os.path.join(out_dir, SPEC)
    write_atomic(path, spec.model_dump_json(indent=2) + "\n")
    return path


# ------------------------------------------------------------------ reading
def _parser(spec):
    import tensorflow as tf
    features = {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([], tf.int64)}
    dtype = {"float32": tf.float32, "int32": tf.int32}[spec.dtype]
    shape, classes = list(spec.shape), spec.classes

    def parse(serialized):
        p = tf.io.parse_example(serialized, features)
        x = tf.reshape(tf.io.decode_raw(p["x"], dtype), [-1, *shape])
        y = p["y"]
        with tf.control_dependencies([
                tf.debugging.assert_non_negative(y, message="a label below 0"),
                tf.debugging.assert_less(y, tf.constant(classes, tf.int64),
                                         message=f"a label past the {classes} classes of the data set")]):
            return tf.identity(x), tf.cast(y, tf.int32)
    return tf.autograph.experimental.do_not_convert(parse)


def stream(data_dir, spec, split, shard_index, num_shards, batch_size, seed=0, shuffle=True, shard_by="record",
           shuffle_buffer=10000, steps_per_epoch=None, start_step=0, num_steps=None):
    """A worker's ``(x, y)`` batches read from the shards.

    train: ``num_steps`` batches from ``start_step`` (a tensor under classic PS), epoch after epoch
    of ``steps_per_epoch`` batches, each epoch in its own seeded order. test: this worker's records
    ``i::n`` of every test file in order, the last batch kept, so the workers' sums add up to the
    whole test set."""
    import tensorflow as tf
    part = spec.train if split == "train" else spec.test
    files = [os.path.join(data_dir, name) for name in part.files]
    parse = _parser(spec)
    if split != "train":
        ds = tf.data.TFRecordDataset(files).shard(num_shards, shard_index)
        return ds.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
    by_file = shard_by == "file"
    if by_file:
        files = files[shard_index::num_shards]
    epochs = -(-num_steps // steps_per_epoch)

    def epoch(e):
        order = seed * 1000003 + e
        ds = tf.data.Dataset.from_tensor_slices(files)
        if shuffle:
            ds = ds.shuffle(len(files), seed=order, reshuffle_each_iteration=False)
        ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), CYCLE), block_length=1,
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=order, reshuffle_each_iteration=False)
        if not by_file:
            ds = ds.shard(num_shards, shard_index)
        return ds.take(steps_per_epoch * batch_size)

    ds = tf.data.Dataset.range(epochs, output_type=tf.int64).flat_map(epoch)
    ds = ds.batch(batch_size, drop_remainder=True).skip(start_step).take(num_steps)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
