"""The byte-level transformer (--model transformer) on the standard library's source (--dataset pysrc):
the corpus split by file, the model's shape and start the same in every backend, a next-byte accuracy
counted per position, and N workers at batch b training as one process at N*b under the synchronous
methods."""
import os
import sys

import numpy as np
import pytest

from common.base.errors import UsageError
from common.inputs import pysrc
from common.spec.config import make_config
from tests.conftest import BIN, REPO, SYNC_EQUIV, assert_big_batch_equal, py, run


def library(tmp_path, files):
    """A stand-in standard library: {path inside it: bytes}."""
    for rel, data in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(tmp_path)


@pytest.mark.unit
def test_the_held_out_split_is_by_file_and_the_same_every_time(tmp_path):
    files = {f"pkg{i % 7}/mod{i}.py": (f"# module {i}\n" + "x = 1\n" * (50 + i)).encode() for i in range(300)}
    files["site-packages/other.py"] = b"not the library\n" * 100     # installed packages are left out
    files["pkg0/notes.txt"] = b"not source\n"
    root = library(tmp_path, files)
    found = [rel for rel, _ in pysrc.source_files(root)]
    assert len(found) == 300 and not any("site-packages" in f or f.endswith(".txt") for f in found)
    sizes = [(rel, os.path.getsize(os.path.join(root, rel))) for rel in found]
    train, held = pysrc.split_files(sizes)
    assert set(r for r, _ in train).isdisjoint(r for r, _ in held) and len(train) + len(held) == 300
    share = sum(s for _, s in held) / sum(s for _, s in sizes)
    assert pysrc.HELDOUT_FRACTION <= share < 3 * pysrc.HELDOUT_FRACTION, share
    assert set(pysrc.split_files(list(reversed(sizes)))[1]) == set(held)      # the order given never matters
    splits = pysrc.read_splits(root)
    assert splits["test"] == b"".join(files[rel] for rel, _ in sorted(held))


@pytest.mark.unit
@pytest.mark.parametrize("n, seq_len, sequences", [(10, 3, 3), (7, 3, 2), (4, 3, 1), (101, 10, 10)])
def test_each_label_is_the_next_byte(n, seq_len, sequences):
    data = bytes(range(n))
    x, y = pysrc.sequences(data, seq_len)
    assert x.shape == y.shape == (sequences, seq_len) and x.dtype == np.uint8
    assert np.array_equal(y, x + 1)                              # every position's label: the byte after it
    assert np.array_equal(x.ravel(), np.arange(sequences * seq_len))   # windows one after another


@pytest.mark.unit
def test_a_split_shorter_than_one_sequence_is_one_line():
    with pytest.raises(UsageError, match="--seq_len 8: longer than the 5 bytes of a split"):
        pysrc.sequences(b"12345", 8)


@pytest.mark.unit
@pytest.mark.parametrize("flags, message", [
    ({"model": "transformer"}, "--model transformer is a language model: it needs byte sequences, --dataset pysrc"),
    ({"dataset": "pysrc"}, "--dataset pysrc is text, a next byte to predict at every position: use --model "
                           "transformer, not mlp"),
    ({"model": "transformer", "dataset": "pysrc", "transformer_size": "huge"}, "unknown transformer_size 'huge'"),
    ({"model": "transformer", "dataset": "pysrc", "seq_len": 0}, "--seq_len must be positive"),
    ({"model": "transformer", "dataset": "pysrc", "seq_len": 1 << 17}, "--seq_len must be at most 65536"),
    ({"model": "transformer", "dataset": "pysrc", "transformer_size": "gpt2_small", "seq_len": 1024,
      "batch_size": 64}, "--transformer_size gpt2_small x --seq_len 1024 x --batch_size 64: about"),
])
def test_what_the_transformer_works_with_is_refused_in_one_line(flags, message):
    with pytest.raises(UsageError) as e:
        make_config(**flags)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.unit
def test_its_defaults_are_its_own():
    cfg = make_config(model="transformer", dataset="pysrc")
    assert (cfg.optimizer, cfg.learning_rate, cfg.target_accuracy) == ("adam", 0.002, 0.52)
    assert make_config().target_accuracy == 0.9
    assert make_config(model="transformer", dataset="pysrc", target_accuracy=0.4).target_accuracy == 0.4


@pytest.mark.unit
@pytest.mark.parametrize("size, seq_len", [("tiny", 64), ("tiny", 16)])
def test_the_model_is_the_declared_shape(size, seq_len):
    from common.model.models import build_model, num_parameters
    from common.spec.builtins import TRANSFORMER_SIZES
    from common.spec.memory import transformer_parameters
    cfg = make_config(model="transformer", dataset="pysrc", transformer_size=size, seq_len=seq_len)
    model = build_model(cfg)
    assert num_parameters(model) == transformer_parameters(TRANSFORMER_SIZES[size], 256, seq_len)
    logits = model(np.arange(3 * seq_len).reshape(3, seq_len) % 256, training=False)
    assert tuple(logits.shape) == (3, seq_len, 256)
    # tied: the token table is the output layer too, held once
    assert sum("tokens" in w.name for w in model.trainable_weights) == 1


@pytest.mark.unit
@pytest.mark.parametrize("changed", [0, 7, 15])
def test_a_position_sees_only_the_bytes_before_it(changed):
    """Causal: a byte changed at position ``changed`` moves the logits from there on, none before,
    or the next-byte accuracy would be read off the answer."""
    from common.model.models import build_model
    cfg = make_config(model="transformer", dataset="pysrc", seq_len=16)
    model = build_model(cfg)
    x = np.arange(16).reshape(1, 16) + 32
    y = x.copy()
    y[0, changed] = 200
    a, b = model(x, training=False).numpy(), model(y, training=False).numpy()
    moved = [not np.allclose(a[0, p], b[0, p], atol=1e-6) for p in range(16)]
    assert moved == [p >= changed for p in range(16)]


