"""TFRecord shards as a data set (common/inputs/records.py, hvdps data): written from the arrays training
reads, streamed with the arrays' semantics (epochs, n*b equivalence, resume), sharded by record or
by file, and refused in one line where a file is not what it should be."""
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from common.base.errors import UsageError
from common.inputs.records import SPEC, RecordError, check_sharding, encode_image, spec_of, stream, write
from tests.conftest import BIN, REPO, SYNC_EQUIV, assert_big_batch_equal, descendants, run, row_and_records
from tests.ps_helpers import lockstep

N_TRAIN, N_TEST, SHAPE, CLASSES = 40, 10, (2, 3, 1), 5


def arrays():
    rng = np.random.RandomState(0)
    x = rng.rand(N_TRAIN + N_TEST, *SHAPE).astype(np.float32)
    x[:, 0, 0, 0] = np.arange(N_TRAIN + N_TEST)          # each example tells its index
    y = np.arange(N_TRAIN + N_TEST) % CLASSES
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("records") / "set")
    write(out, arrays(), CLASSES, shards=4, test_shards=2)
    return out


def batches(ds):
    """Each batch as the example indices it holds (x[..., 0, 0, 0]), labels checked against them."""
    out = []
    for x, y in ds:
        ids = x.numpy()[:, 0, 0, 0].astype(int).tolist()
        assert y.numpy().tolist() == [i % CLASSES for i in ids]
        out.append(ids)
    return out


def train(spec_dir, i=0, n=1, b=4, **kw):
    spec = spec_of(spec_dir)
    kw.setdefault("steps_per_epoch", (N_TRAIN // n) // b)
    kw.setdefault("num_steps", 2 * kw["steps_per_epoch"])
    return batches(stream(spec_dir, spec, "train", i, n, b, seed=7, **kw))


@pytest.mark.unit
def test_written_shards_are_described_beside_them(shards):
    spec = json.load(open(os.path.join(shards, SPEC)))
    assert spec["layout"] == "plain" and spec["shape"] == list(SHAPE) and spec["classes"] == CLASSES
    assert spec["train"]["records"] == [10, 10, 10, 10] and spec["test"]["records"] == [5, 5]
    assert sorted(os.listdir(shards)) == sorted([SPEC, *spec["train"]["files"], *spec["test"]["files"]])


@pytest.mark.unit
def test_an_epoch_is_every_record_once_in_a_new_order_each_epoch(shards):
    got = train(shards)
    first, second = sum(got[:10], []), sum(got[10:], [])
    assert sorted(first) == sorted(second) == list(range(N_TRAIN))
    assert first != second and first != list(range(N_TRAIN))       # shuffled, and again each epoch
    assert train(shards) == got                                     # the same seed, the same order


@pytest.mark.unit
@pytest.mark.parametrize("n", [2, 4])
def test_record_sharding_at_n_workers_is_one_worker_at_n_times_the_batch(shards, n):
    one = train(shards, 0, 1, b=2 * n, steps_per_epoch=N_TRAIN // (2 * n), num_steps=N_TRAIN // (2 * n))
    each = [train(shards, i, n, b=2, steps_per_epoch=N_TRAIN // (2 * n), num_steps=N_TRAIN // (2 * n))
            for i in range(n)]
    for k, big in enumerate(one):
        assert sorted(sum((w[k] for w in each), [])) == sorted(big)


@pytest.mark.unit
def test_file_sharding_reads_each_workers_own_files(shards):
    spec = spec_of(shards)
    per_file = [set(range(10 * f, 10 * f + 10)) for f in range(4)]
    for i in range(2):
        seen = set(sum(train(shards, i, 2, b=5, shard_by="file"), []))
        assert seen == per_file[i] | per_file[i + 2]
    with pytest.raises(RecordError, match="4 training file.s. for 8 workers"):
        check_sharding(spec, "file", 8, 1, 1)
    with pytest.raises(RecordError, match="worker 1's files hold 10 records, fewer than the 12"):
        check_sharding(spec, "file", 3, 3, 4)
    check_sharding(spec, "record", 8, 1, 1)                          # records: any count of files


@pytest.mark.unit
def test_a_resumed_stream_skips_what_it_had_read(shards):
    whole = train(shards)
    assert train(shards, start_step=7) == whole[7:]
    assert train(shards, start_step=7, num_steps=13) == whole[7:13]       # a run of 13 steps, resumed at 7


@pytest.mark.unit
def test_the_test_split_is_dealt_out_whole(shards):
    spec = spec_of(shards)
    parts = [sum(batches(stream(shards, spec, "test", i, 3, 2)), []) for i in range(3)]
    assert sorted(sum(parts, [])) == list(range(N_TRAIN, N_TRAIN + N_TEST))


def _damage(path, how):
    data = open(path, "rb").read()
    if how == "empty":
        data = b""
    elif how == "not tfrecord":
        data = b"x_train,y_train\n1,2\n" * 4
    elif how == "truncated":
        data = data[:20]
    elif how == "bad crc":
        (length,) = struct.unpack("<Q", data[:8])
        data = data[:12 + length - 1] + bytes([data[12 + length - 1] ^ 1]) + data[12 + length:]
    open(path, "wb").write(data)


@pytest.mark.unit
@pytest.mark.parametrize("how, says", [
    ("empty", "empty, not a TFRecord file"),
    ("not tfrecord", "record 0: bad length CRC: not a TFRecord file"),
    ("truncated", "record 0: truncated"),
    ("bad crc", "record 0: bad data CRC"),
    ("missing", "No such file"),
])
def test_a_damaged_file_is_named_before_any_task_starts(tmp_path, how, says):
    out = str(tmp_path / "set")
    write(out, arrays(), CLASSES, shards=2)
    path = os.path.join(out, "train-00001-of-00002.tfrecord")
    os.remove(path) if how == "missing" else _damage(path, how)
    with pytest.raises(UsageError) as exc:
        spec_of(out)
    assert "\n" not in str(exc.value) and says in str(exc.value) and "train-00001-of-00002" in str(exc.value), exc.value


@pytest.mark.unit
@pytest.mark.parametrize("change, says", [
    ({"shape": [0, 3]}, "shape[0]"),
    ({"dtype": "float64"}, "dtype"),
    ({"classes": 0}, "classes"),
    ({"train": {"files": ["../../etc/passwd"], "records": [1]}}, "train.files[0]"),
    ({"train": {"files": ["a.tfrecord"], "records": [1, 2]}}, "1 files but 2 record counts"),
])
def test_a_wrong_description_is_one_line(tmp_path, change, says):
    out = str(tmp_path / "set")
    path = write(out, arrays(), CLASSES, shards=2)
    doc = json.load(open(path))
    doc.update(change)
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(UsageError) as exc:
        spec_of(out)
    assert "\n" not in str(exc.value) and says in str(exc.value), exc.value


def example(**features):
    """A serialized tf.train.Example: bytes for bytes values, int64 for ints, float for floats."""
    import tensorflow as tf

    def feature(value):
        if isinstance(value, bytes):
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(
        feature={k.replace("__", "/"): feature(v) for k, v in features.items()})).SerializeToString()


TEXT = bytes(range(256)) * 4 + b"def f(x):\n    return x\n" * 40      # every byte value, and some Python
SEQ = 8


def text_arrays():
    """(x_train, y_train, x_test, y_test) of TEXT as pysrc cuts a split: sequences of SEQ bytes, each
    label the byte after its position."""
    from common.inputs.pysrc import sequences
    return (*sequences(TEXT[:1000], SEQ), *sequences(TEXT[1000:], SEQ))


def one_file_set(tmp_path, layout):
    """The test arrays as one training file of ``layout`` (images: values in [0, 1]); its path, spec."""
    x, y, xt, yt = text_arrays() if layout == "text" else arrays()
    if layout == "imagenet":
        x, xt = np.clip(x, 0, 1), np.clip(xt, 0, 1)
    out = str(tmp_path / layout)
    write(out, (x, y, xt, yt), 256 if layout == "text" else CLASSES, shards=1, layout=layout)
    return os.path.join(out, "train-00000-of-00001" + (".tfrecord" if layout != "imagenet" else "")), out


def replace_record(path, index, data):
    """Rewrite a TFRecord file with record ``index`` replaced by ``data`` (valid framing and CRCs)."""
    import tensorflow as tf
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    records[index] = data
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


def record_start(path, index):
    at = 0
    with open(path, "rb") as f:
        for _ in range(index):
            f.seek(at)
            at += 16 + struct.unpack("<Q", f.read(8))[0]
    return at


PNG_5X5 = encode_image(np.zeros((5, 5, 1), np.uint8), "png")


JPEG_2X3 = encode_image(np.full((2, 3, 1), 128, np.uint8), "jpeg")


def png_declaring(height, width):
    """A PNG of a few dozen bytes whose header declares ``height`` x ``width`` gray pixels: a decompression
    bomb's header (its data is never reached)."""
    import zlib
    chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(64))) + chunk(b"IEND", b""))


