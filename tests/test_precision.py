"""--precision: Keras' mixed-precision policy under every method. The model computes in bfloat16 or
float16 with float32 variables, its loss in float32; under mixed_float16 the loss is scaled (Keras'
LossScaleOptimizer in the eager loops, TensorFlow's v1 one in the classic PS graph), the gradients that
would vanish in float16 survive, a non-finite step is skipped and the scale moves, under each method
that takes it; TF2's ParameterServerStrategy, which cannot, is refused in one line."""
import json
import os

import numpy as np
import pytest

from common.base.errors import UsageError
from common.spec.config import PRECISIONS, make_config
from tests.conftest import BIN, read_records, run


@pytest.mark.unit
@pytest.mark.parametrize("flags, message", [
    ({"precision": "float16"}, "unknown precision 'float16' (valid: float32, mixed_bfloat16, mixed_float16)"),
    ({"precision": "bf16"}, "unknown precision 'bf16'"),
    ({"precision": "mixed_float16", "loss_scale_growth_steps": 0}, "--loss_scale_growth_steps must be positive"),
])
def test_a_bad_precision_is_one_line(flags, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_config(**flags)


@pytest.mark.unit
@pytest.mark.parametrize("precision, compute", [("float32", "float32"), ("mixed_bfloat16", "bfloat16"),
                                                ("mixed_float16", "float16")])
@pytest.mark.parametrize("model, dataset", [("mlp", "digits"), ("transformer", "pysrc")])
def test_the_model_computes_in_its_precision_and_keeps_float32_weights(precision, compute, model, dataset):
    import tensorflow as tf
    from common.model.models import build_model, total_loss
    cfg = make_config(model=model, dataset=dataset, precision=precision, batch_size=4, seq_len=16)
    built = build_model(cfg)
    assert tf.keras.mixed_precision.global_policy().name == "float32"      # the process's policy is put back
    assert all(v.dtype == tf.float32 for v in built.trainable_variables)  # what every method exchanges
    assert {layer.compute_dtype for layer in built.layers if layer.trainable_weights} == {compute}
    x = np.zeros((4, 16), np.int32) if model == "transformer" else np.zeros((4, 8, 8, 1), np.float32)
    logits = built(x, training=True)
    assert logits.dtype.name == compute
    assert total_loss(built, np.zeros(logits.shape[:-1], np.int32), logits).dtype == tf.float32


@pytest.mark.unit
@pytest.mark.parametrize("precision, scaled", [("float32", False), ("mixed_bfloat16", False), ("mixed_float16", True)])
def test_only_float16_scales_the_loss(precision, scaled):
    from common.model.models import make_optimizer
    from common.model.optim import is_loss_scaled, loss_scale_of, loss_scaled
    cfg = make_config(precision=precision, loss_scale_growth_steps=7)
    optimizer = loss_scaled(cfg, make_optimizer(cfg, 0.01))
    assert is_loss_scaled(optimizer) is scaled
    assert loss_scale_of(optimizer) == (2.0 ** 15 if scaled else None)
    if scaled:
        assert optimizer.dynamic_growth_steps == 7
        v1 = loss_scaled(cfg, make_optimizer(cfg, 0.01, api="v1"), api="v1")
        assert type(v1).__name__ == "EveryStepCounted"


def _tiny(tf, factor):
    """A model whose logits are its Dense layer's output times ``factor``: a small factor makes every
    gradient inside the layer that much smaller (below float16's smallest subnormal, 6e-8, at 1e-7),
    a large one that much larger."""
    from common.model.models import precision_policy
    with precision_policy(tf, "mixed_float16"):
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)),
                                     tf.keras.layers.Dense(10, kernel_initializer="glorot_uniform"),
                                     tf.keras.layers.Lambda(lambda t: t * factor)])
    return model


def _train(tf, model, optimizer, steps):
    from common.model.models import train_step_fn
    step = tf.function(train_step_fn(model, optimizer), autograph=False)
    rng = np.random.RandomState(0)
    start = [w.copy() for w in model.get_weights()]
    for _ in range(steps):
        step(rng.rand(32, 8).astype(np.float32), rng.randint(0, 10, 32).astype(np.int32))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), start))
    return moved, all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.unit
