"""Your model and your data: ``--model`` / ``--dataset`` given as ``module:function`` or ``file.py:function``.

The contract (docs/plugins.md):

- model: ``build(cfg, input_shape, num_classes) -> tf.keras.Model`` or a Keras 3
  ``keras.Model`` (``import keras``; common/spec/keras3.py), uncompiled, producing
  logits of shape (batch, num_classes). hvdps adds the optimizer, the loss and
  the distribution.
- dataset: ``load(cfg) -> (x_train, y_train, x_test, y_test)`` NumPy arrays:
  x of shape (N, ...) (N, H, W gets a channel axis), y integer class ids in
  0..num_classes-1. hvdps shards them exactly like the built-in data sets, so
  the big-batch equivalence of synchronous training still holds.

Anything wrong with a plug-in is a one-line usage error that names what was
expected, raised before any process joins a job.
"""
import contextlib
import importlib
import importlib.util
import os
import random
import signal
import sys
import threading
import time

import numpy as np

from common.base.errors import UsageError
from common.spec.datasets import Pipelines
from common.spec import keras3
from common.base import procs   # procs.machine_memory() read at call time: tests set the machine's memory

_budget = None       # (deadline on the monotonic clock, seconds, the flag that set them)


class _Expired(BaseException):
    """Raised in a plug-in's frame when its time is up: a BaseException, so the plug-in's own
    ``except Exception`` cannot swallow it."""


def bound_plugins(seconds, flag):
    """From here on, every plug-in import and call in this process shares ``seconds`` (the run's
    --run_timeout): a plug-in that never returns is stopped and named in one line,
    not left to hang the launcher before any job starts. 0 or None: unbounded."""
    global _budget
    _budget = (time.monotonic() + seconds, seconds, flag) if seconds else None


@contextlib.contextmanager
def plugins_bounded(seconds, flag):
    """``bound_plugins`` for one command's life, the budget before it put back after: an entry point
    that may run in-process (hvdps project in a test or a notebook) leaves no deadline behind."""
    global _budget
    previous = _budget
    bound_plugins(seconds, flag)
    try:
        yield
    finally:
        _budget = previous


@contextlib.contextmanager
def _within_budget(spec, flag, what):
    if _budget is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    deadline, seconds, budget_flag = _budget
    late = UsageError(f"{flag} {spec}: {what} did not return within {seconds:g} s ({budget_flag}); "
                      f"a plug-in must not wait on anything that may never come")
    left = deadline - time.monotonic()
    if left <= 0:
        raise late

    def expire(*_):
        raise _Expired()
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    except _Expired:
        raise late from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def is_plugin(spec):
    return isinstance(spec, str) and ":" in spec