def jpeg_declaring(height, width):
    """A small real JPEG whose frame header (SOF0) is rewritten to declare ``height`` x ``width``."""
    data = bytearray(encode_image(np.zeros((16, 16, 1), np.uint8), "jpeg"))
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


BOMB = example(image__encoded=png_declaring(30000, 30000), image__class__label=1)
PIXELS = bytes(24)                          # SHAPE (2, 3, 1) of float32
# (layout, the bad record, what the one line says)
BAD_EXAMPLES = [
    ("plain", example(y=1), "no 'x' feature (present: y)"),
    ("plain", example(**{"x\nz": PIXELS, "y": 1}), "no 'x' feature (present: 'x\\nz', y)"),   # a name read, quoted
    ("plain", example(x=1.5, y=1), "feature 'x' is a float_list, expected a bytes_list"),
    ("plain", example(x=PIXELS, y=b"1"), "feature 'y' is a bytes_list, expected an int64_list"),
    ("plain", example(x=b"12345", y=1), "feature 'x' holds 5 bytes; shape [2, 3, 1] of float32 is 24"),
    ("plain", example(x=PIXELS, y=5), "label 5 outside 0..4 (5 classes)"),
    ("plain", b"\xff" * 40, "not a tf.train.Example"),
    ("imagenet", example(image__encoded=b"GIF89a" + bytes(30), image__class__label=1), "image/encoded does not decode as a JPEG or PNG image"),
    ("imagenet", example(image__encoded=PNG_5X5, image__class__label=1), "a 5x5 image; the data set's images are 2x3"),
    ("imagenet", example(image__encoded=PNG_5X5[:30], image__class__label=1), "image/encoded does not decode as a JPEG or PNG image"),
    ("imagenet", example(image__encoded=encode_image(np.zeros((2, 3, 1), np.uint8), "png"), image__class__label=0),
     "label 0 outside 1..5 (5 classes, 1-based)"),
    ("imagenet", BOMB, "image/encoded declares 30000x30000 pixels, more than hvdps decodes (268,435,456 values"),
    ("imagenet", example(image__encoded=jpeg_declaring(20000, 16000), image__class__label=1),
     "image/encoded declares 20000x16000 pixels, more than hvdps decodes"),
    ("text", example(x=bytes(SEQ + 1)), "no 'tokens' feature (present: x)"),
    ("text", example(tokens=7), "feature 'tokens' is an int64_list, expected a bytes_list"),
    ("text", example(tokens=bytes(SEQ)), f"feature 'tokens' holds {SEQ} bytes; the data set's sequences are {SEQ} "
                                         f"bytes and the one after ({SEQ + 1})"),
]