def test_gradients_that_vanish_in_float16_train_once_the_loss_is_scaled():
    import tensorflow as tf
    from common.model.models import make_optimizer
    from common.model.optim import loss_scaled
    cfg = make_config(precision="mixed_float16", optimizer="sgd", learning_rate=1e4)
    plain, _ = _train(tf, _tiny(tf, 1e-7), make_optimizer(cfg, 1e4), 3)
    scaled, finite = _train(tf, _tiny(tf, 1e-7), loss_scaled(cfg, make_optimizer(cfg, 1e4)), 3)
    assert plain == 0.0                           # every float16 gradient flushed to zero: nothing learns
    assert scaled > 1e-4 and finite               # scaled by 2**15 they survive, and are unscaled in float32


@pytest.mark.unit
def test_a_step_that_overflows_is_skipped_and_the_scale_comes_down():
    import tensorflow as tf
    from common.model.models import make_optimizer
    from common.model.optim import loss_scale_of, loss_scaled
    cfg = make_config(precision="mixed_float16", optimizer="sgd", learning_rate=1e-6)
    optimizer = loss_scaled(cfg, make_optimizer(cfg, 1e-6))
    moved, finite = _train(tf, _tiny(tf, 1e3), optimizer, 12)    # x 2**15: past float16's 65,504
    assert loss_scale_of(optimizer) < 2 ** 15 and finite and moved > 0    # halved until it fits, then trained


def _scales(run_dir):
    return [r["loss_scale"] for r in read_records(os.path.join(run_dir, "metrics.jsonl"))
            if r["type"] == "step" and "loss_scale" in r]


# Every method that takes mixed_float16, through hvdps compare as a user runs it: the loss scale doubles
# after every 4 finite steps and halves on an overflow, so over 30 steps it must move.
SCALED = ("horovod", "mpi", "localsgd", "gossip", "mwms", "ps:sync", "ps:async")


