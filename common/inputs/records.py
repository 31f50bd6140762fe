"""TFRecord shards as a data set: written once (``hvdps data``), then streamed by every worker.

Layout ``plain``: one ``tf.train.Example`` per example, ``x`` (its values as raw little-endian
``dtype`` bytes) and ``y`` (an int64 class id). Layout ``text``: a language model's sequences, one
``tokens`` feature of L + 1 bytes each, read as the L bytes the model sees and the L bytes after each
(the labels), the layout of a tokenized corpus. ``dataset.json`` beside the shards holds the shape,
the dtype, the classes and each file's record count (common/formats/schemas.py: ``RecordSet``), so the run
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
import glob
import hashlib
import io
import os
import shutil
import struct
import time

import numpy as np

from common.base.errors import UsageError, describe, shown
from common.base.files import MiB, check_regular, write_atomic, make_dirs
from common.formats.schemas import read_record_set, RecordSet
from common.spec.datasets import MAX_DECODED_VALUES

SPEC = "dataset.json"
SHARDING = {   # what each --shard_by rule guarantees, as the report says it
    "record": "every worker reads every file and keeps every n-th record of one seeded order, so synchronous "
              "training at n workers with batch b is the computation of one process at batch n*b",
    "file": "worker i reads files i, i+n, ... in its own seeded order, each 1/n of the bytes; no equality with "
            "one process",
}
CYCLE = 8                    # files read at once per worker (interleave): enough to mix, few open buffers
MAX_RECORD = 256 * MiB       # a first record longer than this is a damaged length, not an example


class RecordError(UsageError):
    """A TFRecord data set that cannot be trained on as it is."""


# ------------------------------------------------------------------ the description and its files
def spec_of(data_dir):
    """``dataset.json`` of ``data_dir`` as its typed record, every file it lists checked."""
    path = os.path.join(data_dir, SPEC)
    if not os.path.lexists(path):
        if glob.glob(os.path.join(data_dir, "train-*")) and glob.glob(os.path.join(data_dir, "validation-*")):
            raise RecordError(f"--data_dir {data_dir}: no {SPEC}; its train-* and validation-* files look like "
                              f"ImageNet TFRecords: describe them once with `hvdps data --describe {data_dir}` "
                              f"(their records counted, their images' size and labels read from the records), "
                              f"then train from them")
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
    CRC-32C, the data and the data's masked CRC-32C (TFRecord's framing). Returns the data."""
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
    return data


_EXAMPLE = []


def _example_type():
    """``tf.train.Example``'s message type, built from feature.proto's definition with protobuf's
    own runtime: the first record of every file is parsed before any task starts, in a process
    (hvdps compare, the launchers) that never imports TensorFlow."""
    if not _EXAMPLE:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        F = descriptor_pb2.FieldDescriptorProto
        f = descriptor_pb2.FileDescriptorProto(name="hvdps_example.proto", package="hvdps", syntax="proto3")

        def message(name, fields, into=f.message_type):
            m = into.add(name=name)
            for field_name, number, kind, label, type_name, oneof in fields:
                field = m.field.add(name=field_name, number=number, type=kind, label=label)
                if type_name:
                    field.type_name = f".hvdps.{type_name}"
                if oneof is not None:
                    field.oneof_index = oneof
            return m
        rep, one = F.LABEL_REPEATED, F.LABEL_OPTIONAL
        for name, kind in (("BytesList", F.TYPE_BYTES), ("FloatList", F.TYPE_FLOAT), ("Int64List", F.TYPE_INT64)):
            message(name, [("value", 1, kind, rep, None, None)])
        message("Feature", [(k, n, F.TYPE_MESSAGE, one, t, 0) for k, n, t in
                            (("bytes_list", 1, "BytesList"), ("float_list", 2, "FloatList"),
                             ("int64_list", 3, "Int64List"))]).oneof_decl.add(name="kind")
        features = message("Features", [("feature", 1, F.TYPE_MESSAGE, rep, "Features.FeatureEntry", None)])
        entry = message("FeatureEntry", [("key", 1, F.TYPE_STRING, one, None, None),
                                         ("value", 2, F.TYPE_MESSAGE, one, "Feature", None)], features.nested_type)
        entry.options.map_entry = True
        message("Example", [("features", 1, F.TYPE_MESSAGE, one, "Features", None)])
        pool = descriptor_pool.DescriptorPool()
        pool.Add(f)
        _EXAMPLE.append(message_factory.GetMessageClass(pool.FindMessageTypeByName("hvdps.Example")))
    return _EXAMPLE[0]


