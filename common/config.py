"""The one run configuration both backends share.

The comparison is only fair if both trainers read the same flags into the same
frozen object and save it next to their results, so a reader can check that two
runs really trained the same model on the same data with the same batch.
"""
import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Optional, Tuple

from common.errors import UsageError

MODELS = ("mlp", "cnn", "rec", "resnet50", "resnet101", "inception_v3", "vgg16", "mobilenet_v2")
# Keras applications (weights=None): the models of Horovod's and tf_cnn_benchmarks' published
# scaling tables, with the smallest input side each accepts.
KERAS_APPLICATIONS = {"resnet50": 32, "resnet101": 32, "inception_v3": 75, "vgg16": 32, "mobilenet_v2": 32}
DATASETS = ("digits", "mnist", "synthetic", "clicks")
# (optimizer, learning rate) when none is given. Momentum SGD at 0.05 x workers diverges for the
# CNN on 28x28 data from 2 workers on (0.35 / 0.07 accuracy at 2 workers, 0.10 at 4) and leaves the
# MLP at 0.40 with 4 async PS workers; Adam at these rates trains both to >= 0.9 at 1 and 4
# workers on 28x28 data (the MLP at 4 on 8x8) under every backend (tests/test_defaults.py). The MLP's 0.0025
# rather than 0.005: with 4 oversubscribed async PS workers (stale gradients) 0.005 ended 5 epochs
# at 0.897-0.964 over 9 runs on 28x28 data, 0.0025 at 0.933-0.958 over 8.
# rec: plain SGD, whose update of an embedding table touches only the rows a batch looked up (Adam's and
# momentum's slots decay every row of the table every step, which makes the update dense).
MODEL_DEFAULTS = {"mlp": ("adam", 0.0025), "cnn": ("adam", 0.001), "rec": ("sgd", 0.5), "*": ("momentum", 0.05)}
DEFAULTS_HELP = ("per model: mlp adam at 0.0025, cnn adam at 0.001, rec sgd at 0.5; the Keras applications "
                 "and plug-ins momentum 0.9 at 0.05")
OPTIMIZERS = ("sgd", "momentum", "adam")


@dataclasses.dataclass(frozen=True)
class Config:
    model: str = "mlp"
    dataset: str = "digits"
    data_dir: Optional[str] = None
    batch_size: int = 32                    # per worker / per rank
    learning_rate: Optional[float] = None   # before any world-size scaling; None: per model (MODEL_DEFAULTS)
    optimizer: Optional[str] = None         # None: per model (MODEL_DEFAULTS)
    momentum: float = 0.9
    scale_lr: bool = True                   # lr *= world size (Goyal et al.)
    lr_warmup_epochs: float = 1.0           # linear warm-up to the scaled lr
    epochs: int = 5
    train_steps: int = 0                    # >0: stop after this many steps, overrides epochs
    hidden_units: int = 100
    seed: int = 42
    train_dir: str = "runs/latest"
    target_accuracy: float = 0.9
    log_every: int = 10
    warmup_steps: int = 5                   # excluded from throughput figures
    image_shape: Tuple[int, ...] = (28, 28, 1)  # synthetic data only
    num_classes: int = 10                   # synthetic data only
    synthetic_samples: int = 2048
    embedding_rows: int = 100000            # rec: rows of each categorical feature's embedding table
    embedding_dim: int = 16                 # rec: width of an embedding row
    shuffle: bool = True
    eval_every_epoch: bool = True
    resume: bool = False
    checkpoint_every_epoch: bool = True
    checkpoint_steps: int = 0               # >0: a checkpoint every N updates (bounds what a restart loses)
    threads_per_worker: int = 0             # TF intra-op threads per worker; 0: automatic
    probe_steps: int = 50                   # compute-only steps timed after training (0: no breakdown)

    def __post_init__(self):
        optimizer, learning_rate = MODEL_DEFAULTS.get(self.model, MODEL_DEFAULTS["*"])
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", optimizer)
        if self.learning_rate is None:
            object.__setattr__(self, "learning_rate", learning_rate)
        validate(self)

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)

    def to_dict(self):
        d = dataclasses.asdict(self)
        d["image_shape"] = list(self.image_shape)
        return d

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UsageError(f"unknown config keys: {', '.join(unknown)}")
        d = dict(d)
        if "image_shape" in d:
            d["image_shape"] = tuple(d["image_shape"])
        return cls(**d)

    def save(self, directory, name="config.json"):
        """Write atomically so a crash never leaves a half-written config."""
        from common.files import make_dirs, write_atomic
        make_dirs(directory)
        return write_atomic(os.path.join(directory, name), self.to_json())