@pytest.mark.process
def test_the_loss_scale_moves_during_training_under_every_method_that_takes_it(tmp_path):
    out = tmp_path / "cmp"
    r = run([os.path.join(BIN, "hvdps"), "compare", "--workers", "2", "--backends", ",".join(SCALED),
             "--precision", "mixed_float16", "--loss_scale_growth_steps", "4", "--train_steps", "30",
             "--log_every", "5", "--probe_steps", "5", "--no_progress", "--out", str(out)], timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.load(open(out / "results.json"))["rows"]
    assert len(rows) == len(SCALED) and all(x["status"] == "ok" for x in rows)
    for x in rows:
        scales = _scales(x["run_dir"])
        assert len(scales) >= 3 and len(set(scales)) > 1, (x["run_dir"], scales)
        assert all(np.log2(s) == int(np.log2(s)) for s in scales)      # doubled or halved, nothing else
        config = json.load(open(os.path.join(x["run_dir"], "config.json")))
        assert config["precision"] == "mixed_float16"


@pytest.mark.process
def test_bfloat16_trains_under_the_strategy_and_the_classic_graph(tmp_path):
    """The two paths the eager loops do not share: TF2's ParameterServerStrategy and the classic PS's
    graph, whose large variables stay whole under a mixed policy (Keras' AutoCastVariable takes no
    partitioned one)."""
    out = tmp_path / "cmp"
    r = run([os.path.join(BIN, "hvdps"), "compare", "--workers", "2", "--backends", "ps2,ps:async", "--num_ps", "2",
             "--precision", "mixed_bfloat16", "--train_steps", "30", "--log_every", "10", "--probe_steps", "5",
             "--no_progress", "--out", str(out)], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.load(open(out / "results.json"))["rows"]
    assert {x["backend"] for x in rows} == {"ps", "ps2"} and all(x["status"] == "ok" for x in rows)
    for x in rows:
        assert x["final_test_accuracy"] > 0.3 and not _scales(x["run_dir"])   # trained; nothing scaled


@pytest.mark.unit
@pytest.mark.parametrize("argv", [
    ["compare", "--dry_run", "--workers", "2", "--backends", "mpi,ps2", "--precision", "mixed_float16"],
    ["compare", "--dry_run", "--workers", "2", "--backends", "ps2", "--precision", "mixed_float16", "--out", "x"],
])
def test_the_strategy_that_cannot_scale_a_loss_is_refused_before_any_task(tmp_path, argv):
    r = run([os.path.join(BIN, "hvdps"), *argv], cwd=str(tmp_path), timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: --precision mixed_float16 cannot run under TensorFlow 2's "
                               "ParameterServerStrategy (ps2)")
    assert not os.listdir(tmp_path)


@pytest.mark.unit
def test_the_trainer_refuses_it_too():
    from ps_train.cluster import check_precision
    for precision in PRECISIONS:
        check_precision("v1", precision)
    check_precision("v2", "mixed_bfloat16")
    with pytest.raises(UsageError, match="ParameterServerStrategy"):
        check_precision("v2", "mixed_float16")


# --precision auto, on hardware described by its flags: the policy, and whether it is emulated
AMD_AVX2 = {"avx2", "fma"}                                  # the 2-core EPYC of 0.25x bfloat16
AMD_BF16 = {"avx2", "avx512f", "avx512_bf16"}               # bfloat16 dot products, no AMX
INTEL_AMX = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}


@pytest.mark.unit
@pytest.mark.parametrize("flags, gpus, policy, words", [
    (AMD_AVX2, (), "float32", "mixed_bfloat16 would be emulated"),
    (AMD_BF16, (), "float32", "but no AMX, on which bfloat16 measured no faster than float32"),
    (INTEL_AMX, (), "mixed_bfloat16", "bfloat16 matrix kernels on AMX"),
    (AMD_AVX2, ((8, 0),), "mixed_bfloat16", "GPU compute capability 8.0"),
    (AMD_AVX2, ((7, 0), (8, 6)), "mixed_float16", "no bfloat16 below 8.0"),
    (AMD_AVX2, ((6, 1),), "float32", "no tensor cores"),
])
def test_auto_takes_a_mixed_policy_only_where_the_hardware_gains_from_it(flags, gpus, policy, words):
    from common.spec.precision import Hardware, choose
    choice = choose("auto", Hardware("AMD EPYC", frozenset(flags), gpus))
    assert (choice.policy, choice.asked, choice.emulated) == (policy, "auto", False)
    assert choice.why.startswith(f"--precision auto chose {policy}: ") and words in choice.why


@pytest.mark.unit
@pytest.mark.parametrize("asked, flags, gpus, emulated", [
    ("mixed_bfloat16", AMD_AVX2, (), True),
    ("mixed_bfloat16", AMD_BF16, (), False),
    ("mixed_float16", AMD_BF16, (), True),
    ("mixed_float16", AMD_AVX2, ((7, 5),), False),
    ("mixed_bfloat16", AMD_AVX2, ((7, 5),), True),
    ("float32", AMD_AVX2, (), False),
])
def test_a_policy_the_flag_names_is_taken_and_said_emulated_where_the_hardware_lacks_it(asked, flags, gpus, emulated):
    from common.spec.precision import Hardware, choose
    choice = choose(asked, Hardware("AMD EPYC", frozenset(flags), gpus))
    assert (choice.policy, choice.emulated) == (asked, emulated)
    assert ("emulated" in choice.why) is emulated


@pytest.mark.unit
@pytest.mark.parametrize("flags, policy", [(AMD_AVX2, "float32"), (INTEL_AMX, "mixed_bfloat16")])
def test_the_flag_defaults_to_auto_and_the_config_holds_the_policy_it_chose(monkeypatch, flags, policy):
    from common.spec import precision
    from common.spec.config import build_parser, from_args
    monkeypatch.setattr(precision, "hardware", lambda: precision.Hardware("cpu", frozenset(flags)))
    cfg = from_args(build_parser("t").parse_args([]))
    assert (cfg.precision, cfg.precision_auto) == (policy, True)
    assert precision.of_config(cfg).why.startswith(f"--precision auto chose {policy}")
    given = from_args(build_parser("t").parse_args(["--precision", "mixed_bfloat16"]))
    assert (given.precision, given.precision_auto) == ("mixed_bfloat16", False)
    assert precision.of_config(given).emulated is (policy == "float32")


@pytest.mark.unit
def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path):
    from common.spec.precision import _cpu
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC  7B13\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                    "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert _cpu(str(info)) == ("AMD EPYC 7B13", frozenset({"fpu", "avx2", "avx512_bf16"}))
    assert _cpu(str(tmp_path / "missing")) == ("", frozenset())
