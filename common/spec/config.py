"""The one run configuration every method shares.

The comparison is only fair if every trainer reads the same flags into the same
frozen object and save it next to their results, so a reader can check that two
runs really trained the same model on the same data with the same batch.
"""
import argparse
import dataclasses
import json
import math
import os
from typing import Optional, Tuple

from common.base.errors import UsageError
from common.base.flags import MAX_TIMEOUT_S, MIN_TIMEOUT_S, Parser, boolean, shape, check_finite
from common.spec import builtins, precision as precisions
from common.spec.datasets import MAX_EXAMPLE_VALUES
from common.spec.memory import check_memory
from common.spec.plugins import is_plugin, load_callable
from common.base.files import make_dirs, write_atomic

MODELS = tuple(builtins.MODELS)        # the built-ins (common/spec/builtins.py), or a plug-in's module:function
DATASETS = tuple(builtins.DATA)
SHARD_BY = ("record", "file")          # --dataset tfrecord across workers: common/inputs/records.py
# (optimizer, learning rate) when none is given. Momentum SGD at 0.05 x workers diverges for the
# CNN on 28x28 data from 2 workers on (0.35 / 0.07 accuracy at 2 workers, 0.10 at 4) and leaves the
# MLP at 0.40 with 4 async PS workers; Adam at these rates trains both to >= 0.9 at 1 and 4
# workers on 28x28 data (the MLP at 4 on 8x8) under every backend (tests/test_defaults.py). The MLP's 0.0025
# rather than 0.005: with 4 oversubscribed async PS workers (stale gradients) 0.005 ended 5 epochs
# at 0.897-0.964 over 9 runs on 28x28 data, 0.0025 at 0.933-0.958 over 8.
# rec: plain SGD, whose update of an embedding table touches only the rows a batch looked up (Adam's and
# momentum's slots decay every row of the table every step, which makes the update dense).
# transformer: Adam at 0.002, which reached 0.50 next-byte accuracy in 750 steps of 32 sequences on one
# process (0.59 in 2,000) at the tiny size.
MODEL_DEFAULTS = {"mlp": ("adam", 0.0025), "cnn": ("adam", 0.001), "rec": ("sgd", 0.5), "transformer": ("adam", 0.002),
                  "*": ("momentum", 0.05)}
DEFAULTS_HELP = ("per model: mlp adam at 0.0025, cnn adam at 0.001, rec sgd at 0.5, transformer adam at 0.002; the "
                 "Keras applications and plug-ins momentum 0.9 at 0.05")