@pytest.mark.unit
@pytest.mark.parametrize("layout, data, says", BAD_EXAMPLES, ids=[says[:24] for _, _, says in BAD_EXAMPLES])
def test_a_first_record_unlike_its_layout_is_named_before_any_task_starts(tmp_path, layout, data, says):
    path, out = one_file_set(tmp_path, layout)
    replace_record(path, 0, data)
    with pytest.raises(UsageError) as exc:
        spec_of(out)
    assert str(exc.value).startswith(f"{path}: record 0: {says}") and "\n" not in str(exc.value), exc.value


def _read_all(out, spec=None):
    from common.inputs.data import read_batches
    spec = spec or spec_of(out)
    steps = sum(spec.train.records) // 4                     # every record read
    for _ in read_batches(stream(out, spec, "train", 0, 1, 4, seed=7, steps_per_epoch=steps, num_steps=steps),
                          "rank 0"):
        pass


DAMAGE = [
    ("plain", example(x=PIXELS, y=9), "record 3: a label outside 0..4 (the 5 classes of the data set)"),
    ("plain", example(x=b"12345", y=1), "record 3: feature 'x' is not the 24 bytes of shape [2, 3, 1] of float32"),
    ("plain", example(x=PIXELS), "y (data type: int64) is required but could not be found"),
    ("plain", "flip", "record 3: a damaged record (bad CRC, or cut short)"),
    ("plain", "cut", "record 3: a damaged record (bad CRC, or cut short)"),
    ("imagenet", example(image__encoded=b"GIF89a" + bytes(30), image__class__label=1),
     "record 3: image/encoded is not a JPEG or PNG image"),
    ("imagenet", example(image__encoded=PNG_5X5, image__class__label=1), "record 3: an image not 2x3"),
    ("imagenet", example(image__encoded=encode_image(np.zeros((2, 3, 1), np.uint8), "png"), image__class__label=6),
     "record 3: a label outside 1..5 (the 5 classes of the data set)"),
    ("imagenet", BOMB, "record 3: image/encoded declares more pixels than hvdps decodes (268,435,456 values"),
    ("imagenet", example(image__encoded=JPEG_2X3[:len(JPEG_2X3) // 2], image__class__label=1),
     "record 3: image/encoded does not decode ("),
    ("plain", "delete", "No such file or directory (the file went away during training)"),
    ("imagenet", example(image__encoded=jpeg_declaring(20000, 16000), image__class__label=1),
     "record 3: image/encoded declares more pixels than hvdps decodes"),
    ("text", example(tokens=bytes(SEQ)), f"record 3: feature 'tokens' is not the {SEQ + 1} bytes of a sequence"),
    ("text", example(x=bytes(SEQ + 1)), "tokens (data type: string) is required but could not be found"),
    ("text", "flip", "record 3: a damaged record (bad CRC, or cut short)"),
]


@pytest.mark.unit
@pytest.mark.parametrize("layout, bad, says", DAMAGE, ids=[f"{layout}: {says[:30]}" for layout, _, says in DAMAGE])
def test_damage_past_the_first_record_ends_the_run_naming_the_file_and_record(tmp_path, layout, bad, says):
    """What only reading finds: one line from the worker that read it (common.inputs.data.read_batches),
    naming the file and the record where TensorFlow's message allows (a missing feature: the feature)."""
    from common.base.errors import InputError
    path, out = one_file_set(tmp_path, layout)
    if isinstance(bad, bytes):
        replace_record(path, 3, bad)
    elif bad == "delete":                                    # a shard deleted once the run had checked it
        spec = spec_of(out)
        os.remove(path)
        with pytest.raises(InputError) as exc:
            _read_all(out, spec)
        assert str(exc.value).startswith(f"rank 0: reading the training data: {path}: ") and says in str(exc.value)
        return
    else:
        data = bytearray(open(path, "rb").read())
        at = record_start(path, 3)
        if bad == "flip":
            data[at + 20] ^= 0xFF
        else:
            del data[at + 20:]
        open(path, "wb").write(bytes(data))
    spec_of(out)                                             # record 0 is whole: nothing to refuse before
    with pytest.raises(InputError) as exc:
        _read_all(out)
    line = str(exc.value)
    assert "\n" not in line and line.startswith("rank 0: reading the training data: ") and says in line, line
    if "record 3" in says:
        assert f"{path}: record 3" in line, line


@pytest.mark.unit
def test_the_imagenet_layout_holds_the_arrays_as_images_with_1_based_labels(tmp_path):
    """Lossless PNG: each test image decodes to its 8-bit values, each label one below the file's."""
    import tensorflow as tf
    x, y, xt, yt = arrays()
    xt = np.clip(xt, 0, 1)
    path, out = one_file_set(tmp_path, "imagenet")
    spec = spec_of(out)
    assert spec.layout == "imagenet" and spec.first_label == 1 and spec.dtype == "uint8"
    stored = [tf.train.Example.FromString(r.numpy()).features.feature["image/class/label"].int64_list.value[0]
              for r in tf.data.TFRecordDataset(os.path.join(out, "validation-00000-of-00001"))]
    assert stored == [int(v) + 1 for v in yt]
    got = list(stream(out, spec, "test", 0, 1, N_TEST))[0]
    np.testing.assert_allclose(got[0].numpy(), np.rint(xt * 255) / 255, atol=1e-6)
    assert got[1].numpy().tolist() == yt.tolist()


@pytest.mark.unit
def test_the_text_layout_streams_the_sequences_and_their_next_bytes_as_in_memory(tmp_path):
    """Each record is a sequence and the byte after it: the test split streams back the arrays byte for
    byte (uint8, as in memory), and an epoch of the training split is every sequence once, each label
    the next byte of its own sequence."""
    x, y, xt, yt = text_arrays()
    _, out = one_file_set(tmp_path, "text")
    spec = spec_of(out)
    assert (spec.layout, spec.shape, spec.dtype, spec.classes) == ("text", [SEQ], "uint8", 256)
    (gx, gy), = list(stream(out, spec, "test", 0, 1, len(xt)))
    assert gx.dtype.name == gy.dtype.name == "uint8" and gx.shape == (len(xt), SEQ)
    np.testing.assert_array_equal(gx.numpy(), xt)
    np.testing.assert_array_equal(gy.numpy(), yt)
    spe = len(x) // 4
    assert len(x) % 4 == 0
    seen = []
    for bx, by in stream(out, spec, "train", 0, 1, 4, seed=7, steps_per_epoch=spe, num_steps=spe):
        np.testing.assert_array_equal(bx.numpy()[:, 1:], by.numpy()[:, :-1])
        seen += [r.tobytes() + n.tobytes() for r, n in zip(bx.numpy(), by.numpy()[:, -1:])]
    whole = [r.tobytes() + n.tobytes() for r, n in zip(x, y[:, -1:])]
    assert len(seen) == len(whole) == spe * 4 and sorted(seen) == sorted(whole)     # the same sequences, once each


@pytest.mark.unit
@pytest.mark.parametrize("flags, says", [
    (["--model", "mlp"], "its shards are text, a next byte to predict at every position: use --model transformer, "
                         "not mlp"),
    (["--model", "transformer", "--seq_len", "16"], f"its sequences are {SEQ} bytes; --seq_len is 16 (pass --seq_len "
                                                    f"{SEQ}, or write the shards at --seq_len 16)"),
    (["--model", "transformer", "--seq_len", str(SEQ), "--plain"], "its shards are the plain layout; --model "
                                                                   "transformer reads the text layout's byte sequences "
                                                                   "(hvdps data --dataset pysrc)"),
])
def test_a_model_the_shards_do_not_fit_is_refused_in_the_plan(tmp_path, capsys, monkeypatch, shards, flags, says):
    """The model and the layout, and --seq_len and the sequences, agree before any task starts: the
    header records the flags, so a flag the files overrode would record what the model never read."""
    from hvdps.cli import main
    monkeypatch.setattr("common.spec.plugins._budget", None)
    plain = "--plain" in flags
    data = shards if plain else one_file_set(tmp_path, "text")[1]
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--dry_run", "--backends", "horovod", "--workers", "2", "--dataset", "tfrecord",
              "--data_dir", data, *[f for f in flags if f != "--plain"], "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == f"error: --data_dir {data}: {says}\n", err
    assert not (tmp_path / "out").exists()


@pytest.mark.unit
def test_a_label_past_the_classes_stops_the_stream_naming_it(tmp_path):
    import tensorflow as tf
    x, y, xt, yt = arrays()
    out = str(tmp_path / "set")
    write(out, (x, y, xt, yt), CLASSES, shards=1)
    spec = spec_of(out).model_copy(update={"classes": 3})
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"train-00000-of-00001.tfrecord: record \d+: a label outside 0..2 \(the 3 classes of the data set\)"):
        batches(stream(out, spec, "train", 0, 1, 4, steps_per_epoch=10, num_steps=10))


@pytest.mark.unit
def test_a_bad_record_only_the_compute_probe_reads_ends_the_run_naming_it(tmp_path):
    """The probe reads the training data from its start after training: a record the training never
    reached (TF2 PS's coordinator may leave it to a worker that ran few steps) is named as training
    names it, one line, not TensorFlow's error from the probe's iterator."""
    from common.base.errors import InputError
    from common.model.probe import compute_step_time
    from common.spec.config import make_config
    path, out = one_file_set(tmp_path, "plain")
    replace_record(path, 3, example(x=bytes(4 * int(np.prod(SHAPE))), y=CLASSES))
    cfg = make_config(dataset="tfrecord", data_dir=out, batch_size=4, probe_steps=2, shuffle=False)
    with pytest.raises(InputError, match=rf"^the compute probe, after training: reading the training data: "
                                         rf"{path}: record 3: a label outside 0..{CLASSES - 1}"):
        compute_step_time(cfg)


@pytest.mark.unit
def test_hvdps_data_writes_once_and_never_over(tmp_path):
    from hvdps.cli import main
    out = str(tmp_path / "digits")
    assert main(["data", "--dataset", "digits", "--shards", "3", "--out", out]) == 0
    from common.spec.config import make_config
    from common.inputs.data import load_arrays
    spec = spec_of(out)
    assert sum(spec.train.records) == len(load_arrays(make_config())[0]) and spec.shape == [8, 8, 1]
    assert spec.classes == 10 and spec.train.records == [480, 479, 479]
    with pytest.raises(SystemExit) as exc:
        main(["data", "--dataset", "digits", "--out", out])
    assert exc.value.code == 2


@pytest.mark.process
def test_two_workers_from_shards_equal_one_at_double_batch(tmp_path):
    """The digits as 4 TFRecord files, sharded by record: 2 Horovod ranks and 2 sync PS workers at
    batch 16 each end with the weights of one process at batch 32."""
    data = str(tmp_path / "digits")
    r = run([os.path.join(BIN, "hvdps"), "data", "--dataset", "digits", "--shards", "4", "--out", data])
    assert r.returncode == 0, r.stderr[-2000:]
    main = os.path.join(REPO, "horovod_train", "main.py")
    tf_data = ["--dataset", "tfrecord", "--data_dir", data]
    r = run([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", sys.executable, main, *tf_data,
             *SYNC_EQUIV, "--batch_size", "16", "--train_dir", str(tmp_path / "two")], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = run([sys.executable, main, *tf_data, *SYNC_EQUIV, "--batch_size", "32", "--train_dir", str(tmp_path / "one")])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert_big_batch_equal(tmp_path / "two", tmp_path / "one")
    lockstep(lambda: run([os.path.join(BIN, "hvdps"), "launch", "ps", "--num_ps", "1", "--num_workers", "2", "--sync",
                          *tf_data, *SYNC_EQUIV, "--batch_size", "16", "--train_dir", str(tmp_path / "ps")], timeout=300),
             str(tmp_path / "ps"))
    assert_big_batch_equal(tmp_path / "ps", tmp_path / "one")


@pytest.mark.unit
@pytest.mark.parametrize("command", [["compare", "--backends", "horovod", "--workers", "1,8"],
                                     ["launch", "ps", "--num_workers", "8"], ["launch", "mwms", "--num_workers", "8"]])
def test_too_few_files_for_the_workers_is_refused_before_any_task_starts(shards, tmp_path, capsys, monkeypatch,
                                                                        command):
    from hvdps.cli import main
    # the launchers bound this process's plug-in imports from now on (--run_timeout): put it back after
    monkeypatch.setattr("common.spec.plugins._budget", None)
    with pytest.raises(SystemExit) as exc:
        main([*command, "--dataset", "tfrecord", "--data_dir", shards, "--shard_by", "file", "--batch_size", "1",
              "--out" if command[0] == "compare" else "--train_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and "4 training file(s) for 8 workers" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.process
@pytest.mark.parametrize("backends, epochs", [("mpi,mwms", 5), ("ps:async,ps2", 8)])
def test_every_method_trains_from_shards_to_its_target(tmp_path, backends, epochs):
    """The digits as 4 TFRecord files, compared under every method at 2 workers, at the epochs
    tests/test_defaults.py holds each mode to: each run reaches 0.90 and has its wait at the
    iterator in its breakdown; the report names each method (TF all-reduce, both PS trainers) with
    its overhead's words and the data's sharding rule, and is the same rebuilt with --from; compare
    leaves no process behind. Horovod and
    sync PS are held step for step to one process at the double batch on the same shards
    (test_two_workers_from_shards_equal_one_at_double_batch), and to the target on the data in memory
    (test_defaults.py, test_ps.py)."""
    data = str(tmp_path / "digits")
    r = run([os.path.join(BIN, "hvdps"), "data", "--dataset", "digits", "--shards", "4", "--out", data])
    assert r.returncode == 0, r.stderr[-2000:]
    r = run([os.path.join(BIN, "hvdps"), "compare", "--dataset", "tfrecord", "--data_dir", data, "--backends", backends,
             "--workers", "2", "--epochs", str(epochs), "--no_progress", "--out", str(tmp_path / "cmp")], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert descendants(os.getpid()) == []
    rows = json.load(open(tmp_path / "cmp" / "results.json"))["rows"]
    assert len(rows) == len(backends.split(","))
    for x in rows:
        assert x["status"] == "ok" and x["final_test_accuracy"] >= 0.90, x
        split = row_and_records(x["run_dir"])[1]["summary"]["breakdown"]   # the wait for each batch, at the iterator
        assert 0 < split["input_s"] < split["step_s"], (x["backend"], x["mode"], split)
        assert split["input_share"] == split["input_s"] / split["step_s"], split
    report = (tmp_path / "cmp" / "report.md").read_text()     # the rule and its guarantee, with the config
    assert f"Data ({rows[0]['model']}): the TFRecord shards in `{data}`, `--shard_by record`: every worker reads every file" in report
    # rebuilt from its runs, the report is the live one, its Data line and config included
    r = run([os.path.join(BIN, "hvdps"), "compare", "--from", str(tmp_path / "cmp" / "runs"), "--out",
             str(tmp_path / "again")], timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "again" / "report.md").read_text() == report
    assert json.load(open(tmp_path / "again" / "results.json"))["config"] == \
        json.load(open(tmp_path / "cmp" / "results.json"))["config"]
    if "mwms" in backends:
        mwms = next(x for x in rows if x["backend"] == "mwms")
        row, curves = row_and_records(mwms["run_dir"])
        assert curves["header"]["config"]["shard_by"] == "record"
        assert report.count("TF all-reduce (MWMS)") >= 2, report[:3000]
        assert "TensorFlow's collective all-reduce of the gradients" in report   # the MWMS run's overhead
    else:
        assert "PS v2 (TF2 strategy)" in report and "PS async" in report


@pytest.mark.unit
@pytest.mark.parametrize("argv, says", [
    (["--image_shape", "x"], "error: argument --image_shape: expected H,W,C"),
    (["--shards", "0"], "error: --shards must be in [1, 1048576], got 0"),
    (["--dataset", "mnist"], "error: --dataset mnist needs --data_dir"),
    (["--dataset", "tfrecord"], "error: --dataset tfrecord: hvdps data writes"),
    (["--shards", "5000"], "error: --shards 5000: the train split has only"),
    (["--resize", "8,8"], "error: --image_format and --resize are for --layout imagenet"),
    (["--layout", "imagenet", "--resize", "8,8"], "error: --resize is for a synthetic set"),
    (["--layout", "imagenet", "--dataset", "synthetic", "--resize", "8"], "error: argument --resize: expected H,W"),
    (["--layout", "imagenet", "--dataset", "synthetic", "--image_shape", "8,8,2"],
     "error: --image_shape 8,8,2: the imagenet layout stores images of 1 or 3 channels"),
    (["--layout", "imagenet", "--dataset", "synthetic", "--test_shards", "300"],
     "error: --test_shards 300: the test split has only"),
    (["--layout", "tiff"], "error: argument --layout: invalid choice"),
    (["--dataset", "pysrc", "--layout", "plain"], "error: --layout plain: the text layout is for --dataset pysrc, "
                                                  "and pysrc is written in the text layout only"),
    (["--layout", "text"], "error: --layout text: the text layout is for --dataset pysrc"),
    (["--dataset", "pysrc", "--image_format", "png"], "error: --image_format and --resize are for --layout imagenet"),
    (["--dataset", "pysrc", "--seq_len", "0"], "error: --seq_len must be positive, got 0"),
    (["--dataset", "pysrc", "--seq_len", "65537"], "error: --seq_len must be at most 65536, got 65537"),
    (["--layout", "imagenet", "--dataset", "synthetic", "--synthetic_samples", "0"],
     "error: --synthetic_samples must be in [1, 1099511627776], got 0"),
])
def test_hvdps_data_bad_input_is_one_line(tmp_path, capsys, argv, says):
    from hvdps.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["data", *argv, "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and err.startswith(says), err
    assert os.listdir(tmp_path) == []             # no folder, no staging folder beside it


@pytest.mark.unit
@pytest.mark.parametrize("setup, argv, says", [
    # a user's own shards and no dataset.json: never replaced
    ({"d/train-00000-of-00002.tfrecord": b"mine"}, ["--dataset", "digits", "--shards", "2"],
     "error: --out {tmp}/d already holds 1 file(s) (train-00000-of-00002.tfrecord); a data set is written only "
     "into a new or empty folder"),
    ({"d/notes.txt": b"mine", "d/x.npz": b"mine"}, ["--dataset", "digits"], "error: --out {tmp}/d already holds 2 file(s)"),
    ({"d/" + SPEC: b"{}"}, ["--dataset", "digits"], "error: --out {tmp}/d already holds a data set (dataset.json)"),
    ({"d": b"a file"}, ["--dataset", "digits"], "error: --out {tmp}/d is a file or a link, not a folder"),
    # the disk: checked against the set's size before the first byte (1 TiB of 224x224x3 JPEG images)
    ({}, ["--dataset", "synthetic", "--layout", "imagenet", "--image_shape", "224,224,3",
          "--synthetic_samples", "1099511627776"], "error: --out {tmp}/d: the data set takes about 47,"),
    ({}, ["--dataset", "digits", "--out", "/proc/hvdps-nowhere"], "error: --out /proc/hvdps-nowhere is not writable"),
])
def test_hvdps_data_touches_nothing_it_did_not_write(tmp_path, capsys, setup, argv, says):
    """What --out holds stays as it was, byte for byte, and nothing is added beside it."""
    from hvdps.cli import main
    for rel, data in setup.items():
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    before = {p: open(p, "rb").read() for p in (str(tmp_path / r) for r in setup)}
    with pytest.raises(SystemExit) as exc:
        main(["data", "--out", str(tmp_path / "d"), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and err.startswith(says.format(tmp=tmp_path)), err
    assert {p: open(p, "rb").read() for p in before} == before
    assert sorted(os.listdir(tmp_path)) == sorted({r.split("/")[0] for r in setup})


def _whole(folder):
    """The set in ``folder`` is one writer's and whole: its description lists exactly the files there,
    each holding the records it counts (read from the framing)."""
    from common.inputs.records import count_records
    spec = spec_of(folder)
    names = spec.train.files + spec.test.files
    assert sorted(os.listdir(folder)) == sorted([*names, SPEC]), os.listdir(folder)
    assert [count_records(os.path.join(folder, n)) for n in names] == spec.train.records + spec.test.records
    return spec


@pytest.mark.process
def test_hvdps_data_writes_whole_or_not_at_all_and_one_writer_at_a_time(tmp_path):
    """A writer killed midway leaves no set a run would accept; then two writers of the same --out at
    once: one is refused, and the set on disk is the other's, whole; the killed writer's staging
    folder is gone."""
    out = str(tmp_path / "set")
    hvdps = os.path.join(BIN, "hvdps")
    big = subprocess.Popen([hvdps, "data", "--dataset", "synthetic", "--layout", "imagenet", "--image_shape", "64,64,3",
                            "--synthetic_samples", "200000", "--shards", "4", "--out", out],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        staging = []
        while time.monotonic() < deadline and big.poll() is None:
            staging = [os.path.join(tmp_path, n) for n in os.listdir(tmp_path) if n.startswith(".set.")]
            if staging and os.listdir(staging[0]):          # its first shard under way
                break
            time.sleep(0.05)
        assert staging and big.poll() is None, big.communicate()
    finally:
        big.kill()
        big.wait()
    with pytest.raises(RecordError, match="no dataset.json"):
        spec_of(out)
    two = [subprocess.Popen([hvdps, "data", "--dataset", "digits", "--shards", str(n), "--out", out],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (2, 3)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in two]
    assert sorted(r[0] for r in results) == [0, 2], results
    refused = next(r for r in results if r[0] == 2)[2]
    assert refused.count("error:") == 1 and (f"--out {out} is in use" in refused or "already holds" in refused), refused
    won = 2 if results[0][0] == 0 else 3
    assert len(_whole(out).train.files) == won
    assert sorted(os.listdir(tmp_path)) == ["set"]          # the killed writer's staging folder removed


@pytest.mark.process
def test_a_bad_record_ends_the_run_naming_it_under_every_loop(tmp_path):
    """A label past the classes in the middle of a file, read by one worker: bare MPI (the custom
    loop; the failed rank ends the job, not a hang), classic sync PS (the worker's session) and TF2
    PS (a worker's function, failed at the coordinator; or, where the coordinator left that record to
    a worker that ran too few steps to read it, the chief's compute probe after training) each end with
    the file and record named."""
    data = str(tmp_path / "digits")
    r = run([os.path.join(BIN, "hvdps"), "data", "--dataset", "digits", "--shards", "4", "--out", data])
    assert r.returncode == 0, r.stderr[-2000:]
    path = os.path.join(data, "train-00000-of-00004.tfrecord")
    replace_record(path, 100, example(x=bytes(256), y=10))
    r = run([os.path.join(BIN, "hvdps"), "compare", "--dataset", "tfrecord", "--data_dir", data, "--backends",
             "mpi,ps:sync,ps2", "--workers", "2", "--epochs", "1", "--run_timeout", "120", "--no_progress",
             "--out", str(tmp_path / "cmp")], timeout=600)
    rows = json.load(open(tmp_path / "cmp" / "results.json"))["rows"]
    assert len(rows) == 3, r.stdout[-3000:] + r.stderr[-3000:]
    for x in rows:
        assert x["status"] == "failed" and f"reading the training data: {path}: record 100: a label outside 0..9" \
            in x["error"], x


@pytest.mark.process
def test_a_worker_streams_a_set_far_larger_than_its_buffers(tmp_path):
    """Streaming: a worker's memory is its buffers, not the data set. The same trainer and steps on
    200 and on 8,000 synthetic 64x64x3 JPEG images (the 8,000 as float32 arrays: 393 MB): peak
    resident memory (the summary's peak_rss_mib) grows by less than 100 MB."""
    main = os.path.join(REPO, "horovod_train", "main.py")
    peaks = {}
    for n in (200, 8000):
        data = str(tmp_path / f"set{n}")
        r = run([os.path.join(BIN, "hvdps"), "data", "--dataset", "synthetic", "--layout", "imagenet",
                 "--image_shape", "64,64,3", "--num_classes", "10", "--synthetic_samples", str(n), "--shards", "4",
                 "--out", data], timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out = str(tmp_path / f"run{n}")
        r = run([sys.executable, main, "--dataset", "tfrecord", "--data_dir", data, "--train_steps", "40",
                 "--batch_size", "32", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false",
                 "--probe_steps", "0", "--train_dir", out], timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        peaks[n] = row_and_records(out)[1]["summary"]["peak_rss_mib"]
    loaded = 8000 * 64 * 64 * 3 * 4 / 2 ** 20
    assert peaks[8000] - peaks[200] < 100 < loaded, (peaks, loaded)


@pytest.mark.unit
def test_imagenet_files_without_a_description_are_counted_and_described(tmp_path, capsys):
    """Real ImageNet shards come without dataset.json: --describe counts each file's records from its
    framing and writes one (1-based labels, images resized); a file cut short is named instead."""
    from hvdps.cli import main
    path, out = one_file_set(tmp_path, "imagenet")
    written = spec_of(out)
    os.remove(os.path.join(out, SPEC))
    with pytest.raises(RecordError) as exc:                 # the one command that makes them trainable
        spec_of(out)
    assert f"look like ImageNet TFRecords: describe them once with `hvdps data --describe {out}` " in str(exc.value)
    assert main(["data", "--describe", out, "--image_shape", "2,3,1", "--num_classes", str(CLASSES)]) == 0
    described = spec_of(out)
    assert described.train == written.train and described.test == written.test and not described.resize
    assert (described.first_label, described.classes, described.shape) == (1, CLASSES, [2, 3, 1])
    os.remove(os.path.join(out, SPEC))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["data", "--describe", out, "--image_shape", "2,3,1", "--num_classes", str(CLASSES)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and f"{path}: record {N_TRAIN - 1}: cut short" in err, err
    assert not os.path.exists(os.path.join(out, SPEC))


@pytest.mark.unit
@pytest.mark.parametrize("flags, says", [
    ([], None),                                              # what the records hold: 2x3 gray images, 5 classes
    (["--image_shape", "224,224,3"], "its images are 2x3x1, labels 1..5 (the first 16 records of each of its 2 "
                                     "files); --image_shape 224,224,3 would resize every one: leave it out"),
    (["--image_shape", "2,3,3"], "its images are 2x3x1, labels 1..5 (the first 16 records of each of its 2 files); "
                                 "--image_shape 2,3,3 asks for 3 channel(s)"),
    (["--num_classes", "4"], "--num_classes 4 is fewer than label 5 needs (1-based)"),
])
def test_describe_reads_what_the_records_hold_and_refuses_a_flag_they_contradict(tmp_path, capsys, flags, says):
    """--describe with no flag takes the images' size, channels and labels from the records (a set of
    small images is never described as ImageNet's 224x224x3 and 1,000 classes); a flag the records
    contradict is one line saying what they hold, and nothing is written."""
    from hvdps.cli import main
    _, out = one_file_set(tmp_path, "imagenet")
    os.remove(os.path.join(out, SPEC))
    if says is None:
        assert main(["data", "--describe", out]) == 0
        spec = spec_of(out)
        assert (spec.shape, spec.classes, spec.first_label, spec.resize) == ([2, 3, 1], CLASSES, 1, False)
        assert "train-00000-of-00001" in spec.train.files
        assert f"{N_TRAIN} training and {N_TEST} validation records, 2x3x1 images, 5 classes (labels from 1)" in \
            capsys.readouterr().out
        return
    with pytest.raises(SystemExit) as exc:
        main(["data", "--describe", out, *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and err.startswith(f"error: --describe {out}: ") \
        and says in err, err
    assert not os.path.exists(os.path.join(out, SPEC))


@pytest.mark.unit
@pytest.mark.parametrize("flags, says", [
    (["--image_shape", "28,28,3"], "its dataset.json feeds the model 2x3x1 images; --image_shape 28,28,3 would not be "
                                   "what it trains on: leave it out, or describe the files again"),
    (["--num_classes", "7"], "its dataset.json holds 5 classes; --num_classes 7 would not be what it trains on"),
])
def test_a_trainer_flag_the_description_overrides_is_refused(tmp_path, capsys, monkeypatch, flags, says):
    """The description decides what the pipeline feeds the model; a flag that says otherwise is refused
    before any task starts, so the run's header never records a flag it did not use."""
    from hvdps.cli import main
    monkeypatch.setattr("common.spec.plugins._budget", None)
    _, out = one_file_set(tmp_path, "imagenet")
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--dry_run", "--backends", "horovod", "--workers", "2", "--dataset", "tfrecord",
              "--data_dir", out, *flags, "--out", str(tmp_path / "cmp")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(f"error: --data_dir {out}: {says}"), err


@pytest.mark.unit
@pytest.mark.parametrize("argv, says", [
    ([], "error: give --out (write a data set) or --describe DIR"),
    (["--describe", "{tmp}/nowhere"], "error: --describe {tmp}/nowhere: no such directory"),
    (["--describe", "{tmp}"], "error: --describe {tmp}: no files match train-*"),
    (["--describe", "{tmp}", "--image_shape", "8,8,2"], "error: --image_shape 8,8,2: H,W,C with C 1 or 3"),
    (["--describe", "{tmp}", "--num_classes", "0"], "error: --num_classes must be in [1, 16777216], got 0"),
    (["--describe", "{tmp}", "--out", "{tmp}/x"], "error: give --out (write a data set) or --describe DIR"),
])
def test_hvdps_data_describe_bad_input_is_one_line(tmp_path, capsys, argv, says):
    from hvdps.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["data", *[a.format(tmp=tmp_path) for a in argv]])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and err.startswith(says.format(tmp=tmp_path)), err
    assert not (tmp_path / SPEC).exists()


@pytest.mark.unit
@pytest.mark.parametrize("content, says", [(b"", "train-00000-of-00001: empty, not a TFRecord file"),
                                           (None, "train-00000-of-00001: record 0: not a tf.train.Example")])
def test_describe_names_a_file_it_cannot_read_the_images_of(tmp_path, capsys, content, says):
    """--describe reads records before it checks files: an empty file, or a record that is not an
    Example, is one line naming the file, never a traceback."""
    import tensorflow as tf
    from hvdps.cli import main
    for name in ("train-00000-of-00001", "validation-00000-of-00001"):
        if content is None:
            with tf.io.TFRecordWriter(str(tmp_path / name)) as w:
                w.write(b"\xff" * 40)
        else:
            (tmp_path / name).write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        main(["data", "--describe", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and f"{tmp_path}/{says}" in err, err
    assert not (tmp_path / SPEC).exists()


@pytest.mark.unit
def test_a_description_of_examples_too_large_to_hold_is_refused_before_anything_is_allocated(tmp_path):
    """dataset.json resizing images to 12000x12000x3 (432 million values an example: 107 GiB a batch of
    64) is refused as it is read, in one line, before a batch or a model of that size exists."""
    path, out = one_file_set(tmp_path, "imagenet")
    spec = json.load(open(os.path.join(out, SPEC)))
    spec.update(shape=[12000, 12000, 3], resize=True)
    open(os.path.join(out, SPEC), "w").write(json.dumps(spec))
    with pytest.raises(UsageError) as exc:
        spec_of(out)
    assert "\n" not in str(exc.value) and "432,000,000 values an example; hvdps takes at most 67,108,864" in str(
        exc.value), exc.value


@pytest.mark.unit
def test_describe_refuses_a_fifo_among_the_files_without_opening_it(tmp_path, capsys):
    """Opening a FIFO blocks until something writes it: a train-* FIFO is refused in one line instead."""
    from hvdps.cli import main
    os.mkfifo(tmp_path / "train-00000-of-00001")
    (tmp_path / "validation-00000-of-00001").write_bytes(b"")
    with pytest.raises(SystemExit) as exc:
        main(["data", "--describe", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1, err
    assert f"{tmp_path}/train-00000-of-00001: a TFRecord file is not a regular file" in err, err