def load_callable(spec, flag):
    """``pkg.mod:fn`` or ``path/to/file.py:fn`` -> the callable, or a UsageError saying what is missing."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise UsageError(f"{flag} {spec}: expected module:function or path/to/file.py:function")
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise UsageError(f"{flag} {spec}: no such file {target}")
        name = "hvdps_plugin_" + os.path.splitext(os.path.basename(target))[0]
        try:
            module_spec = importlib.util.spec_from_file_location(name, os.path.abspath(target))
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            with _within_budget(spec, flag, f"importing {target}"):
                module_spec.loader.exec_module(module)
        except UsageError:
            raise
        except SystemExit as exc:
            raise UsageError(f"{flag} {spec}: importing {target} called sys.exit({exc.code!r})")
        except Exception as exc:   # the user's file: any error is theirs to fix, said in one line
            raise UsageError(f"{flag} {spec}: importing {target} failed: {type(exc).__name__}: {exc}")
    else:
        try:
            with _within_budget(spec, flag, f"importing {target}"):
                module = importlib.import_module(target)
        except UsageError:
            raise
        except ModuleNotFoundError as exc:
            raise UsageError(f"{flag} {spec}: no module named {exc.name!r} (is it on PYTHONPATH?)")
        except Exception as exc:
            raise UsageError(f"{flag} {spec}: importing {target} failed: {type(exc).__name__}: {exc}")
    fn = getattr(module, attr, None)
    if fn is None:
        raise UsageError(f"{flag} {spec}: {target} has no attribute {attr!r}")
    if not callable(fn):
        raise UsageError(f"{flag} {spec}: {attr} is a {type(fn).__name__}, expected a function")
    return fn


def call(fn, spec, flag, *args):
    try:
        with _within_budget(spec, flag, "the plug-in"):
            return fn(*args)
    except UsageError:
        raise
    except SystemExit as exc:    # exit 0 from a plug-in would end the job "successfully" with no run
        raise UsageError(f"{flag} {spec}: the plug-in called sys.exit({exc.code!r}) instead of returning")
    except Exception as exc:
        raise UsageError(f"{flag} {spec}: the plug-in raised {type(exc).__name__}: {exc}")


PIPELINE_KEYS = ("train", "test", "train_examples", "input_shape", "classes")


def pipelines_of(out, spec):
    """A plug-in's dict of tf.data pipeline factories as the typed record (common.spec.datasets.Pipelines)."""
    flag = f"--dataset {spec}"
    keys = set(out)
    if keys != set(PIPELINE_KEYS):
        missing, extra = sorted(set(PIPELINE_KEYS) - keys), sorted(map(str, keys - set(PIPELINE_KEYS)))
        raise UsageError(f"{flag}: a dict of pipelines needs exactly the keys {', '.join(PIPELINE_KEYS)}"
                         + (f"; missing {', '.join(missing)}" if missing else "")
                         + (f"; unknown {', '.join(extra)}" if extra else ""))
    for name in ("train", "test"):
        if not callable(out[name]):
            raise UsageError(f"{flag}: '{name}' is {type(out[name]).__name__}; expected a function "
                             f"(input context) -> tf.data.Dataset of (x, y) batches")
    count, classes, shape = out["train_examples"], out["classes"], out["input_shape"]
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1 << 40:
        raise UsageError(f"{flag}: train_examples must be an integer in [1, 2**40], got {count!r}")
    if isinstance(classes, bool) or not isinstance(classes, int) or not 1 <= classes <= 1 << 24:
        raise UsageError(f"{flag}: classes must be an integer in [1, 2**24], got {classes!r}")
    if not isinstance(shape, (tuple, list)) or not 1 <= len(shape) <= 8 or any(
            isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 1 << 20 for d in shape):
        raise UsageError(f"{flag}: input_shape must be 1 to 8 sizes in [1, 2**20] (one example's shape), got {shape!r}")
    return Pipelines(train=out["train"], test=out["test"], train_examples=count, input_shape=tuple(shape),
                     classes=classes, source=spec)


def load_dataset(cfg):
    """A dataset plug-in's arrays, checked and in the layout the built-ins use; or, for a plug-in that
    returns a dict of tf.data pipeline factories, those as common.spec.datasets.Pipelines."""
    fn = load_callable(cfg.dataset, "--dataset")
    out = call(fn, cfg.dataset, "--dataset", cfg)
    if isinstance(out, dict):
        return pipelines_of(out, cfg.dataset)
    expected = "a tuple (x_train, y_train, x_test, y_test) of NumPy arrays, or a dict of tf.data pipelines"
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise UsageError(f"--dataset {cfg.dataset}: returned {type(out).__name__}, expected {expected}")
    try:
        x_train, y_train, x_test, y_test = (np.asarray(a) for a in out)
    except Exception as exc:
        raise UsageError(f"--dataset {cfg.dataset}: returned something that is not arrays ({exc}); "
                         f"expected {expected}")
    arrays = {}                  # values (dtypes, NaN, label range) are checked in common.inputs.data.check_arrays
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if x.ndim < 2:
            raise UsageError(f"--dataset {cfg.dataset}: x_{split} has shape {x.shape}; expected (N, features...)")
        arrays[split] = (x[..., None] if x.ndim == 3 else x), y
    if arrays["train"][0].shape[1:] != arrays["test"][0].shape[1:]:
        raise UsageError(f"--dataset {cfg.dataset}: train examples are {arrays['train'][0].shape[1:]}, "
                         f"test examples {arrays['test'][0].shape[1:]}; expected the same shape")
    return (*arrays["train"], *arrays["test"])