FEATURES = {"plain": ("x", "y"), "imagenet": ("image/encoded", "image/class/label"), "text": ("tokens", None)}
ITEMSIZE = {"float32": 4, "int32": 4, "uint8": 1}


def _a(noun):
    return f"{'an' if noun[0] in 'aeio' else 'a'} {noun}"


def _one_value(example, name, kind, where):
    feature = example.features.feature
    if name not in feature:
        raise RecordError(f"{where}: no '{name}' feature (present: {', '.join(map(shown, sorted(feature))) or 'none'})")
    got = feature[name].WhichOneof("kind")
    if got != kind:
        raise RecordError(f"{where}: feature '{name}' is {_a(got or 'empty feature')}, expected {_a(kind)}")
    values = getattr(feature[name], kind).value
    if len(values) != 1:
        raise RecordError(f"{where}: feature '{name}' holds {len(values)} values, expected 1")
    return values[0]


def check_example(data, spec, where):
    """One line naming ``where`` unless ``data`` is an example of ``spec``'s layout: its features
    there with their types, the values' size or an image that decodes to the shape, the label
    within the classes."""
    try:
        example = _example_type().FromString(data)
    except Exception as exc:          # protobuf's DecodeError, or a recursion limit on nested garbage
        raise RecordError(f"{where}: not a tf.train.Example ({type(exc).__name__})")
    x_name, y_name = FEATURES[spec.layout]
    x = _one_value(example, x_name, "bytes_list", where)
    if spec.layout == "text":              # every byte is a class of 256: only the length can be wrong
        if len(x) != spec.shape[0] + 1:
            raise RecordError(f"{where}: feature 'tokens' holds {len(x)} bytes; the data set's sequences are "
                              f"{spec.shape[0]} bytes and the one after ({spec.shape[0] + 1})")
        return
    label = _one_value(example, y_name, "int64_list", where)
    last = spec.first_label + spec.classes - 1
    if not spec.first_label <= label <= last:
        raise RecordError(f"{where}: label {label} outside {spec.first_label}..{last} ({spec.classes} classes"
                          f"{', 1-based' if spec.first_label else ''})")
    if spec.layout == "plain":
        want = ITEMSIZE[spec.dtype]
        for n in spec.shape:
            want *= n
        if len(x) != want:
            raise RecordError(f"{where}: feature 'x' holds {len(x)} bytes; shape {list(spec.shape)} of "
                              f"{spec.dtype} is {want}")
        return

    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(io.BytesIO(x)) as image:          # the header only: the size before any decoding
            kind, (width, height) = image.format, image.size
            if width * height * spec.shape[2] > MAX_DECODED_VALUES:
                raise Image.DecompressionBombError(f"{height}x{width}")
            image.load()
    except Image.DecompressionBombError:                   # Pillow's own bound, or ours
        raise RecordError(f"{where}: image/encoded declares {_declared(x)} pixels, more than hvdps decodes "
                          f"({MAX_DECODED_VALUES:,} values an image): a damaged or crafted image")
    except UnidentifiedImageError:
        raise RecordError(f"{where}: image/encoded does not decode as a JPEG or PNG image")
    except (OSError, ValueError, SyntaxError) as exc:     # a known format, cut short or damaged
        raise RecordError(f"{where}: image/encoded does not decode as a JPEG or PNG image ({describe(exc)})")
    if kind not in ("JPEG", "PNG"):
        raise RecordError(f"{where}: image/encoded is {kind}; the imagenet layout holds JPEG or PNG")
    if not spec.resize and [height, width] != list(spec.shape[:2]):
        raise RecordError(f"{where}: a {height}x{width} image; the data set's images are "
                          f"{spec.shape[0]}x{spec.shape[1]} (set \"resize\": true in {SPEC} to resize them)")


