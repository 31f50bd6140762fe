"""A model plug-in written with Keras 3 (``import keras``, common/spec/keras3.py): the wrapper in process,
then the worked example trained under every backend that takes it (Horovod, bare MPI, TF2's PS),
the classic PS's one-line refusal, and Horovod's own DistributedGradientTape on raw Keras 3
variables, which only the project's patch to Horovod makes work."""
import json
import os
import re
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import BIN, REPO, py, run, snapshot, row_and_records

keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("Keras 3 is installed from TensorFlow 2.16 on (TF=2.15 has Keras 2)", allow_module_level=True)

MODEL = os.path.join(REPO, "examples", "my_keras3_model.py") + ":build"
DATA = os.path.join(REPO, "examples", "my_data.py") + ":load"
PLUGIN = ["--model", MODEL, "--dataset", DATA, "--epochs", "4", "--log_every", "5"]
HVD = os.path.join(REPO, "horovod_train", "main.py")
MPI = os.path.join(REPO, "mpi_train", "main.py")
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "-bind-to", "none", "--mca", "btl", "self,vader",
          "--mca", "oob_tcp_if_include", "lo", "-x", "PATH", "-x", "PYTHONPATH"]


def _keras3_mlp(regularize=False):
    reg = keras.regularizers.L2(1e-3) if regularize else None
    return keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(8, activation="relu",
                                                                          kernel_regularizer=reg),
                             keras.layers.BatchNormalization(), keras.layers.Dense(3)])