# The target time-to-accuracy is measured to when none is given. transformer: the held-out next-byte
# accuracy past what the two previous bytes alone predict (0.50 on the standard library; the previous
# byte alone: 0.39), so a run that reaches it has learned context.
MODEL_TARGETS = {"transformer": 0.52, "*": 0.9}
TARGETS_HELP = "0.52 for the transformer (next-byte accuracy), else 0.9"
TRANSFORMER_SIZES = tuple(builtins.TRANSFORMER_SIZES)
OPTIMIZERS = ("sgd", "momentum", "adam")
# Keras' mixed-precision policies (tf.keras.mixed_precision.Policy): float32, or layers computing in
# bfloat16 / float16 with their variables (and so their gradients, and what every method sends) in
# float32. float16's narrow range needs the loss scaled (common/model/optim.py: loss_scaled). The flag
# also takes ``auto`` (its default): the policy this process's hardware gains from (common/spec/precision.py).
PRECISIONS = precisions.POLICIES


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
    target_accuracy: Optional[float] = None  # None: per model (MODEL_TARGETS)
    log_every: int = 10
    warmup_steps: int = 5                   # excluded from throughput figures
    image_shape: Tuple[int, ...] = (28, 28, 1)  # synthetic data only
    num_classes: int = 10                   # synthetic data only
    synthetic_samples: int = 2048
    embedding_rows: int = 100000            # rec: rows of each categorical feature's embedding table
    embedding_dim: int = 16                 # rec: width of an embedding row
    seq_len: int = 64                       # text (pysrc): bytes per sequence, the transformer's context
    transformer_size: str = "tiny"          # transformer: its shape (common/spec/builtins.py: TRANSFORMER_SIZES)
    eval_every_steps: int = 0               # >0: also evaluate every N global updates (a corpus' long epochs)
    precision: str = "float32"              # Keras' mixed-precision policy the model is built under (PRECISIONS)
    precision_auto: bool = False            # chosen by --precision auto from the hardware (common/spec/precision.py)
    loss_scale_growth_steps: int = 2000     # mixed_float16: finite steps before the loss scale doubles (Keras')
    jit_compile: bool = False               # the training step compiled by XLA (tf.function(jit_compile=True))
    shuffle: bool = True
    eval_every_epoch: bool = True
    resume: bool = False
    checkpoint_every_epoch: bool = True
    checkpoint_steps: int = 0               # >0: a checkpoint every N updates (bounds what a restart loses)
    threads_per_worker: int = 0             # TF intra-op threads per worker; 0: automatic
    probe_steps: int = 50                   # compute-only steps timed after training (0: no breakdown)
    shard_by: str = "record"                # tfrecord: each worker keeps every n-th record, or reads 1/n of the files
    shuffle_buffer: int = 10000             # tfrecord: records in each worker's shuffle buffer

    def __post_init__(self):
        optimizer, learning_rate = MODEL_DEFAULTS.get(self.model, MODEL_DEFAULTS["*"])
        if self.optimizer is None:
            object.__setattr__(self, "optimizer", optimizer)
        if self.learning_rate is None:
            object.__setattr__(self, "learning_rate", learning_rate)
        if self.target_accuracy is None:
            object.__setattr__(self, "target_accuracy", MODEL_TARGETS.get(self.model, MODEL_TARGETS["*"]))
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
        make_dirs(directory)
        return write_atomic(os.path.join(directory, name), self.to_json())


def _one_of(name, value, allowed):
    if value not in allowed:
        raise UsageError(f"unknown {name} '{value}' (valid: {', '.join(allowed)})")


def _known_or_plugin(name, value, allowed):
    """A built-in name, or a plug-in 'module:function' / 'file.py:function' (common/spec/plugins.py)."""
    if is_plugin(value):
        load_callable(value, f"--{name}")      # import errors surface here, once, before any job starts
        return
    if value not in allowed:
        raise UsageError(f"unknown {name} '{value}' (valid: {', '.join(allowed)}, or module:function / "
                         f"file.py:function of your own: docs/plugins.md)")


POSITIVE = ("batch_size", "learning_rate", "hidden_units", "log_every", "num_classes", "synthetic_samples",
            "embedding_rows", "embedding_dim", "shuffle_buffer", "seq_len", "loss_scale_growth_steps")
