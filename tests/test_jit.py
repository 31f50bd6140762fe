"""--jit_compile: the training step compiled by XLA where a method's exchange can be compiled with it
(local SGD and gossip exchange weights between steps, outside the compiled step), and one line, before
any task starts, from each method whose exchange runs inside the step with no XLA kernel."""
import json
import os

import numpy as np
import pytest

from common.base.errors import UsageError
from common.spec.config import make_config
from tests.conftest import BIN, run

# method -> the words its one line must hold: the cause, not just "cannot"
REFUSED = {
    "horovod": "Horovod as built here has no XLA ops (HOROVOD_ENABLE_XLA_OPS)",
    "mpi": "bare MPI all-reduces inside the training step through tf.numpy_function",
    "mwms": "TensorFlow's collective all-reduce",
    "ps:async": "the classic PS (ps) trains a TF1 graph",
    "ps2": "TensorFlow 2's ParameterServerStrategy (ps2) keeps the variables on the PS tasks",
}
TAKEN = ("localsgd:4", "gossip")


@pytest.mark.unit
@pytest.mark.parametrize("backend, words", sorted(REFUSED.items()))
def test_a_method_that_cannot_compile_its_step_is_refused_in_one_line(tmp_path, backend, words):
    r = run([os.path.join(BIN, "hvdps"), "compare", "--dry_run", "--workers", "2", "--backends", f"localsgd:4,{backend}",
             "--jit_compile", "true", "--out", "x"], cwd=str(tmp_path), timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: --jit_compile: ") and words in lines[0], lines[0]
    assert not os.listdir(tmp_path)                              # nothing started, nothing written


@pytest.mark.unit
@pytest.mark.parametrize("backend", TAKEN)
def test_the_methods_that_take_it_plan_it(tmp_path, backend):
    r = run([os.path.join(BIN, "hvdps"), "compare", "--dry_run", "--workers", "2", "--backends", backend,
             "--jit_compile", "true"], cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--jit_compile true" in r.stdout


@pytest.mark.unit
def test_the_trainers_refuse_it_too():
    """The same line from a trainer started by hand (mpirun ... mpi_train/main.py, ps_train.launch)."""
    from common.trainer.backend import check_jit
    from horovod_train.backend import HorovodBackend, xla_ops_built
    from mpi_train.backend import MPIBackend
    from ps_train.cluster import jit_refusal
    assert xla_ops_built() is False                              # a CPU build: horovod/tensorflow/xla_mpi_ops.cc is GPU-only
    for backend in (MPIBackend(), HorovodBackend()):
        check_jit(make_config(), backend)                        # not asked: nothing to refuse
        with pytest.raises(UsageError, match="^--jit_compile: "):
            check_jit(make_config(jit_compile=True), backend)
    assert "TF1 graph" in jit_refusal("v1") and "ParameterServerStrategy" in jit_refusal("v2")
    with pytest.raises(UsageError, match="^--jit_compile: the classic PS"):
        from ps_train.main import make_parser
        from ps_train.cluster import check_ps_flags
        check_ps_flags(make_parser().parse_args(["--jit_compile", "true"]))


@pytest.mark.unit
def test_xla_compiles_the_transformers_step_to_the_same_loss():
    """The step every method traces (train_step_fn), the transformer's attention included, compiled by
    XLA: the same loss and weights as TensorFlow's own kernels, to float32 rounding."""
    import tensorflow as tf
    from common.model.models import build_model, make_optimizer, train_step_fn
    cfg = make_config(model="transformer", dataset="pysrc", batch_size=4, seq_len=16)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (4, 16)).astype(np.int32)
    y = rng.integers(0, 256, (4, 16)).astype(np.int32)
    results = []
    for jit in (False, True):
        tf.keras.utils.set_random_seed(7)
        model = build_model(cfg)
        step = tf.function(train_step_fn(model, make_optimizer(cfg, 0.01)), autograph=False, jit_compile=jit)
        losses = [float(step(x, y)) for _ in range(3)]
        results.append((losses, model.get_weights()))
        if jit:
            assert "HloModule" in step.experimental_get_compiler_ir(x, y)(stage="hlo")   # XLA's, whole
    (plain, w0), (compiled, w1) = results
    np.testing.assert_allclose(plain, compiled, rtol=1e-4)
    for a, b in zip(w0, w1):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.process
def test_the_methods_that_take_it_train_compiled(tmp_path):
    out = tmp_path / "cmp"
    r = run([os.path.join(BIN, "hvdps"), "compare", "--workers", "2", "--backends", ",".join(TAKEN),
             "--jit_compile", "true", "--train_steps", "120", "--log_every", "20", "--probe_steps", "5",
             "--no_progress", "--out", str(out)], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = json.load(open(out / "results.json"))
    rows = results["rows"]
    assert len(rows) == len(TAKEN) and all(x["status"] == "ok" for x in rows)
    assert list(results["config"]) == ["mlp xla"]                 # its workload kept apart from a plain run's
    assert {x["model"] for x in rows} == {"mlp xla"}              # in every table and panel too
    for x in rows:
        assert x["final_test_accuracy"] > 0.5, x
        config = json.load(open(os.path.join(x["run_dir"], "config.json")))
        assert config["jit_compile"] is True