def seed_everything(tf, seed):
    """What ``tf.keras.utils.set_random_seed`` does, less the seed generator it gives Keras'
    initializers: tf-keras 2.18 draws from that generator with ``randint(1, 1e9)``, a float bound
    Python 3.12 refuses (TypeError on the first layer built). Without it, initializers given no
    seed draw theirs from the ``random`` module, seeded here, so a build is as reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)


def build_model(cfg, input_shape, num_classes, check_step=True):
    """A model plug-in's model, checked: a Keras model taking ``input_shape`` and giving ``num_classes`` logits."""
    import tensorflow as tf
    fn = load_callable(cfg.model, "--model")
    seed_everything(tf, cfg.seed)
    keras3.seed_keras3(cfg.seed)
    model = call(fn, cfg.model, "--model", cfg, tuple(input_shape), num_classes)
    if keras3.is_keras3_model(model) and not isinstance(model, tf.keras.Model):
        model = keras3.wrap(model)          # Keras 3: trained through its tf.Variables (common/spec/keras3.py)
    if not isinstance(model, tf.keras.Model):
        raise UsageError(f"--model {cfg.model}: returned {type(model).__name__}, expected an uncompiled "
                         f"Keras model (tf.keras, or Keras 3's keras.Model)")
    try:
        out = model(tf.zeros((1, *input_shape)), training=False)
    except Exception as exc:
        raise UsageError(f"--model {cfg.model}: the model does not take inputs of shape {tuple(input_shape)}: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if not tf.is_tensor(out):
        kind = f"{len(out)} outputs" if isinstance(out, (list, tuple, dict)) else type(out).__name__
        raise UsageError(f"--model {cfg.model}: the model returns {kind}; expected one tensor of logits")
    if tuple(out.shape) != (1, num_classes):
        raise UsageError(f"--model {cfg.model}: the model outputs shape {tuple(out.shape)} for one example; "
                         f"expected (1, {num_classes}) logits")
    if not out.dtype.is_floating:
        raise UsageError(f"--model {cfg.model}: the model outputs {out.dtype.name} logits; expected floating-point "
                         f"logits (an integer output has no gradient)")
    if not model.trainable_weights:
        raise UsageError(f"--model {cfg.model}: the model has no trainable weights; there is nothing to train")
    check_memory_of(model, cfg)
    # The classic PS builds its graph here, and a strategy's variables (MWMS, PS v2: ``check_step``
    # False) are updated only in its replica context: there the strategy's own first step is this check.
    if check_step and tf.executing_eagerly():
        check_training_step(model, cfg, input_shape, num_classes)
    return model


def _cause(exc):
    """The plug-in's own words: Keras puts "Exception encountered when calling layer ..." first and
    the error it caught on a later line."""
    lines = [l.strip() for l in str(exc).splitlines() if l.strip()]
    own = [l for l in lines if not l.startswith(("Exception encountered when calling", "Call arguments received",
                                                 "•"))]
    return (own or lines or [""])[0]


def check_memory_of(model, cfg):
    """A model too large for this machine: refused with the estimate (weights, gradient, two optimizer
    slots and a broadcast copy: 5 x 4 bytes a parameter), not left to the OOM killer mid-job."""
    need, have = 20 * model.count_params(), procs.machine_memory()
    if have and need > have:
        raise UsageError(f"--model {cfg.model}: {model.count_params():,} parameters need about {need / 2**30:,.1f} "
                         f"GiB per process (weights, gradient, optimizer slots, a copy); this machine has "
                         f"{have / 2**30:.1f} GiB")


def check_training_step(model, cfg, input_shape, num_classes):
    """What every step does, once, on a batch of 2 before any process joins a job: the forward pass in
    training mode, the loss and the gradient. A model that fails only in training mode (dropout,
    a training-only branch), whose output depends on the batch size, or from whose outputs no
    gradient reaches a weight is named here in one line, not by a traceback mid-job. Its
    non-trainable state (batch-norm statistics) is put back as it was."""
    import tensorflow as tf
    state = [w.numpy() for w in model.non_trainable_weights]
    try:
        with tf.GradientTape() as tape:
            out = model(tf.zeros((2, *input_shape)), training=True)
            if tuple(out.shape) != (2, num_classes):
                raise UsageError(f"--model {cfg.model}: the model outputs shape {tuple(out.shape)} for a batch of 2 "
                                 f"in training mode; expected (2, {num_classes}): the output must follow the batch")
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                tf.zeros((2,), tf.int32), tf.cast(out, tf.float32), from_logits=True))
        grads = tape.gradient(loss, model.trainable_weights)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"--model {cfg.model}: the model fails in training mode: {type(exc).__name__}: "
                         f"{_cause(exc)}")
    finally:
        for w, value in zip(model.non_trainable_weights, state):
            w.assign(value)
    if all(g is None for g in grads):
        raise UsageError(f"--model {cfg.model}: no gradient reaches the model's weights from its outputs "
                         f"(a stop_gradient, an integer cast or a constant output); there is nothing to train")