def test_wrapper_trains_the_keras3_variables_themselves():
    """Each tf.Variable the Keras 3 layers read is tracked once, in the Keras 3 order; a step of a
    tf-keras optimizer moves the Keras 3 model's own weights; checkpoints round-trip them."""
    import tensorflow as tf
    from common.spec.keras3 import is_wrapped, keras_of, wrap
    inner = _keras3_mlp(regularize=True)
    model = wrap(inner)
    assert is_wrapped(model) and isinstance(model, tf.keras.Model)
    assert [id(v) for v in model.trainable_variables] == [id(v.value) for v in inner.trainable_variables]
    assert {id(v) for v in model.non_trainable_variables} == {id(v.value) for v in inner.non_trainable_variables}
    assert keras_of(model) == f"keras {keras.__version__}"
    x, y = np.random.RandomState(0).rand(16, 6).astype("float32"), np.arange(16) % 3
    assert len(model.losses) == 1                              # the Keras 3 layer's regularizer
    before = [w.copy() for w in inner.get_weights()]
    opt = tf.keras.optimizers.legacy.SGD(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                                              from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(g is not None for g in grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    moved = [not np.array_equal(a, b) for a, b in zip(before, inner.get_weights())]
    assert any(moved), "the step did not reach the Keras 3 model's weights"
    np.testing.assert_array_equal(model(x).numpy(), inner(x).numpy())


def test_wrapper_checkpoint_round_trip(tmp_path):
    import tensorflow as tf
    from common.spec.keras3 import wrap
    model = wrap(_keras3_mlp())
    ckpt = tf.train.Checkpoint(model=model)
    path = ckpt.save(str(tmp_path / "ckpt"))
    saved = model.get_weights()
    for v in model.trainable_variables:
        v.assign(tf.zeros_like(v))
    ckpt.restore(path).assert_existing_objects_matched()
    for a, b in zip(saved, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_tf_keras_models_stay_unwrapped():
    import tensorflow as tf
    from common.spec.keras3 import is_keras3_model, is_wrapped, keras_of
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    assert not is_keras3_model(model) and not is_wrapped(model)
    assert not keras_of(model).startswith("keras 3")


def _header(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return json.loads(f.readline())


def _trained(run_dir, workers, final=0.90):
    row, curves = row_and_records(run_dir)
    assert row.status == "ok" and row.workers == workers
    assert row.final_test_accuracy >= final, [e["accuracy"] for e in curves["evals"]]
    assert curves["header"]["keras"] == f"keras {keras.__version__}"   # the report says which Keras
    return row


def ok(r):
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.process
@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_keras3_plugin_under_horovod(tmp_path, loop):
    ok(run([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", sys.executable, HVD, *PLUGIN,
            "--loop", loop, "--train_dir", str(tmp_path / "run")], timeout=300))
    _trained(str(tmp_path / "run"), 2)


@pytest.mark.process
def test_keras3_plugin_under_bare_mpi(tmp_path):
    ok(run([*MPIRUN, sys.executable, MPI, *PLUGIN, "--train_dir", str(tmp_path / "run")], timeout=300))
    _trained(str(tmp_path / "run"), 2)


@pytest.mark.process
def test_keras3_plugin_under_tf_all_reduce(tmp_path):
    """MultiWorkerMirroredStrategy mirrors the Keras 3 layers' variables on every worker."""
    ok(py("-m", "mwms_train.launch", "--num_workers", "2", *PLUGIN, "--train_dir", str(tmp_path / "run"),
          timeout=300))
    _trained(str(tmp_path / "run"), 2)
    assert row_and_records(str(tmp_path / "run"))[1]["summary"]["max_weight_divergence"] == 0.0


@pytest.mark.process
def test_keras3_plugin_under_tf2_parameter_servers(tmp_path):
    """ParameterServerStrategy places the Keras 3 layers' variables on the PS tasks."""
    ok(py("-m", "ps_train.launch", "--ps_api", "v2", "--num_ps", "2", "--num_workers", "2", *PLUGIN,
          "--epochs", "3", "--train_dir", str(tmp_path / "run"), timeout=300))
    # async: as test_plugins' async bound, which 3 epochs clear by a margin (0.93 on this machine)
    _trained(str(tmp_path / "run"), 2, final=0.80)
    placement = _header(str(tmp_path / "run"))["placement"]
    assert {d for devices in placement.values() for d in devices} == {
        "/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"}


@pytest.mark.process
@pytest.mark.parametrize("entry", ["launcher", "trainer", "compare"])
def test_classic_ps_refuses_keras3_in_one_line(tmp_path, entry):
    """Before any task starts (launcher, compare) or before the task joins (a per-role trainer)."""
    out = tmp_path / "out"
    argv = {"launcher": [sys.executable, "-m", "ps_train.launch", "--num_workers", "2", "--sync", *PLUGIN,
                         "--train_dir", str(out)],
            "trainer": [sys.executable, os.path.join(REPO, "ps_train", "main.py"), "--job_name", "worker",
                        "--task_index", "0", "--ps_hosts", "127.0.0.1:1", "--worker_hosts", "127.0.0.1:2",
                        *PLUGIN, "--train_dir", str(out)],
            "compare": [os.path.join(BIN, "hvdps"), "compare", "--workers", "1", "--backends", "horovod,ps", *PLUGIN,
                        "--no-progress", "--out", str(out)]}[entry]
    before = snapshot(tmp_path)
    r = run(argv, timeout=120)
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "a Keras 3 model (import keras) cannot train under the classic parameter servers" in errors[0]
    assert "--ps_api v2" in errors[0] and "Traceback" not in r.stderr
    if entry != "trainer":
        assert snapshot(tmp_path) == before, "a refused command wrote files"


HOROVOD_TAPE = textwrap.dedent('''
    """Horovod's own API on a Keras 3 model, as its tensorflow2 examples use it (no hvdps code)."""
    import keras
    import numpy as np
    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())        # different starting weights on each rank
    model = keras.Sequential([keras.layers.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    opt = keras.optimizers.SGD(0.05)
    x = np.random.RandomState(hvd.rank()).rand(32, 6).astype("float32")
    y = np.arange(32) % 3

    @tf.function
    def step(first):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    for i in range(5):
        step(i == 0)
    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    spread = hvd.allreduce(flat, op=hvd.Max) - hvd.allreduce(flat, op=hvd.Min)
    print(f"rank {hvd.rank()} max spread {float(np.max(np.abs(spread))):.3g}", flush=True)
''')


@pytest.mark.process
def test_horovods_own_tape_takes_keras3_variables(tmp_path):
    """patches/horovod-0.28.1.patch: DistributedGradientTape keys Keras 3 variables by their
    tf.Variable (the release calls .ref(), which they lack); after 5 steps the ranks agree. The tape
    is the same under either controller: horovodrun's default (MPI) here, Gloo in test_horovod.py."""
    script = tmp_path / "tape.py"
    script.write_text(HOROVOD_TAPE)
    r = ok(run([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", sys.executable,
                str(script)], timeout=300))
    spreads = [float(s) for s in re.findall(r"rank \d max spread ([0-9.e+-]+)", r.stdout)]
    assert len(spreads) == 2 and max(spreads) < 1e-6, r.stdout[-2000:]


@pytest.mark.parametrize("kinds, expected", [
    (["tf-keras 2.21.0", "tf-keras 2.21.0"], "tf-keras 2.21.0 (every run)"),
    (["keras 3.15.1", "tf-keras 2.21.0"], "keras 3.15.1: run0; tf-keras 2.21.0: run1"),
])
def test_report_says_which_keras_built_each_run(kinds, expected):
    from hvdps.measure.runs import environment_of
    from hvdps.measure.rows import Curves, RunRow
    from common.formats.schemas import Header
    rows = [RunRow(run_dir=f"/x/runs/run{i}", curves=Curves(header=Header(
        type="header", backend="horovod", mode="sync", world_size=1, keras=k, versions={"keras": "3.15.1"})))
            for i, k in enumerate(kinds)]
    assert environment_of(rows)["model built with"] == expected