def _declared(data):
    """'HxW' as a PNG's IHDR or a JPEG's frame header declares it (read without decoding)."""
    if data[:8] == PNG_MAGIC and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return f"{height}x{width}"
    at = 2
    while at + 9 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], struct.unpack(">H", data[at + 2:at + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):     # a start of frame
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return f"{height}x{width}"
        at += 2 + length
    return "too many"


def locate_damage(paths, offset):
    """"corrupted record at <offset>" is all TensorFlow's reader says: the files among ``paths`` in
    which the record at ``offset`` fails its CRCs, as "<file>: record <i>" (only the 12-byte record
    headers before it are read)."""
    found = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                at, index = 0, 0
                while at + 12 < offset:         # TensorFlow names a record's start, or its data's (12 bytes on)
                    f.seek(at)
                    head = f.read(12)
                    if len(head) < 12:
                        break
                    at += 16 + struct.unpack("<Q", head[:8])[0]
                    index += 1
                if offset not in (at, at + 12):
                    continue
                f.seek(at)
                head = f.read(12)
                length = struct.unpack("<Q", head[:8])[0] if len(head) == 12 else 0
                whole = len(head) == 12 and _masked_crc(head[:8]) == struct.unpack("<I", head[8:])[0]
                if whole and length <= MAX_RECORD:
                    data, tail = f.read(length), f.read(4)
                    whole = len(tail) == 4 and _masked_crc(data) == struct.unpack("<I", tail)[0]
                if not whole:
                    found.append(f"{path}: record {index}")
        except OSError:
            continue
    return found


READING = []     # the files this process's pipelines read: where a "corrupted record" is looked for

LOCATE_S = 60.0  # how long a failed decode is looked for, record by record, before the line says less


def locate_undecodable(paths, seconds=LOCATE_S):
    """"jpeg::Uncompress failed" names no file: the first record among ``paths`` whose image/encoded
    does not decode with Pillow (or declares too many pixels), as "<file>: record <i>", looked for
    for at most ``seconds`` (a damaged image is found only once TensorFlow failed on it); None if not
    found in time."""
    from PIL import Image
    deadline = time.monotonic() + seconds
    for path in reversed(paths):                 # the files opened last first
        try:
            with open(path, "rb") as f:
                index = 0
                while time.monotonic() < deadline:
                    head = f.read(12)
                    if len(head) < 12:
                        break
                    length = struct.unpack("<Q", head[:8])[0]
                    if length > MAX_RECORD:
                        break
                    data, _ = f.read(length), f.read(4)
                    try:
                        features = _example_type().FromString(data).features.feature
                    except Exception:
                        return f"{path}: record {index}"
                    if "image/encoded" not in features:  # not the imagenet layout: no image to decode
                        break
                    try:
                        values = features["image/encoded"].bytes_list.value
                        with Image.open(io.BytesIO(values[0])) as image:
                            if image.size[0] * image.size[1] * len(image.getbands()) > MAX_DECODED_VALUES:
                                raise Image.DecompressionBombError("too many pixels")
                            image.load()
                    except Exception:            # whatever fails it: protobuf, Pillow, a missing feature
                        return f"{path}: record {index}"
                    index += 1
        except OSError:
            continue
    return None


def check_files(data_dir, spec):
    for part in (spec.train, spec.test):
        for name in part.files:
            path = os.path.join(data_dir, name)
            check_example(check_first_record(path), spec, f"{path}: record 0")


def shard_digest(path, verify=False):
    """A shard's content digest from the CRCs its TFRecord framing already carries: SHA-256 over each
    record's length and its data's CRC-32C, 16 bytes read per record (not the records themselves).
    Any record rewritten (a label changed, the file's size kept) changes it. ``verify``: every record's data is also read and checked against its CRC, so
    bytes changed in place, which leave the framing's CRCs as they were, are found too: --resume's
    check, before the run writes anything. Damage is a RecordError naming the file and the record."""
    h = hashlib.sha256()
    for n, head, data, tail in framing(path, "data" if verify else "tail"):
        if verify and (len(tail) < 4 or _masked_crc(data) != struct.unpack("<I", tail)[0]):
            raise RecordError(f"{path}: record {n}: its bytes no longer match their CRC (the file was changed "
                              f"or damaged)")
        h.update(head[:8] + tail)
    return h.hexdigest()


def shard_digests(data_dir, spec, verify=False):
    """{file: its digest} for every file ``spec`` lists, in its order."""
    return {name: shard_digest(os.path.join(data_dir, name), verify)
            for name in spec.train.files + spec.test.files}


def fingerprint(spec, digests):
    """What --resume compares first: the description and each file's content digest."""
    h = hashlib.sha256(spec.model_dump_json().encode())
    for name, digest in digests.items():
        h.update(f"{name}:{digest}".encode())
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
def shard_name(split, i, n, layout="plain"):
    if layout == "imagenet":       # tf_cnn_benchmarks' names: train-00000-of-01024, validation-00000-of-00128
        return f"{'train' if split == 'train' else 'validation'}-{i:05d}-of-{n:05d}"
    return f"{split}-{i:05d}-of-{n:05d}.tfrecord"


# What one record takes on disk beyond its feature bytes (TFRecord framing, the Example's fields), and an
# encoded image's bytes per pixel value plus its header: noise, the synthetic sets' content, measured on
# 224x224x3 images with Pillow (JPEG quality 90: 0.30; PNG: 1.00).
RECORD_OVERHEAD = 64
ENCODED = {"jpeg": (0.30, 700), "png": (1.00, 100)}


def estimated_bytes(records, values, layout="plain", image_format="png", itemsize=4):
    """About what ``records`` examples of ``values`` numbers each take as TFRecord shards: what the
    free space is checked against before the first byte is written."""
    if layout == "imagenet":
        per_value, header = ENCODED[image_format]
        return int(records * (values * per_value + header + RECORD_OVERHEAD))
    return int(records * (values * itemsize + RECORD_OVERHEAD))


def check_free_space(folder, need, where):
    """Refuse, before the first byte, a set larger than the free space of ``folder``'s file system
    (``where``: what the line names, the flag and the folder the user gave)."""
    free = shutil.disk_usage(folder).free
    if need > free:
        raise UsageError(f"{where}: the data set takes about {need / 2 ** 30:,.1f} GiB, and its file "
                         f"system has {free / 2 ** 30:,.1f} GiB free; write fewer examples or choose another disk")


def encode_image(image, image_format):
    """An HxWxC uint8 array as JPEG (quality 90, as ImageNet's files) or PNG bytes."""

    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(
        out, format=image_format.upper(), **({"quality": 90} if image_format == "jpeg" else {}))
    return out.getvalue()


def as_sequences(x, y, split):
    """A text split's (x, y) (n, L) byte arrays, y each x one byte on, as (n, L + 1) sequences and their
    next bytes, with None for the labels the layout no longer stores; anything else is refused."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or y.shape != x.shape or x.dtype != np.uint8 or y.dtype != np.uint8:
        raise RecordError(f"x_{split}: the text layout holds byte sequences with a label per position (two uint8 "
                          f"arrays of one shape [n, L]), not x {list(x.shape)} of {x.dtype} and y {list(y.shape)}")
    if not np.array_equal(x[:, 1:], y[:, :-1]):
        raise RecordError(f"y_{split}: not each sequence's next bytes: the text layout stores a sequence and the "
                          f"byte after it")
    return np.concatenate([x, y[:, -1:]], axis=1), None


def as_images(x, source):
    """Arrays as 8-bit images for the imagenet layout: [0, 1] floats scaled to 0..255, integers kept."""
    if x.ndim != 4 or x.shape[3] not in (1, 3):
        raise RecordError(f"{source}: examples of shape {list(x.shape[1:])} are not images (H, W, C with C 1 or 3); "
                          f"use --layout plain")
    if x.dtype.kind == "f":
        if x.min() < 0 or x.max() > 1:
            raise RecordError(f"{source}: values {x.min():g}..{x.max():g}; the imagenet layout stores 8-bit images "
                              f"from values in [0, 1] or integers 0..255; use --layout plain")
        return np.rint(x * 255).astype(np.uint8)
    if x.min() < 0 or x.max() > 255:
        raise RecordError(f"{source}: values {x.min()}..{x.max()} do not fit 8-bit images; use --layout plain")
    return x.astype(np.uint8)


def _example(layout, x, label, image_format):
    import tensorflow as tf
    x_name, y_name = FEATURES[layout]
    if layout == "text":                   # x: the sequence and the byte after it
        return tf.train.Example(features=tf.train.Features(feature={
            x_name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.astype(np.uint8).tobytes()]))}
        )).SerializeToString()
    value = encode_image(x, image_format) if layout == "imagenet" else x.astype(f"<{x.dtype.str[1:]}").tobytes()
    return tf.train.Example(features=tf.train.Features(feature={
        x_name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value])),
        y_name: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))})).SerializeToString()


def _write_split(out_dir, split, n, count, examples, layout):
    """``count`` serialized examples from the iterator ``examples`` into ``n`` files whose sizes
    differ by one at most, each written under a temporary name and renamed when whole."""
    import tensorflow as tf
    files, counts = [], []
    for i in range(n):
        size = count // n + (i < count % n)
        name = shard_name(split, i, n, layout)
        tmp = os.path.join(out_dir, f".{name}.tmp")
        try:
            with tf.io.TFRecordWriter(tmp) as w:
                for _ in range(size):
                    w.write(next(examples))
            os.replace(tmp, os.path.join(out_dir, name))
        except (OSError, tf.errors.OpError) as exc:           # a full disk: the files written so far stay whole
            if os.path.exists(tmp):
                os.remove(tmp)
            raise RecordError(f"cannot write {os.path.join(out_dir, name)}: {describe(exc)}")
        files.append(name)
        counts.append(size)
    return {"files": files, "records": counts}


def framing(path, read="none"):
    """Each record of a TFRecord file as its framing gives it: (index, its 12-byte header, its data,
    its data's 4-byte CRC), the header's own CRC checked. ``read``: "none" reads the headers alone
    (data and CRC None), "tail" each data CRC too, "data" the data as well. The file must end where
    its last record does: a damaged header or a cut record is a RecordError naming the record. A FIFO
    or a device is refused before it is opened (opening a FIFO blocks until something writes it)."""
    check_regular(path, "a TFRecord file", 1 << 50)
    size, at, n = os.path.getsize(path), 0, 0
    with open(path, "rb") as f:
        while at < size:
            f.seek(at)
            head = f.read(12)
            if len(head) < 12 or _masked_crc(head[:8]) != struct.unpack("<I", head[8:])[0]:
                raise RecordError(f"{path}: record {n}: a damaged or cut header at byte {at}")
            length = struct.unpack("<Q", head[:8])[0]
            data = tail = None
            if read == "data":
                data, tail = f.read(length), f.read(4)
            elif read == "tail":
                f.seek(at + 12 + length)
                tail = f.read(4)
            yield n, head, data, tail
            at += 16 + length
            n += 1
    if at != size:
        raise RecordError(f"{path}: record {n - 1}: cut short (the file ends at byte {size}, the record at {at})")


def count_records(path):
    """Records in a TFRecord file, from its framing alone (each 12-byte header read, the data skipped)."""
    return sum(1 for _ in framing(path))


SAMPLED = 16                 # records read of each file by --describe: its images' sizes and its labels
IMAGENET_SHAPE = (224, 224, 3)
MODES = {"1": 1, "L": 1, "P": 3, "RGB": 3, "CMYK": 3, "YCbCr": 3, "LA": 1, "RGBA": 3}   # decoded as TensorFlow does


def sample_images(path, count=SAMPLED):
    """[(height, width, channels, label)] of the first ``count`` records of an ImageNet-layout file, as
    the records themselves hold them (each image's header, read without decoding; its label)."""
    from PIL import Image
    out = []
    for n, _, data, _ in framing(path, "data"):
        if n >= count:
            break
        where = f"{path}: record {n}"
        try:
            example = _example_type().FromString(data)
        except Exception as exc:      # protobuf's DecodeError, or a recursion limit on nested garbage
            raise RecordError(f"{where}: not a tf.train.Example ({type(exc).__name__})")
        encoded = _one_value(example, FEATURES["imagenet"][0], "bytes_list", where)
        label = _one_value(example, FEATURES["imagenet"][1], "int64_list", where)
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                width, height = image.size
                channels = MODES.get(image.mode, 3)
        except Exception:              # what check_example names at the first record, in its words
            raise RecordError(f"{where}: image/encoded does not decode as a JPEG or PNG image")
        out.append((height, width, channels, label))
    return out


def describe_imagenet(data_dir, shape=None, classes=None):
    """dataset.json for a folder of ImageNet TFRecords as tf_cnn_benchmarks reads them (``train-*``
    and ``validation-*``, written by the Inception or TPU conversion scripts): records counted from
    the files' framing; the images' sizes and channels and the labels read from the first
    ``SAMPLED`` records of every file. Images of one size are trained at it; of several (real
    ImageNet) resized to ``shape`` (224x224x3 unless given). Labels are 1-based unless a 0 is seen, the
    classes ``classes`` or the largest label seen. A flag the files contradict (a size they all differ
    from, fewer classes than a label, other channels) is refused naming what they hold. Returns
    (the path, the RecordSet)."""
    if os.path.lexists(os.path.join(data_dir, SPEC)):
        raise RecordError(f"--describe {data_dir} already holds {SPEC}")
    parts, seen = {}, []
    for split, pattern in (("train", "train-*"), ("test", "validation-*")):
        names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(data_dir, pattern))
                       if not p.endswith(".tmp"))
        if not names:
            raise RecordError(f"--describe {data_dir}: no files match {pattern} (tf_cnn_benchmarks' ImageNet names: "
                              f"train-00000-of-01024, validation-00000-of-00128)")
        parts[split] = {"files": names, "records": [count_records(os.path.join(data_dir, n)) for n in names]}
        for n in names:
            check_first_record(os.path.join(data_dir, n))     # an empty or damaged file named as training would
            seen += sample_images(os.path.join(data_dir, n))
    files = len(parts["train"]["files"]) + len(parts["test"]["files"])
    sizes = sorted({(h, w) for h, w, _, _ in seen})
    channels = sorted({c for _, _, c, _ in seen})
    low, high = min(label for *_, label in seen), max(label for *_, label in seen)
    first = 0 if low == 0 else 1
    held = (f"its images are {'x'.join(map(str, sizes[0]))}x{'/'.join(map(str, channels))}" if len(sizes) == 1 else
            f"its images come in {len(sizes)} sizes, {'x'.join(map(str, sizes[0]))} to "
            f"{'x'.join(map(str, sizes[-1]))}") + f", labels {low}..{high} (the first {SAMPLED} records of each of its " \
        f"{files} files)"
    if shape is not None:
        if len(sizes) == 1 and tuple(shape[:2]) != sizes[0]:
            raise RecordError(f"--describe {data_dir}: {held}; --image_shape {','.join(map(str, shape))} would resize "
                              f"every one: leave it out to train them as they are")
        if len(channels) == 1 and shape[2] != channels[0]:
            raise RecordError(f"--describe {data_dir}: {held}; --image_shape {','.join(map(str, shape))} asks for "
                              f"{shape[2]} channel(s)")
    if classes is not None and high - first >= classes:
        raise RecordError(f"--describe {data_dir}: {held}; --num_classes {classes} is fewer than label {high} needs"
                          f"{' (1-based)' if first else ''}")
    resize = len(sizes) > 1
    if shape is None:
        shape = IMAGENET_SHAPE if resize else (*sizes[0], channels[-1])
    path = _describe(data_dir, layout="imagenet", shape=list(shape), dtype="uint8",
                     classes=int(classes if classes is not None else high - first + 1), first_label=first,
                     resize=resize, **parts)
    try:
        spec = spec_of(data_dir)
        check_files(data_dir, spec)
    except RecordError:
        os.remove(path)                   # a description of files that cannot be trained on is not kept
        raise
    return path, spec


def _describe(out_dir, **fields):
    spec = RecordSet(**fields)
    path = os.path.join(out_dir, SPEC)
    write_atomic(path, spec.model_dump_json(indent=2) + "\n")
    return path


def write(out_dir, arrays, classes, shards, test_shards=1, layout="plain", image_format="png"):
    """``arrays`` (x_train, y_train, x_test, y_test, as checked by common.inputs.data.check_arrays) as
    TFRecord shards of ``layout`` in ``out_dir``, with dataset.json; returns the spec path. The
    imagenet layout stores each example as an image (lossless PNG unless told) with a 1-based label;
    the text layout each sequence with the byte after it (its labels are those bytes)."""
    x_train = np.asarray(arrays[0])
    first = 1 if layout == "imagenet" else 0
    if layout == "text":
        arrays = (*as_sequences(arrays[0], arrays[1], "train"), *as_sequences(arrays[2], arrays[3], "test"))
        dtype = "uint8"
    elif layout == "imagenet":
        dtype = "uint8"
        arrays = (as_images(x_train, "x_train"), arrays[1], as_images(np.asarray(arrays[2]), "x_test"), arrays[3])
    else:
        dtype = "int32" if x_train.dtype.kind in "iu" else "float32"
    for split, x, n in (("train", arrays[0], shards), ("test", arrays[2], test_shards)):
        if n > len(x):
            raise RecordError(f"--{'test_' if split == 'test' else ''}shards {n}: the {split} split has only "
                              f"{len(x)} examples")
    make_dirs(out_dir)
    parts = {}
    for split, x, y, n in (("train", arrays[0], arrays[1], shards), ("test", arrays[2], arrays[3], test_shards)):
        if layout == "text":                       # x: each sequence and the byte after it, y unused
            parts[split] = _write_split(out_dir, split, n, len(x), (_example(layout, s, 0, None) for s in x), layout)
            continue
        x, y = np.asarray(x).astype(dtype, copy=False), np.asarray(y)
        examples = (_example(layout, x[j], int(y[j]) + first, image_format) for j in range(len(x)))
        parts[split] = _write_split(out_dir, split, n, len(x), examples, layout)
    return _describe(out_dir, layout=layout, shape=list(x_train.shape[1:]), dtype=dtype, classes=int(classes),
                     first_label=first, **parts)


def write_synthetic_imagenet(out_dir, shape, classes, train, test, shards, test_shards, seed, image_format="jpeg",
                             resize=None):
    """A synthetic set in the imagenet layout, of any size: random images of ``shape`` and random
    1-based labels, generated and written one record at a time (never held whole), for throughput
    runs on the published models. ``resize`` (H, W): training resizes the images to it, as with
    real ImageNet, whose images differ in size. Noise compresses little: a JPEG image takes about
    a third of H*W*C bytes, a PNG all of them."""
    for split, count, n in (("train", train, shards), ("test", test, test_shards)):
        if n > count:
            raise RecordError(f"--{'test_' if split == 'test' else ''}shards {n}: the {split} split has only "
                              f"{count} examples")
    make_dirs(out_dir)
    rng = np.random.default_rng(seed)

    def examples(count):
        for _ in range(count):
            image = rng.integers(0, 256, size=tuple(shape), dtype=np.uint8)
            yield _example("imagenet", image, int(rng.integers(1, classes + 1)), image_format)
    parts = {split: _write_split(out_dir, split, n, count, examples(count), "imagenet")
             for split, count, n in (("train", train, shards), ("test", test, test_shards))}
    trained = [*resize, shape[2]] if resize else list(shape)
    return _describe(out_dir, layout="imagenet", shape=trained, dtype="uint8", classes=int(classes),
                     first_label=1, resize=bool(resize), **parts)


# ------------------------------------------------------------------ reading
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _located(path):
    """One file's records, each with the file and its index in it: what a failed check names."""
    import tensorflow as tf
    # zip, not map: no function call per record
    return tf.data.Dataset.zip((tf.data.TFRecordDataset(path), tf.data.Dataset.from_tensors(path).repeat(),
                                tf.data.Dataset.range(1 << 62)))


def _check(tf, ok, files, index, what):
    """An assertion that names the first failing record's file and index (``ok``: one bool per record)."""
    first = tf.argmax(tf.cast(tf.logical_not(ok), tf.int32), output_type=tf.int32)
    return tf.debugging.Assert(tf.reduce_all(ok), [tf.strings.join(
        [tf.gather(files, first), ": record ", tf.strings.as_string(tf.gather(index, first)), ": ", what])])


def _png_size(tf, data):
    """[height, width] from a PNG's IHDR (bytes 16-23, big-endian), as int64; zeros if it is shorter."""
    head = tf.strings.substr(tf.strings.join([data, tf.constant(bytes(24))]), 16, 8)
    b = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)
    word = lambda i: ((b[i] * 256 + b[i + 1]) * 256 + b[i + 2]) * 256 + b[i + 3]
    return tf.stack([word(4), word(0)])