def _one_of(name, value, allowed):
    if value not in allowed:
        raise UsageError(f"unknown {name} '{value}' (valid: {', '.join(allowed)})")


def _known_or_plugin(name, value, allowed):
    """A built-in name, or a plug-in 'module:function' / 'file.py:function' (common/plugins.py)."""
    from common.plugins import is_plugin, load_callable
    if is_plugin(value):
        load_callable(value, f"--{name}")      # import errors surface here, once, before any job starts
        return
    if value not in allowed:
        raise UsageError(f"unknown {name} '{value}' (valid: {', '.join(allowed)}, or module:function / "
                         f"file.py:function of your own: docs/plugins.md)")


def check_finite(name, value):
    """NaN and inf pass every ``<`` / ``>`` check, so they are refused by name first."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"--{name} must be a finite number, got {value}")


POSITIVE = ("batch_size", "learning_rate", "hidden_units", "log_every", "num_classes", "synthetic_samples",
            "embedding_rows", "embedding_dim")


def validate(cfg):
    for f in dataclasses.fields(cfg):
        check_finite(f.name, getattr(cfg, f.name))
        if isinstance(getattr(cfg, f.name), str) and not getattr(cfg, f.name).strip():
            raise UsageError(f"--{f.name} must not be empty")
    _known_or_plugin("model", cfg.model, MODELS)
    _known_or_plugin("dataset", cfg.dataset, DATASETS)
    _one_of("optimizer", cfg.optimizer, OPTIMIZERS)
    for name in POSITIVE:
        if getattr(cfg, name) <= 0:
            raise UsageError(f"--{name} must be positive, got {getattr(cfg, name)}")
    for name in ("epochs", "train_steps", "warmup_steps", "threads_per_worker", "checkpoint_steps", "probe_steps"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"--{name} must be >= 0, got {getattr(cfg, name)}")
    if not 0 <= cfg.seed < 2 ** 32:                 # numpy's RandomState takes 32 bits
        raise UsageError(f"--seed must be in [0, 2**32), got {cfg.seed}")
    if cfg.epochs == 0 and cfg.train_steps == 0:
        raise UsageError("nothing to train: set --epochs or --train_steps above 0")
    if cfg.lr_warmup_epochs < 0 or not 0 <= cfg.momentum < 1:
        raise UsageError("--lr_warmup_epochs must be >= 0 and --momentum in [0, 1)")
    if not 0 < cfg.target_accuracy <= 1:
        raise UsageError(f"--target_accuracy must be in (0, 1], got {cfg.target_accuracy}")
    if len(cfg.image_shape) != 3 or any(d <= 0 for d in cfg.image_shape):
        raise UsageError(f"--image_shape must be H,W,C with positive sizes, got {cfg.image_shape}")
    if cfg.dataset == "mnist" and not cfg.data_dir:
        raise UsageError("--dataset mnist needs --data_dir (a folder with mnist.npz or the IDX files)")
    if cfg.data_dir and not os.path.isdir(cfg.data_dir):
        raise UsageError(f"--data_dir {cfg.data_dir}: no such directory")
    if cfg.model == "rec" and cfg.dataset != "clicks":
        raise UsageError(f"--model rec embeds categorical ids: it needs --dataset clicks, not {cfg.dataset}")
    if cfg.dataset == "clicks" and cfg.model in MODELS and cfg.model != "rec":
        raise UsageError(f"--dataset clicks holds categorical ids, not pixels: use --model rec (or a plug-in "
                         f"that embeds them), not {cfg.model}")
    check_memory(cfg)
    side = KERAS_APPLICATIONS.get(cfg.model)
    if side and cfg.dataset in ("digits", "mnist"):
        raise UsageError(f"--model {cfg.model} needs 3-channel images of at least {side}x{side}: --dataset "
                         f"synthetic --image_shape {side},{side},3 (or larger), or your own data")
    if side and cfg.dataset == "synthetic" and (min(cfg.image_shape[:2]) < side or cfg.image_shape[2] != 3):
        raise UsageError(f"--model {cfg.model} needs --image_shape of at least {side},{side},3")


# What one TensorFlow task holds before its model and data: the runtime, the Python process and
# the gRPC or MPI buffers (proportional set size 0.3-0.4 GiB per task of a PS job of the MLP here).
TF_PROCESS_BYTES = 512 << 20


def memory_estimate(cfg):
    """[(flags, bytes, what)]: the least one process holds for the built-in models and data, from
    the config alone (no TensorFlow): float32 weights with their gradient, two optimizer slots and
    a broadcast copy (5 x the parameters), the synthetic arrays (drawn as float64, kept as
    float32), the CNN's activations for one batch (forward and backward). Plug-ins and the
    Keras applications' activations are not estimated; TensorFlow reports those itself."""
    from common.data import CLICK_FEATURES, SYNTHETIC_TEST_SAMPLES
    parts = []
    classes = 10 if cfg.dataset in ("digits", "mnist") else cfg.num_classes
    shape = {"digits": (8, 8, 1), "mnist": (28, 28, 1), "synthetic": tuple(cfg.image_shape)}.get(cfg.dataset)
    if cfg.model == "rec":
        table = 4 * CLICK_FEATURES * cfg.embedding_rows * cfg.embedding_dim
        parts.append((f"--embedding_rows {cfg.embedding_rows} x --embedding_dim {cfg.embedding_dim}", 3 * table,
                      f"{CLICK_FEATURES} tables of {table / 2**30:.1f} GiB with their gradient and a copy"))
    if cfg.dataset == "synthetic":
        n = cfg.synthetic_samples + min(SYNTHETIC_TEST_SAMPLES, max(8, cfg.synthetic_samples // 4))
        parts.append((f"--image_shape {','.join(map(str, shape))} x --synthetic_samples {cfg.synthetic_samples}",
                      12 * n * math.prod(shape), "the synthetic images"))
    if shape and cfg.model == "mlp":
        features = math.prod(shape)
        params = features * cfg.hidden_units + cfg.hidden_units * (classes + 1) + classes
        parts.append((f"--hidden_units {cfg.hidden_units}", 20 * params,
                      f"the MLP's {params:.3g} weights with gradient, optimizer slots and a copy"))
    if shape and cfg.model == "cnn":
        h, w, c = shape
        params = 9 * c * 32 + 9 * 32 * 64 + (h // 2) * (w // 2) * 64 * 128 + 128 * classes
        activations = 4 * 3 * cfg.batch_size * h * w * (32 + 64)
        parts.append((f"--image_shape {','.join(map(str, shape))}", 20 * params + activations,
                      f"the CNN's {params:.3g} weights and one batch's activations"))
    return parts


def check_memory(cfg):
    """A model or data set that cannot fit in this machine's memory is refused up front with the
    estimate, rather than a MemoryError traceback (or the OOM killer) once the job has started."""
    from common.procs import machine_memory
    memory = machine_memory()
    parts = memory_estimate(cfg)
    total = sum(b for _, b, _ in parts)
    if memory and total > memory:
        flags, _, what = max(parts, key=lambda p: p[1])
        raise UsageError(f"{flags}: about {total / 2**30:,.1f} GiB per process ({what}); this machine has "
                         f"{memory / 2**30:.1f} GiB")


def _shape(text):
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,W,C such as 28,28,1, got '{text}'")
    return shape


def _bool(text):
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got '{text}'")


# What no flag of any entry point may be: numbers past these are typos or overflow, not settings
# (2**48 steps, bytes or seconds; a float above 1e15 is past every rate, size or time hvdps takes).
FLAG_INT_MAX = 2 ** 48
FLAG_FLOAT_MAX = 1e15


def check_flag_value(flag, value, low=0, high=None, positive=False):
    """The rule every parsed flag value meets, whatever the entry point: no empty or blank string
    (an empty --train_dir would mean "here", an empty --hosts "locally"), no NaN or infinity (they
    pass every < and > check), no number below ``low`` (0 unless the flag says) or past the
    bounds above. Per-flag meaning (a port's range, a known model name) is checked after this."""
    if isinstance(value, (list, tuple)):
        for v in value:
            check_flag_value(flag, v, low)
        return
    if isinstance(value, str):
        if not value.strip():
            raise UsageError(f"{flag} must not be empty")
        if "\0" in value:
            raise UsageError(f"{flag} must not contain a NUL byte")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{flag} must be a finite number, got {value}")
    if high is not None and not ((low < value if positive else low <= value) and value <= high):
        raise UsageError(f"{flag} must be in {'(' if positive else '['}{_n(low)}, {_n(high)}], got {value!r}")
    if positive and value <= 0:
        raise UsageError(f"{flag} must be positive, got {value!r}")
    if value < low:
        raise UsageError(f"{flag} must be >= {_n(low)}, got {value!r}")
    limit = FLAG_INT_MAX if isinstance(value, int) else FLAG_FLOAT_MAX
    if value > limit:
        raise UsageError(f"{flag} must be at most {_n(limit)}, got {value!r}")


def _n(x):
    """A bound as a user writes it: 604800, 4294967295, 1e-06, 0.5."""
    return str(x) if isinstance(x, int) else f"{x:g}"


class Parser(argparse.ArgumentParser):
    """argparse that fails with one ``error:`` line and exit 2 (no usage dump), takes flags only by
    their full names (``--model`` must not silently mean ``--model_name``), and holds every value
    to ``check_flag_value``: one validation for every entry point. A flag with a range of its own
    (below 0, or narrower) declares it with ``bound(dest, low, high)``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._bounds = {}

    def bound(self, dest, low=0, high=None, positive=False):
        self._bounds[dest] = (low, high, positive)

    def spelled(self, args):
        """``args`` with every hyphenated flag of this parser in its one spelling, underscores
        (``--dry_run`` is ``--dry_run``, ``--num-ps`` is ``--num_ps``): the trainers' names, as
        TensorFlow's own examples write them, with the other form kept working. Nothing after a
        bare ``--`` (another program's flags) is touched."""
        out = []
        for i, arg in enumerate(args):
            if arg == "--":
                return out + args[i:]
            if arg.startswith("--") and "-" in arg[2:].split("=", 1)[0]:
                name, eq, value = arg.partition("=")
                spelled = "--" + name[2:].replace("-", "_")
                if name not in self._option_string_actions and spelled in self._option_string_actions:
                    arg = spelled + eq + value
            out.append(arg)
        return out

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(self.spelled(sys.argv[1:] if args is None else list(args)), namespace)
        for action in self._actions:
            if not action.option_strings or action.dest in ("help", argparse.SUPPRESS):
                continue
            value = getattr(ns, action.dest, None)
            if value is not None and value is not action.default:
                check_flag_value(action.option_strings[0], value, *self._bounds.get(action.dest, (0, None, False)))
        return ns, rest

    def error(self, message):
        raise UsageError(message)


def build_parser(description, prog=None):
    """Flags shared by both trainers; each backend adds its own on the result.

    Keeps the flag names of the classic distributed-TF and Horovod examples
    (``--batch_size``, ``--learning_rate``, ``--train_steps``, ``--hidden_units``,
    ``--data_dir``, ``--train_dir``) so users' existing launch lines still work.
    """
    d = Config()
    p = Parser(description=description, prog=prog,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("training (shared by every backend)")
    g.add_argument("--model", default=d.model,
                   help=f"one of {', '.join(MODELS)}, or your own: module:function or file.py:function "
                        f"(docs/plugins.md)")
    g.add_argument("--dataset", default=d.dataset,
                   help=f"one of {', '.join(DATASETS)}, or your own: module:function or file.py:function")
    g.add_argument("--data_dir", default=d.data_dir, help="folder with mnist.npz or the 4 MNIST IDX files")
    g.add_argument("--batch_size", type=int, default=d.batch_size, help="per worker (per rank)")
    g.add_argument("--learning_rate", type=float, default=argparse.SUPPRESS,
                   help=f"before world-size scaling (default: {DEFAULTS_HELP})")
    g.add_argument("--optimizer", default=argparse.SUPPRESS, help=f"one of {', '.join(OPTIMIZERS)} (default: {DEFAULTS_HELP})")
    g.add_argument("--momentum", type=float, default=d.momentum, help="for --optimizer momentum")
    g.add_argument("--scale_lr", type=_bool, default=d.scale_lr, help="multiply lr by the number of workers")
    g.add_argument("--lr_warmup_epochs", type=float, default=d.lr_warmup_epochs,
                   help="epochs of linear warm-up to the scaled rate (synchronous backends)")
    g.add_argument("--epochs", type=int, default=d.epochs,
                   help="passes over the training data: the MLP and CNN reach >= 0.90 test accuracy in 5 "
                        "under Horovod, bare MPI and sync PS, in 8 under async PS (tests/test_defaults.py)")
    g.add_argument("--train_steps", type=int, default=d.train_steps, help="if >0, steps per worker (its own batches), overrides --epochs")
    g.add_argument("--hidden_units", type=int, default=d.hidden_units, help="MLP hidden layer width")
    g.add_argument("--seed", type=int, default=d.seed, help="weights, data split and shuffling")
    g.add_argument("--train_dir", "--out", dest="train_dir", default=d.train_dir,
                   help="where metrics, checkpoints, TensorBoard events and config.json go")
    g.add_argument("--target_accuracy", type=float, default=d.target_accuracy,
                   help="the test accuracy time-to-accuracy is measured to")
    g.add_argument("--log_every", type=int, default=d.log_every, help="global updates between metric records (crossed, for every backend alike)")
    g.add_argument("--warmup_steps", type=int, default=d.warmup_steps, help="steps excluded from throughput")
    g.add_argument("--image_shape", type=_shape, default=d.image_shape, help="synthetic data: H,W,C")
    g.add_argument("--num_classes", type=int, default=d.num_classes, help="synthetic data")
    g.add_argument("--synthetic_samples", type=int, default=d.synthetic_samples, help="synthetic data: examples")
    g.add_argument("--embedding_rows", type=int, default=d.embedding_rows,
                   help="rec: rows of each of the 4 categorical features' embedding tables")
    g.add_argument("--embedding_dim", type=int, default=d.embedding_dim, help="rec: width of an embedding row")
    g.add_argument("--shuffle", type=_bool, default=d.shuffle, help="a new order of the data every epoch (dealt out to the workers)")
    g.add_argument("--eval_every_epoch", type=_bool, default=d.eval_every_epoch,
                   help="test accuracy after every epoch (false: only at the end)")
    g.add_argument("--checkpoint_every_epoch", type=_bool, default=d.checkpoint_every_epoch,
                   help="false: checkpoint only at the end (benchmarks: a save stalls every worker)")
    g.add_argument("--checkpoint_steps", type=int, default=d.checkpoint_steps,
                   help="also checkpoint every N updates (0: per --checkpoint_every_epoch); a restart loses "
                        "at most this many")
    g.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --train_dir")
    g.add_argument("--threads_per_worker", type=int, default=d.threads_per_worker,
                   help="TensorFlow intra-op threads per worker/rank (0: Horovod splits the host's "
                        "cores between its local ranks; a PS worker takes TensorFlow's default)")
    g.add_argument("--probe_steps", type=int, default=d.probe_steps,
                   help="after training, the chief times this many steps of the same model, batch, input "
                        "pipeline and threads with no exchange at all: the compute part of the per-step "
                        "breakdown (docs/metrics.md); 0: no breakdown")
    for name in POSITIVE:
        p.bound(name, positive=True)
    p.bound("seed", 0, 2 ** 32 - 1)          # numpy's RandomState takes 32 bits
    p.bound("momentum", 0, 1)
    p.bound("target_accuracy", 0, 1, positive=True)
    return p


def argv_of(args, parser, skip=()):
    """The flags of a parsed namespace that differ from the parser's defaults, as argv.

    Launchers parse the trainer flags once (to validate them and read what they
    need) and hand the *parsed* values on to every task with this, instead of
    forwarding and searching the raw strings.
    """
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest in skip or action.dest == "help":
            continue
        default = parser.get_default(action.dest)
        value = getattr(args, action.dest, default)
        if value == default:
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:                    # store_true / store_false
            if action.const == value:
                out.append(flag)
            continue
        if isinstance(value, bool):
            out += [flag, "true" if value else "false"]
        elif isinstance(value, (tuple, list)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def from_args(args):
    fields = {f.name for f in dataclasses.fields(Config)}
    return Config(**{k: v for k, v in vars(args).items() if k in fields and v is not None})


def make_config(**kw):
    """Config for tests and programmatic use: defaults plus overrides, validated."""
    if "image_shape" in kw:
        kw["image_shape"] = tuple(kw["image_shape"])
    return Config(**kw)