@pytest.mark.unit
def test_gpt2_small_has_gpt2s_weights():
    """GPT-2 small's 124,439,808 weights (its 50,257-token vocabulary, 1,024 positions), by the formula
    the memory estimate and the projection read, which the built tiny model is held to above."""
    from common.spec.builtins import TRANSFORMER_SIZES
    from common.spec.memory import transformer_parameters
    size = TRANSFORMER_SIZES["gpt2_small"]
    assert transformer_parameters(size, size.vocab, size.context) == 124_439_808


@pytest.mark.unit
def test_the_start_is_seeded_the_same_in_eager_and_graph_code():
    """Every backend builds its own copy (eager, a classic PS's graph, a strategy's scope); attention's
    kernels cloned from one initializer still start apart."""
    import tensorflow as tf
    from common.model.models import build_model
    cfg = make_config(model="transformer", dataset="pysrc", seq_len=16)
    model = build_model(cfg)
    eager = model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(eager, build_model(cfg).get_weights()))
    other = build_model(cfg.replace(seed=7)).get_weights()
    assert not np.array_equal(eager[0], other[0])
    attention = [w.numpy() for w in model.get_layer("block0_attention").trainable_weights if "kernel" in w.name]
    assert len(attention) == 4 and not np.array_equal(attention[0], attention[1])
    g = tf.Graph()
    with g.as_default():
        graph_model = build_model(cfg)
        with tf.compat.v1.Session(graph=g) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            graph = s.run(graph_model.weights)
    assert all(np.array_equal(a, b) for a, b in zip(eager, graph))


@pytest.mark.unit
def test_every_position_is_an_example_of_the_accuracy():
    import tensorflow as tf
    from common.model.models import eval_batch_sums
    labels = np.array([[1, 2, 3], [4, 5, 6]])
    logits = tf.one_hot([[1, 2, 0], [4, 0, 0]], 8)      # 3 of the 6 next bytes right
    loss, correct, count = eval_batch_sums(logits, labels).numpy()
    assert (correct, count) == (3, 6) and loss > 0


# ------------------------------------------------------------------ N workers at b == 1 at N*b
EQUIV = [*SYNC_EQUIV, "--model", "transformer", "--dataset", "pysrc", "--seq_len", "16", "--train_steps", "6",
         "--learning_rate", "0.05", "--probe_steps", "0"]
HVD = os.path.join(REPO, "horovod_train", "main.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-x", "PATH", "-x", "LD_LIBRARY_PATH",
          "-x", "PYTHONPATH", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
TWO = {
    "horovod": lambda out: run([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                                sys.executable, HVD, *EQUIV, "--batch_size", "8", "--train_dir", out], timeout=300),
    "mpi": lambda out: run([*MPIRUN, sys.executable, os.path.join(REPO, "mpi_train", "main.py"), *EQUIV,
                            "--batch_size", "8", "--train_dir", out], timeout=300),
    "mwms": lambda out: py("-m", "mwms_train.launch", "--num_workers", "2", *EQUIV, "--batch_size", "8",
                           "--train_dir", out, timeout=300),
}


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("one") / "run")
    ok(run([sys.executable, HVD, *EQUIV, "--batch_size", "16", "--train_dir", out], timeout=300))
    return out


@pytest.mark.process
@pytest.mark.parametrize("method", sorted(TWO))
def test_two_workers_train_the_transformer_as_one_process_at_twice_the_batch(tmp_path, one_process, method):
    out = str(tmp_path / method)
    ok(TWO[method](out))
    assert_big_batch_equal(out, one_process, model="transformer", dataset="pysrc", seq_len=16)


@pytest.mark.process
def test_sync_ps_trains_the_transformer_as_one_process_at_twice_the_batch(tmp_path, one_process):
    from tests.test_ps import launch, lockstep
    out = str(tmp_path / "ps")
    lockstep(lambda: launch(1, 2, *EQUIV, "--sync", "--batch_size", "8", "--train_dir", out), out)
    assert_big_batch_equal(out, one_process, model="transformer", dataset="pysrc", seq_len=16)


@pytest.mark.process
def test_the_corpus_written_as_text_shards_trains_two_workers_as_one_at_twice_the_batch(tmp_path):
    """hvdps data --dataset pysrc writes the text layout; streamed from it (each record a sequence
    and the byte after it), 2 Horovod ranks at batch 8 end with the weights of one process at 16."""
    data = str(tmp_path / "pysrc")
    r = run([os.path.join(BIN, "hvdps"), "data", "--dataset", "pysrc", "--seq_len", "16", "--shards", "4",
             "--out", data], timeout=300)
    ok(r)
    assert r.stderr == "" and f"--data_dir {data} --model transformer --seq_len 16" in r.stdout, r.stdout + r.stderr
    files = [*EQUIV[:EQUIV.index("--dataset")], "--dataset", "tfrecord", "--data_dir", data,
             *EQUIV[EQUIV.index("--dataset") + 2:]]
    ok(run([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, HVD, *files,
            "--batch_size", "8", "--train_dir", str(tmp_path / "two")], timeout=300))
    ok(run([sys.executable, HVD, *files, "--batch_size", "16", "--train_dir", str(tmp_path / "one")], timeout=300))
    assert_big_batch_equal(str(tmp_path / "two"), str(tmp_path / "one"), model="transformer", dataset="pysrc",
                           seq_len=16)