def _parser(spec):
    """(parse, per_record): the layout's parse function, and whether it takes one record (images,
    decoded one by one) or a batch (plain: one vectorized parse)."""
    import tensorflow as tf
    x_name, y_name = FEATURES[spec.layout]
    features = {x_name: tf.io.FixedLenFeature([], tf.string)}
    if y_name:
        features[y_name] = tf.io.FixedLenFeature([], tf.int64)
    shape, classes, first = list(spec.shape), spec.classes, spec.first_label
    label_rule = f"a label outside {first}..{first + classes - 1} (the {classes} classes of the data set)"

    def label(y, files, index):
        y = tf.reshape(y, [-1]) - first
        return y, _check(tf, (y >= 0) & (y < classes), tf.reshape(files, [-1]), tf.reshape(index, [-1]), label_rule)

    if spec.layout == "text":
        length = shape[0] + 1

        def parse_text(serialized, files, index):
            tokens = tf.io.parse_example(serialized, features)[x_name]
            size_ok = _check(tf, tf.equal(tf.strings.length(tokens), length), files, index,
                             f"feature 'tokens' is not the {length} bytes of a sequence and the byte after it")
            with tf.control_dependencies([size_ok]):   # uint8, as the arrays in memory: the same step either way
                t = tf.reshape(tf.io.decode_raw(tokens, tf.uint8), [-1, length])
            return t[:, :-1], t[:, 1:]
        return tf.autograph.experimental.do_not_convert(parse_text), False

    if spec.layout == "plain":
        dtype = {"float32": tf.float32, "int32": tf.int32}[spec.dtype]
        nbytes = ITEMSIZE[spec.dtype] * int(np.prod(shape))

        def parse(serialized, files, index):
            p = tf.io.parse_example(serialized, features)
            y, label_ok = label(p[y_name], files, index)
            size_ok = _check(tf, tf.equal(tf.strings.length(p[x_name]), nbytes), files, index,
                             f"feature 'x' is not the {nbytes} bytes of shape {shape} of {spec.dtype}")
            with tf.control_dependencies([label_ok, size_ok]):
                return tf.reshape(tf.io.decode_raw(p[x_name], dtype), [-1, *shape]), tf.cast(y, tf.int32)
        return tf.autograph.experimental.do_not_convert(parse), False

    height, width, channels = shape

    def parse_image(serialized, file, index):
        p = tf.io.parse_single_example(serialized, features)
        data = p[x_name]
        files, indices = tf.reshape(file, [1]), tf.reshape(index, [1])
        y, label_ok = label(p[y_name], files, indices)
        is_jpeg = tf.io.is_jpeg(data)
        is_image = is_jpeg | tf.equal(tf.strings.substr(data, 0, 8), PNG_MAGIC)
        with tf.control_dependencies([label_ok, _check(tf, tf.reshape(is_image, [1]), files, indices,
                                                       "image/encoded is not a JPEG or PNG image")]):
            # the size its header declares, before anything is decoded: a decompression bomb is refused
            height_width = tf.cond(is_jpeg, lambda: tf.cast(tf.io.extract_jpeg_shape(data)[:2], tf.int64),
                                   lambda: _png_size(tf, data))
            fits = tf.reduce_prod(height_width) * channels <= MAX_DECODED_VALUES
        with tf.control_dependencies([_check(tf, tf.reshape(fits, [1]), files, indices,
                                             f"image/encoded declares more pixels than hvdps decodes "
                                             f"({MAX_DECODED_VALUES:,} values an image): a damaged or crafted image")]):
            image = tf.io.decode_image(data, channels=channels, expand_animations=False)
        if spec.resize:
            image = tf.image.resize(image, [height, width])
        else:
            same = tf.reduce_all(tf.equal(tf.shape(image)[:2], [height, width]))
            with tf.control_dependencies([_check(tf, tf.reshape(same, [1]), files, indices,
                                                 f"an image not {height}x{width} (the size of the data set)")]):
                image = tf.identity(image)
        image = tf.ensure_shape(tf.cast(image, tf.float32) / 255.0, shape)
        return image, tf.cast(y[0], tf.int32)
    return tf.autograph.experimental.do_not_convert(parse_image), True