MAX_SEQ_LEN = 1 << 16       # positions: the attention of one sequence is seq_len^2 scores a head


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
    for name in ("epochs", "train_steps", "warmup_steps", "threads_per_worker", "checkpoint_steps", "probe_steps",
                 "eval_every_steps"):
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
    if math.prod(cfg.image_shape) > MAX_EXAMPLE_VALUES:
        raise UsageError(f"--image_shape {','.join(map(str, cfg.image_shape))}: {math.prod(cfg.image_shape):,} values "
                         f"an example; hvdps takes at most {MAX_EXAMPLE_VALUES:,} (256 MiB of float32)")
    _one_of("transformer_size", cfg.transformer_size, TRANSFORMER_SIZES)
    _one_of("precision", cfg.precision, PRECISIONS)
    if cfg.seq_len > MAX_SEQ_LEN:
        raise UsageError(f"--seq_len must be at most {MAX_SEQ_LEN}, got {cfg.seq_len}")
    data, model = builtins.data_of(cfg), builtins.model_of(cfg)
    if data and data.needs and not cfg.data_dir:
        raise UsageError(data.needs)
    _one_of("shard_by", cfg.shard_by, SHARD_BY)
    if cfg.data_dir and not os.path.isdir(cfg.data_dir):
        raise UsageError(f"--data_dir {cfg.data_dir}: no such directory")
    of_ids = " or ".join(d.name for d in builtins.DATA.values() if d.ids)
    if model and model.ids and not (data and data.ids):
        raise UsageError(f"--model {cfg.model} embeds categorical ids: it needs --dataset {of_ids}, not {cfg.dataset}")
    if data and data.ids and model and not model.ids:
        embeds = " or ".join(m.name for m in builtins.MODELS.values() if m.ids)
        raise UsageError(f"--dataset {cfg.dataset} holds categorical ids, not pixels: use --model {embeds} (or a "
                         f"plug-in that embeds them), not {cfg.model}")
    texts = " or ".join(d.name for d in builtins.DATA.values() if d.text)
    if model and model.text and not (data and data.text) and not (data and data.streamed):
        raise UsageError(f"--model {cfg.model} is a language model: it needs byte sequences, --dataset {texts} (or "
                         f"their TFRecord shards), not {cfg.dataset}")
    if data and data.text and model and not model.text:
        lms = " or ".join(m.name for m in builtins.MODELS.values() if m.text)
        raise UsageError(f"--dataset {cfg.dataset} is text, a next byte to predict at every position: use --model "
                         f"{lms}, not {cfg.model}")
    check_memory(cfg)
    side = model.min_side if model else 0
    pixels = data.pixels(cfg) if data else None
    if side and pixels and (min(pixels[:2]) < side or pixels[2] != 3):
        generated = " or ".join(d.name for d in builtins.DATA.values() if d.shape_from_flags)
        if data.shape_from_flags:
            raise UsageError(f"--model {cfg.model} needs --image_shape of at least {side},{side},3")
        raise UsageError(f"--model {cfg.model} needs 3-channel images of at least {side}x{side}: --dataset "
                         f"{generated} --image_shape {side},{side},3 (or larger), or your own data")


def build_parser(description, prog=None):
    """Flags shared by every trainer; each method adds its own on the result.

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
    g.add_argument("--data_dir", default=d.data_dir, help="mnist: a folder with mnist.npz or the 4 MNIST IDX files; "
                   "tfrecord: a folder of TFRecord shards with their dataset.json (hvdps data)")
    g.add_argument("--shard_by", default=d.shard_by, choices=SHARD_BY,
                   help="tfrecord: 'record' (every worker keeps every n-th record of one seeded order: n workers at "
                        "batch b train as one at n*b) or 'file' (each worker reads 1/n of the files)")
    g.add_argument("--shuffle_buffer", type=int, default=d.shuffle_buffer,
                   help="tfrecord: records each worker holds to shuffle (its memory, not the data set's)")
    g.add_argument("--batch_size", type=int, default=d.batch_size, help="per worker (per rank)")
    g.add_argument("--learning_rate", type=float, default=argparse.SUPPRESS,
                   help=f"before world-size scaling (default: {DEFAULTS_HELP})")
    g.add_argument("--optimizer", default=argparse.SUPPRESS, help=f"one of {', '.join(OPTIMIZERS)} (default: {DEFAULTS_HELP})")
    g.add_argument("--momentum", type=float, default=d.momentum, help="for --optimizer momentum")
    g.add_argument("--scale_lr", type=boolean, default=d.scale_lr, help="multiply lr by the number of workers")
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
    g.add_argument("--target_accuracy", type=float, default=argparse.SUPPRESS,
                   help=f"the test accuracy time-to-accuracy is measured to (default: {TARGETS_HELP})")
    g.add_argument("--log_every", type=int, default=d.log_every, help="global updates between metric records (crossed, for every backend alike)")
    g.add_argument("--warmup_steps", type=int, default=d.warmup_steps, help="steps excluded from throughput")
    g.add_argument("--image_shape", type=shape, default=d.image_shape, help="synthetic data: H,W,C")
    g.add_argument("--num_classes", type=int, default=d.num_classes, help="synthetic data")
    g.add_argument("--synthetic_samples", type=int, default=d.synthetic_samples, help="synthetic data: examples")
    g.add_argument("--embedding_rows", type=int, default=d.embedding_rows,
                   help="rec: rows of each of the 4 categorical features' embedding tables")
    g.add_argument("--embedding_dim", type=int, default=d.embedding_dim, help="rec: width of an embedding row")
    g.add_argument("--seq_len", type=int, default=d.seq_len,
                   help="text (--dataset pysrc): bytes per sequence, the transformer's context")
    g.add_argument("--transformer_size", default=d.transformer_size, choices=TRANSFORMER_SIZES,
                   help="the transformer's shape: tiny (2 blocks of 64, 0.12 M weights), gpt2_small (GPT-2's: 12 "
                        "blocks of 768, 12 heads)")
    g.add_argument("--precision", default=precisions.AUTO, choices=(precisions.AUTO, *PRECISIONS),
                   help="Keras' mixed-precision policy: layers compute in bfloat16 or float16, their variables and "
                        "gradients stay float32 (mixed_float16: the loss scaled by Keras' LossScaleOptimizer); auto: "
                        "a mixed policy only where this process's hardware gains from it (a GPU's tensor cores, a "
                        "CPU's AMX), else float32; the run's header says which and why")
    g.add_argument("--loss_scale_growth_steps", type=int, default=d.loss_scale_growth_steps,
                   help="mixed_float16: finite steps after which the dynamic loss scale doubles (Keras' "
                        "dynamic_growth_steps); a step with a non-finite gradient is skipped and halves it")
    g.add_argument("--jit_compile", type=boolean, default=d.jit_compile,
                   help="the training step compiled by XLA (tf.function(jit_compile=True)); refused in one "
                        "line by a method whose exchange inside the step XLA cannot compile")
    g.add_argument("--shuffle", type=boolean, default=d.shuffle, help="a new order of the data every epoch (dealt out to the workers)")
    g.add_argument("--eval_every_epoch", type=boolean, default=d.eval_every_epoch,
                   help="test accuracy after every epoch (false: only at the end)")
    g.add_argument("--eval_every_steps", type=int, default=d.eval_every_steps,
                   help="also test accuracy every N global updates (0: never): the time to the target on a "
                        "corpus whose epoch is thousands of steps")
    g.add_argument("--checkpoint_every_epoch", type=boolean, default=d.checkpoint_every_epoch,
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
    g = p.add_argument_group("liveness (every method)")
    g.add_argument("--step_timeout", type=float, default=60.0,
                   help="seconds a step may take, its input and its exchange included, before the job ends naming "
                        "who it waits for (a lost, stopped or stalled peer or PS task, or its own input pipeline); "
                        "each batch of an evaluation and a checkpoint's save are bounded alike")
    g.add_argument("--startup_timeout", type=float, default=60.0,
                   help="seconds start-up may take (the other tasks' servers, the chief's initialisation), and the "
                        "first step on top of --step_timeout (tracing, the first negotiation)")
    for name in POSITIVE:
        p.bound(name, positive=True)
    # TensorFlow takes them in int64 milliseconds; below a second no step of any model is bounded, only
    # its scheduling (a 1 ms bound fails every rank at once, each naming itself)
    for name in ("step_timeout", "startup_timeout"):
        p.bound(name, MIN_TIMEOUT_S, MAX_TIMEOUT_S)
    p.bound("seed", 0, 2 ** 32 - 1)          # numpy's RandomState takes 32 bits
    p.bound("momentum", 0, 1)
    p.bound("target_accuracy", 0, 1, positive=True)
    p.bound("seq_len", 1, MAX_SEQ_LEN)
    p.bound("loss_scale_growth_steps", 1, 2 ** 31 - 1)
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
    """The Config of parsed flags; ``--precision auto`` resolved here, on this process's hardware."""
    fields = {f.name for f in dataclasses.fields(Config)}
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    if given.get("precision") == precisions.AUTO:
        given.update(precision=precisions.choose(precisions.AUTO).policy, precision_auto=True)
    return Config(**given)


def make_config(**kw):
    """Config for tests and programmatic use: defaults plus overrides, validated."""
    if "image_shape" in kw:
        kw["image_shape"] = tuple(kw["image_shape"])
    return Config(**kw)