def stream(data_dir, spec, split, shard_index, num_shards, batch_size, seed=0, shuffle=True, shard_by="record",
           shuffle_buffer=10000, steps_per_epoch=None, start_step=0, num_steps=None):
    """A worker's ``(x, y)`` batches read from the shards.

    train: batches ``start_step`` (a tensor under classic PS) to ``num_steps`` of the run, epoch after epoch
    of ``steps_per_epoch`` batches, each epoch in its own seeded order. test: this worker's records
    ``i::n`` of every test file in order, the last batch kept, so the workers' sums add up to the
    whole test set."""
    import tensorflow as tf
    part = spec.train if split == "train" else spec.test
    files = [os.path.join(data_dir, name) for name in part.files]
    READING.extend(f for f in files if f not in READING)
    parse, per_record = _parser(spec)

    def parsed(ds, drop_remainder):
        if per_record:
            ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            return ds.batch(batch_size, drop_remainder=drop_remainder)
        return ds.batch(batch_size, drop_remainder=drop_remainder).map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    if split != "train":
        ds = tf.data.Dataset.from_tensor_slices(files).flat_map(_located).shard(num_shards, shard_index)
        return parsed(ds, False).prefetch(2)
    by_file = shard_by == "file"
    if by_file:
        files = files[shard_index::num_shards]
    epochs = -(-num_steps // steps_per_epoch)

    def epoch(e):
        order = seed * 1000003 + e
        ds = tf.data.Dataset.from_tensor_slices(files)
        if shuffle:
            ds = ds.shuffle(len(files), seed=order, reshuffle_each_iteration=False)
        ds = ds.interleave(_located, cycle_length=min(len(files), CYCLE), block_length=1,
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=order, reshuffle_each_iteration=False)
        if not by_file:
            ds = ds.shard(num_shards, shard_index)
        return ds.take(steps_per_epoch * batch_size)

    ds = tf.data.Dataset.range(epochs, output_type=tf.int64).flat_map(epoch)
    # the run's batches, then those a resumed run had read skipped, as records: that costs no decoding
    ds = ds.take(tf.cast(num_steps, tf.int64) * batch_size).skip(tf.cast(start_step, tf.int64) * batch_size)
    return parsed(ds, True).prefetch(tf.data.AUTOTUNE)
