"""Every JSON file hvdps reads: its declared schema and its one bounded reader.

A file that reaches the comparison, the report or the projection decides a verdict, so each
format is declared once here, with types, required keys, finite numbers and physical ranges
(rates > 0, latencies >= 0, accuracies in [0, 1], worker counts >= 1), and read once here:

- opened without blocking and refused unless it is a regular file of bounded size
  (``common.base.files.read_input``): a FIFO, a device or a 10 GB file never hangs a reader;
- parsed with NaN, Infinity and numbers that overflow to infinity (``1e999``) refused, and
  nesting bounded (``MAX_DEPTH``), so nothing downstream meets an infinity or a recursion;
- validated in pydantic's strict mode: ``"3"`` is not 3, ``true`` is not 1;
- refused in one ``error:`` line naming the file, the field and the rule.

What a reader returns has passed its schema; nothing downstream checks a type again. The
formats read elsewhere have their own single reader: hostfiles in ``common/launch/hosts.py``, cluster specs and TF_CONFIG in
``tf_cluster/spec.py``, IDX and NPZ data in ``common/inputs/data.py``. ``READERS`` lists every format and
the one function that reads it; ``tests/test_schemas.py`` fails on any other module that opens
one of these files or calls ``json.load``.

Why pydantic (v2): schemas are plain classes whose annotations are the types and whose
``Field`` bounds are the ranges; strict mode and ``allow_inf_nan=False`` are switches, not code;
its errors carry the path to the failing field; and it is one of the most used, best kept
validation libraries for Python (its core is compiled, so a metrics file of 10^5 records
validates in well under a second).
"""
import dataclasses
import json
import math
import os
import re
import typing
from typing import Annotated, Any, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
import numpy as np
from pydantic import create_model

from common.base.errors import UsageError, shown
from common.base.files import MiB, read_input, check_regular
from common.spec.config import Config
from common.spec.datasets import MAX_EXAMPLE_VALUES

MAX_DEPTH = 32           # the deepest any hvdps file nests is 5 (a run's config inside a header's plan)
MAX_JSON = 64 * MiB      # comm.json, links.json and cluster.json are kB; a links series of hours is MBs
MAX_METRICS = 1 << 30    # metrics.jsonl of a long run with per-step records


class SchemaError(UsageError):
    """A file hvdps reads is not what its format declares."""


# ------------------------------------------------------------------ the field types
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
UnixTime = Annotated[float, Field(ge=0, le=1e11, allow_inf_nan=False)]     # up to year 5138
Count = Annotated[int, Field(ge=1, le=1 << 20)]                             # workers, ranks, batches
Index = Annotated[int, Field(ge=0, le=1 << 62)]                             # steps, bytes, ids
Text = Annotated[str, Field(min_length=1, max_length=4096)]
Rate = Annotated[float, Field(ge=1e3, le=1e15, allow_inf_nan=False)]       # a link's bits/s: 1 kbit/s to 1 Pbit/s


class Strict(BaseModel):
    """Strict types; keys a newer hvdps may add are kept (``extra="allow"``), not refused."""
    model_config = ConfigDict(strict=True, extra="allow", frozen=True, defer_build=True)


# ------------------------------------------------------------------ comm.json
class CommRow(Strict):
    impl: Text
    bytes: Annotated[float, Field(ge=1, le=2.0 ** 50, allow_inf_nan=False)]
    seconds: Annotated[float, Field(ge=1e-9, le=1e6, allow_inf_nan=False)]


class CommFile(Strict):
    """benchmarks/comm_bandwidth.py's result: the exchange times the projection fits."""
    np: Annotated[int, Field(ge=2, le=65536)] = 2
    results: Annotated[List[CommRow], Field(min_length=1)]


# ------------------------------------------------------------------ cluster.json
class ClusterDescription(Strict):
    """hvdps emulate's description of the cluster it built: link rate, latency, counters."""
    rate: Optional[Text] = None
    rate_bps: Optional[Rate] = None
    latency_s: Optional[NonNeg] = None
    rtt_s: Optional[NonNeg] = None
    counters: Optional[Text] = None
    ports: Optional[Dict[str, Text]] = None
    subnet: Optional[Text] = None
    namespaces: Optional[Dict[str, Text]] = None
    rates: Optional[Dict[str, Rate]] = None       # each host's own link rate (hvdps emulate --link)
    switch: Optional[Text] = None                 # the switch's namespace: where each host's port is
    queue_ms: Optional[Positive] = None           # each link's tbf queue (hvdps compare --slow_link keeps it)


class LinksSpec(ClusterDescription):
    """The same file given to ``hvdps compare --links``: it must say where the counters are."""
    rate_bps: Rate
    counters: Text
    ports: Annotated[Dict[str, Text], Field(min_length=1)]


# ------------------------------------------------------------------ links.json
Sample = Annotated[List[NonNeg], Field(min_length=3, max_length=3)]     # [unix time, bytes in, bytes out]


def _in_time_order(series, what):
    """Counters sampled in time order (a series out of order would give negative bytes per round)."""
    for i in range(1, len(series)):
        if series[i][0] < series[i - 1][0]:
            raise ValueError(f"{what} sample {i} is earlier than sample {i - 1}: samples must be in time order")


class LinksFile(Strict):
    """A run's sampled link counters (hvdps/measure/links.py: Sampler.save)."""
    series: Dict[Text, List[Sample]]
    roles: Optional[Dict[Text, Text]] = None    # task -> host
    rate_bps: Optional[Rate] = None
    rates: Optional[Dict[Text, Rate]] = None     # host -> its own link's rate, where hosts differ
    cpu: List[Sample] = []                  # [unix time, busy ticks, total ticks] of the machine's cores
    cores: Optional[Annotated[int, Field(ge=1, le=65536)]] = None

    @model_validator(mode="after")
    def _ordered(self):
        for host, points in self.series.items():
            _in_time_order(points, f"series.{_key(host)}:")
        _in_time_order(self.cpu, "cpu:")
        return self


# ------------------------------------------------------------------ load.json
# [unix time, busy, total, job, own, steal, kernel threads] (hvdps/measure/load.py); a file of 5 values a
# sample, without the last two, is read too: those two shares are then unknown
LoadSample = Annotated[List[NonNeg], Field(min_length=5, max_length=7)]


class LoadFile(Strict):
    """The machine's and the job's CPU while a run trained (hvdps/measure/load.py: LoadSampler.save)."""
    hz: Annotated[int, Field(ge=1, le=1_000_000)]
    cores: Annotated[int, Field(ge=1, le=65536)]
    samples: List[LoadSample]

    @model_validator(mode="after")
    def _ordered(self):
        _in_time_order(self.samples, "samples:")
        widths = {len(sample) for sample in self.samples}
        if not widths <= {5} and widths != {7}:
            raise ValueError(f"samples: expected 7 values in every sample (or 5 in every one); got {sorted(widths)}")
        # counters since boot only grow; the job's and the kernel threads' sums lose an exited process's
        growing = (1, 2, 4, 5) if 7 in widths else (1, 2, 4)
        for i in range(1, len(self.samples)):
            if any(self.samples[i][k] < self.samples[i - 1][k] for k in growing):
                raise ValueError(f"samples: sample {i} has a counter below sample {i - 1}'s")
        return self


# ------------------------------------------------------------------ compare_run.json
class Unhealthy(Strict):
    """What a comparison did to one run's worker (hvdps/measure/unhealthy.py: a slow worker by a CPU
    cgroup's quota, or a stalled one by SIGSTOP/SIGCONT), and whom it found to do it to; or to one
    host's link on hvdps emulate's cluster (a tbf rate, run by run)."""
    condition: Text                              # the run's folder suffix: slow1x4, stall1-2000-500, link-h3-10mbit
    what: Text                                   # in words: worker 1 at 1/4 CPU
    rank: Optional[Index] = None                 # the worker's (None: a slow link, a host's)
    factor: Optional[Annotated[float, Field(ge=1, le=1000, allow_inf_nan=False)]] = None
    quota_us: Optional[Index] = None
    period_us: Optional[Index] = None
    controller: Optional[Text] = None
    every_ms: Optional[Positive] = None
    for_ms: Optional[Positive] = None
    pids: List[Index] = []                       # the worker's processes it acted on
    stops: Index = 0
    stopped_s: NonNeg = 0
    # each stop's (SIGSTOP, SIGCONT) in Unix time, in order; None where there were too many to keep
    stopped_at: Optional[List[Annotated[List[NonNeg], Field(min_length=2, max_length=2)]]] = None
    first_applied_s: Optional[NonNeg] = None     # from launch to the worker being slowed or stalled (training begun)
    link: Optional[Text] = None                  # a slow link: the host's port (h3), its key in cluster.json's
    host: Optional[Text] = None                  # rates and the runs' roles (address or SLURM node name),
    rate: Optional[Text] = None                  # and the rate it ran at
    rate_bps: Optional[Rate] = None

    @property
    def stalled(self):
        """A stall (--stall), whose cost falls in the few logging intervals a stop lands in."""
        return self.every_ms is not None and self.for_ms is not None

    @model_validator(mode="after")
    def _whose(self):
        if (self.rank is None) == (self.rate_bps is None):
            raise ValueError("a condition names a worker (rank) or a slow link (rate_bps), one of them")
        if self.rate_bps is not None and not self.host:
            raise ValueError("a slow link names its host")
        return self

    @model_validator(mode="after")
    def _stops_in_order(self):
        windows = self.stopped_at or []
        for i, (start, end) in enumerate(windows):
            if end < start or (i and start < windows[i - 1][1]):
                raise ValueError(f"stopped_at: stop {i} ends before it starts or begins before stop {i - 1} ended")
        return self


class RunIdentity(Strict):
    """Which run this is, as the comparison planned it (hvdps/measure/identity.py: RunId): the
    workload, the method and mode, its settings, the workers and its other tasks by role, the
    condition it ran under (None: healthy) and its repeat (None: it ran once)."""
    workload: Text
    method: Text
    mode: Text
    workers: Count
    tasks: Dict[Text, Count] = {}                # role -> count, besides the workers (ps: 2)
    settings: Dict[Text, Text] = {}              # the method's own knobs, as given
    condition: Optional[Text] = None             # slow1x4, stall1-2000-500, link-h3-10mbit
    repeat: Optional[Count] = None


class RunRecord(Strict):
    """What hvdps compare records next to each run: its wall time from launch, its command."""
    seconds: NonNeg
    launched_at: Optional[UnixTime] = None
    exit_code: Optional[int] = None
    command: Optional[List[str]] = None
    roles: Optional[Dict[Text, Text]] = None    # task -> host
    oversubscribed: Optional[bool] = None       # more processes than this machine's cores
    unhealthy: Optional[Unhealthy] = None       # a slow or stalled worker (--straggler, --stall)
    identity: Optional[RunIdentity] = None      # which run it is (None: written before runs recorded it)


class TuneRecord(Strict):
    """hvdps tune's tune.json: the command line the tune was started with (its --out and --budget
    apart), which --resume and --from take its flags from."""
    argv: List[Annotated[str, Field(max_length=4096)]]


class TrialRecord(Strict):
    """A tune's trial.json, written once the trial finished: its entry, stage, steps and wall time."""
    entry: Text
    stage: Text
    steps: Optional[Annotated[int, Field(ge=1)]] = None
    seconds: NonNeg
    exit_code: Optional[int] = None


# ------------------------------------------------------------------ ranks/<task>.json
class StepQuantiles(Strict):
    """One rank's step times after the warm-up (common/trainer/steptimes.py: quantiles), seconds."""
    n: Count
    p50: NonNeg
    p95: NonNeg
    max: NonNeg


# [step, start, end, input wait, timed exchange]: one logged step of one rank, Unix seconds; the last
# two null where not measured
RankSpan = Annotated[List[Optional[NonNeg]], Field(min_length=5, max_length=5)]


class RankFile(Strict):
    """What one rank or task wrote of its own steps (common/trainer/steptimes.py: StepTimes.save)."""
    task: Text
    pid: Index
    host: Text
    step_s: Optional[StepQuantiles] = None
    spans: List[RankSpan] = []
    cpu_s_per_step: Optional[NonNeg] = None     # its process's CPU (every thread) per step after the warm-up

    @model_validator(mode="after")
    def _ordered(self):
        for i, (step, start, end, *_rest) in enumerate(self.spans):
            if step is None or start is None or end is None or step != int(step) or start > 1e11 or end > 1e11:
                raise ValueError(f"spans[{i}]: expected [step, start, end, input_s, exchange_s] with a whole step "
                                 f"and Unix times")
            if end < start:
                raise ValueError(f"spans[{i}]: step {step:g} ends before it starts")
        return self


# ------------------------------------------------------------------ launch.json
class LaunchRecord(Strict):
    """The local PS launcher's record: CPU seconds per task and the PS tasks' CPU series."""
    cpu_seconds: Dict[str, NonNeg] = {}
    cpu_series: Dict[str, List[Annotated[List[NonNeg], Field(min_length=2, max_length=2)]]] = {}
    exit_code: Optional[int] = None
    ended_by: Optional[str] = None
    restarts: List[Dict[str, Any]] = []
    pids: Optional[Dict[str, Any]] = None


# ------------------------------------------------------------------ metrics.jsonl records
class RunConfig(Strict):
    """The part of a run's config (``common.spec.config.Config.to_dict``) that the report and the
    projection read; the rest is kept as written. config.json itself is read by ``read_config``."""
    target_accuracy: Optional[Fraction] = None
    warmup_steps: Optional[Index] = None
    eval_every_epoch: Optional[bool] = None
    eval_every_steps: Optional[Index] = None
    precision: Optional[Text] = None
    jit_compile: Optional[bool] = None


class InputFed(Strict):
    """What a run's input pipeline fed its model, whichever flag or description said it: each example's
    shape and the classes its labels run over (for TFRecord shards, dataset.json's, not the flags')."""
    shape: Annotated[List[Count], Field(min_length=1, max_length=8)]
    classes: Count


class PrecisionChosen(Strict):
    """The policy a run trained in and why (common/spec/precision.py: Choice): ``auto``'s choice or the
    flag's, and whether the hardware emulates it."""
    policy: Text
    asked: Text
    emulated: bool = False
    why: Optional[Text] = None


class Header(Strict):
    """The first record of a run: which method, at what size, on what. The application keys
    every row by backend, mode and workers, so a header without them is refused, not guessed."""
    type: Literal["header"]
    backend: Text
    mode: Text
    world_size: Count
    tasks: Dict[Text, Count] = {}                # role -> count of the tasks it starts besides its workers
    batch_size_per_worker: Optional[Count] = None
    global_batch_size: Optional[Annotated[int, Field(ge=1, le=1 << 40)]] = None
    model: Optional[Text] = None
    dataset: Optional[Text] = None
    start_time: Optional[UnixTime] = None
    start_step: Index = 0                                   # where a resumed run began
    plan: Optional[Dict[str, Any]] = None
    config: Optional[RunConfig] = None
    host: Optional[Text] = None
    versions: Dict[Text, Text] = {}
    keras: Optional[Text] = None                            # which Keras built the model (common/spec/keras3.py)
    data_fingerprint: Optional[Text] = None                 # the training data's digest: --resume refuses others
    data_shards: Optional[Dict[Text, Text]] = None          # TFRecord shards: file -> content digest
    input: Optional[InputFed] = None                      # what the pipeline fed the model
    precision: Optional[PrecisionChosen] = None           # the policy it trained in, and why


class _AtStep(Strict):
    """What a step record and an evaluation share: where in training, when (seconds since the
    header's start), and the figures (None where the value was not finite)."""
    global_step: Index
    wall_time: NonNeg
    loss: Optional[Finite] = None
    accuracy: Optional[Fraction] = None


class Step(_AtStep):
    type: Literal["step"]
    samples_seen: Index
    samples_per_sec: Optional[NonNeg] = None
    loss_scale: Optional[Positive] = None       # --precision mixed_float16: the dynamic loss scale then


class Eval(_AtStep):
    type: Literal["eval"]
    epoch: Optional[NonNeg] = None


class Throughput(Strict):
    """The summary's samples/s over the logging intervals (common.trainer.metrics.throughput_stats)."""
    median: Optional[NonNeg] = None
    mean: Optional[NonNeg] = None
    error: Optional[NonNeg] = None
    n: Optional[Index] = None


class Wire(Strict):
    """What one step put on the network by the method's rule (allreduce.backend: ring_wire; ps_train.backend: ps_wire)."""
    bytes_per_step_per_worker: Optional[NonNeg] = None
    wire_rule: Optional[Text] = None


class Breakdown(Wire):
    """One worker's step split into compute and overhead (common.model.probe.breakdown). The overhead is
    the step minus a compute timed in runs of its own: noise can make it negative."""
    step_s: Optional[Positive] = None
    compute_s: Optional[NonNeg] = None
    overhead_s: Optional[Finite] = None
    overhead_share: Optional[Finite] = None
    exchange_s: Optional[NonNeg] = None
    wait_s: Optional[NonNeg] = None
    wait_share: Optional[Finite] = None
    input_s: Optional[NonNeg] = None            # the mean wait for the next batch, at the iterator
    input_share: Optional[Finite] = None
    probe: Optional[Text] = None

    @model_validator(mode="after")
    def _whole(self):
        """A split is step = compute + overhead: all three, or none of them."""
        have = [self.step_s is not None, self.compute_s is not None, self.overhead_s is not None]
        if any(have) and not all(have):
            raise ValueError("step_s, compute_s and overhead_s come together (step = compute + overhead)")
        return self


class Gradient(Strict):
    """One worker's gradient of one batch as measured (common.model.models.gradient_sizes)."""
    dense_bytes: Optional[NonNeg] = None
    sparse_bytes: Optional[NonNeg] = None
    sparse_table_bytes: Optional[NonNeg] = None
    sparse_rows: Optional[NonNeg] = None
    sparse_unique_rows: Optional[NonNeg] = None


class Summary(Strict):
    type: Literal["summary"]
    status: Optional[Text] = None
    total_time: Optional[NonNeg] = None
    steps: Optional[Index] = None
    samples_seen: Optional[Index] = None
    throughput: Optional[Throughput] = None
    time_to_target: Optional[NonNeg] = None       # from the end of the first update (first_update_s)
    first_update_s: Optional[NonNeg] = None       # the trainer's start to its first update's end
    final_test_accuracy: Optional[Fraction] = None
    final_test_loss: Optional[Finite] = None
    grad_bytes_per_step: Optional[NonNeg] = None
    breakdown: Optional[Breakdown] = None
    wire: Optional[Wire] = None
    gradient: Optional[Gradient] = None
    max_weight_divergence: Optional[NonNeg] = None
    peak_rss_mib: Optional[NonNeg] = None
    float32_compute_s: Optional[NonNeg] = None   # an emulated policy's run: the same step timed in float32


RECORDS = {"header": Header, "step": Step, "eval": Eval, "summary": Summary}
_WITH_FIELDS = {}


def with_fields(record, fields):
    """The record type ``record`` (Header, Step, ...) with a method's own ``fields`` (a Strict model
    its package declares: ``Method.records``): both validated, one typed record. Made once per pair."""
    if fields is None:
        return record
    key = (record, fields)
    if key not in _WITH_FIELDS:
        _WITH_FIELDS[key] = type(f"{fields.__name__}{record.__name__}", (record, fields),
                                 {"__module__": fields.__module__, "__doc__": record.__doc__})
    return _WITH_FIELDS[key]


# ------------------------------------------------------------------ dataset.json (TFRecord shards)
FileName = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class RecordSplit(Strict):
    """One split's TFRecord files (names in the data set's folder) and the records each holds."""
    files: Annotated[List[FileName], Field(min_length=1, max_length=1 << 20)]
    records: List[Count]

    @model_validator(mode="after")
    def _paired(self):
        if len(self.records) != len(self.files):
            raise ValueError(f"{len(self.files)} files but {len(self.records)} record counts")
        if len(set(self.files)) != len(self.files):
            raise ValueError("a file is listed twice")
        return self


class RecordSet(Strict):
    """What ``hvdps data`` writes beside TFRecord shards (common/inputs/records.py has both layouts):
    ``plain``, each record an ``x`` feature (the example's values, raw ``dtype`` bytes of ``shape``)
    and a ``y`` int64 class id; ``imagenet``, tf_cnn_benchmarks' records, an encoded JPEG or PNG in
    ``image/encoded`` and its class in ``image/class/label``, the images ``shape`` (H, W, C) as
    stored, or resized to it (``resize``); ``text``, a language model's sequences, each record a
    ``tokens`` feature of ``shape[0] + 1`` bytes (the model reads the first ``shape[0]``, and each is
    labelled with the byte after it), ``classes`` the byte values. Class ids run from ``first_label``
    (ImageNet's are 1-based) to ``first_label + classes - 1``; training sees them from 0."""
    layout: Literal["plain", "imagenet", "text"]
    shape: Annotated[List[Count], Field(min_length=1, max_length=8)]
    dtype: Literal["float32", "int32", "uint8"]
    classes: Annotated[int, Field(ge=1, le=1 << 24)]
    first_label: Literal[0, 1] = 0
    resize: bool = False
    train: RecordSplit
    test: RecordSplit

    @model_validator(mode="after")
    def _layout(self):
        if self.layout == "imagenet" and (self.dtype != "uint8" or len(self.shape) != 3 or self.shape[2] not in (1, 3)):
            raise ValueError("the imagenet layout holds 8-bit images: dtype uint8, shape [H, W, C] with C 1 or 3")
        if self.layout == "plain" and (self.dtype == "uint8" or self.resize):
            raise ValueError("the plain layout holds float32 or int32 values of a fixed shape (no uint8, no resize)")
        if self.layout == "text" and (self.dtype != "uint8" or len(self.shape) != 1 or self.classes > 256
                                      or self.first_label or self.resize):
            raise ValueError("the text layout holds byte sequences: dtype uint8, shape [sequence length], at most "
                             "256 classes from 0, no resize")
        if math.prod(self.shape) > MAX_EXAMPLE_VALUES:
            raise ValueError(f"shape {self.shape} is {math.prod(self.shape):,} values an example; hvdps takes at most "
                             f"{MAX_EXAMPLE_VALUES:,} (256 MiB of float32)")
        return self


# ------------------------------------------------------------------ model_profiles.json
class Layer(Strict):
    """One weighted layer as the cost model takes it (common/model/layer_profile.py): its gradient's
    bytes, each trainable variable's bytes (a PS places variables, not layers) and its forward FLOPs."""
    name: Optional[str] = None
    grad_bytes: Index
    tensors: Optional[List[Index]] = None
    flops: NonNeg = 0


class Profile(Strict):
    layers: Annotated[List[Layer], Field(min_length=1)]
    input_shape: Optional[List[Count]] = None
    classes: Optional[Count] = None


# ------------------------------------------------------------------ parsing and refusing
def _refuse_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} overflows to infinity")
    return value


def _depth(data, limit=MAX_DEPTH):
    """Nesting depth, without recursion (a deep file must not exhaust the stack here either)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def parse_json(text, source, max_depth=MAX_DEPTH):
    """JSON text -> Python data: NaN, Infinity and overflowing numbers refused, nesting bounded
    (``max_depth``). ``source`` names the file (or variable) in the one error line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchemaError(f"{source}: not UTF-8 text (byte {exc.start})")
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise SchemaError(f"{source}: nested deeper than {max_depth} levels")
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{source}: not valid JSON: {str(exc).splitlines()[0][:200]}")
    except ValueError as exc:          # the hooks above: NaN, Infinity, 1e999
        raise SchemaError(f"{source}: {exc}")
    if _depth(data, max_depth) > max_depth:
        raise SchemaError(f"{source}: nested deeper than {max_depth} levels")
    return data


def _key(part):
    """A key as the error line shows it (a key holding a newline must not break the one line)."""
    return shown(part)


def _where(loc):
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{_key(part)}" if out else _key(part))
    return out or "(top level)"


def validate(model, data, source):
    """``data`` checked against ``model``: the model instance, or one line naming the first failing
    field and its rule."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        got = first.get("input")
        shown = repr(got) if isinstance(got, (int, float, str, bool, type(None))) else type(got).__name__
        raise SchemaError(f"{source}: {_where(first['loc'])}: {first['msg'].lower()} (got {shown[:80]})")


def read_json(path, model, what, max_bytes=MAX_JSON, max_depth=MAX_DEPTH):
    """One JSON file of a declared format -> its model instance (or one error line)."""
    return validate(model, parse_json(read_input(path, what, max_bytes=max_bytes), path, max_depth), path)


class CrdSchema(Strict):
    """A released CRD's published schema as hostfiles/k8s/crds/ keeps it (hvdps/k8s/validate.py)."""
    group: Text
    kind: Text
    version: Text
    openAPIV3Schema: Dict[str, Any]


CRD_DEPTH = 128          # a CRD's schema nests a pod template's fields about 40 levels deep


def read_crd_schema(path):
    return read_json(path, CrdSchema, "a CRD's published schema", max_depth=CRD_DEPTH)


def read_comm(path):
    return read_json(path, CommFile, "a comm_bandwidth.py result file")


def read_cluster_description(path):
    return (read_json(path, ClusterDescription, "an hvdps emulate cluster description"))


def read_links_spec(path):
    return (read_json(path, LinksSpec, "an hvdps emulate cluster description"))


def read_links(path):
    return read_json(path, LinksFile, "a links file")


def read_load(path):
    return read_json(path, LoadFile, "a load file")


def read_run_record(path):
    return read_json(path, RunRecord, "a run record")


def read_tune_record(path):
    return read_json(path, TuneRecord, "a tune's record")


def read_trial_record(path):
    return read_json(path, TrialRecord, "a tune's trial record")


def read_rank_file(path):
    return read_json(path, RankFile, "a rank's step times")


def read_launch_record(path):
    return read_json(path, LaunchRecord, "a launch record")


def read_record_set(path):
    return read_json(path, RecordSet, "a TFRecord data set description (hvdps data)")


def read_profiles(path):
    data = parse_json(read_input(path, "model profiles", max_bytes=MAX_JSON), path)
    if not isinstance(data, dict):
        raise SchemaError(f"{path}: expected an object of model profiles")
    return {name: validate(Profile, prof, f"{path}: {_key(name)}") for name, prof in data.items()}


def read_config(path):
    """A run's config.json -> common.spec.config.Config (types here, ranges in Config's own checks)."""
    return config_from_text(read_input(path, "config", max_bytes=16 * MiB), path)


def config_from_text(text, source):
    return validate(config_model(), parse_json(text, source), source).to_config()


def read_result(path, what="a benchmark result file"):
    """A benchmark's own JSON result (benchmarks/results/*.json): well-formed, finite, bounded."""
    return parse_json(read_input(path, what, max_bytes=MAX_JSON), path)


def read_weights(path):
    """A run's weights.npz -> its arrays in model order: a regular file of bounded size, no
    pickled objects, numeric arrays only."""
    check_regular(path, "a weights file", 16 << 30)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
    except Exception as exc:           # zipfile, format and key errors: many types, one line
        raise SchemaError(f"{path}: not a weights file written by hvdps ({str(exc).splitlines()[0][:120]})")
    bad = next((i for i, a in enumerate(arrays) if a.dtype.kind not in "biuf"), None)
    if bad is not None:
        raise SchemaError(f"{path}: arr_{bad} has dtype {arrays[bad].dtype}, not numbers")
    return arrays


def read_checkpoint_index(path):
    """TensorFlow's ``checkpoint`` index (a text proto) -> the latest checkpoint's prefix, or None
    when the index names none (empty, or every line damaged). Read without TensorFlow, which
    raises a bare ValueError on such an index from inside CheckpointManager."""
    latest = None
    for line in read_text(path, "TensorFlow's checkpoint index").splitlines():
        m = re.match(r'\s*model_checkpoint_path:\s*"((?:[^"\\]|\\.)+)"\s*$', line)
        if m:
            latest = m.group(1)
    if latest is None:
        return None
    return latest if os.path.isabs(latest) else os.path.join(os.path.dirname(path), latest)


def read_text(path, what, max_bytes=1 * MiB):
    """A small text file hvdps wrote itself (a checkpoint index, an elastic job id)."""
    return read_input(path, what, max_bytes=max_bytes, binary=False)


def read_metrics(path, fields=None):
    """All complete records of a metrics file, each checked against its type's schema and
    returned as its typed record (Header, Step, Eval, Summary).

    ``fields``: {backend: {record type: model}}, the fields each method adds to the records its
    trainer writes (hvdps/methods.py: ``record_fields``); the records after a header of that backend
    are validated and typed with them too. Without it, such fields are kept as they were written.

    A torn last line (a crash mid-write) is not a record and is dropped; lines that are not hvdps
    records at all (not JSON, not an object, no known ``type``) are skipped, so a foreign tool
    appending to the file does not stop the report. A record of a known type that breaks its
    schema (an accuracy of 7.5, a world size of 0) is refused: it would decide a verdict."""
    records, own = [], {}
    if not os.path.lexists(path):
        return records
    text = read_input(path, "a metrics file", max_bytes=MAX_METRICS, binary=False)
    lines = text.split("\n")
    for lineno, line in enumerate(lines[:-1], 1):       # the last piece has no newline: torn or empty
        try:
            rec = json.loads(line, parse_constant=_refuse_constant, parse_float=_finite_float)
        except (ValueError, RecursionError):
            if line.lstrip().startswith("{") and '"type"' in line and any(
                    f'"{t}"' in line for t in RECORDS):
                raise SchemaError(f"{path}:{lineno}: a record with a number JSON does not allow "
                                  f"(NaN, Infinity or past float range) or not valid JSON")
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("type"), str) or rec["type"] not in RECORDS:
            continue
        if _depth(rec) > MAX_DEPTH:
            raise SchemaError(f"{path}:{lineno}: nested deeper than {MAX_DEPTH} levels")
        if rec["type"] == "header":         # the method that wrote what follows, and its fields
            backend = validate(Header, rec, f"{path}:{lineno}").backend
            own = (fields or {}).get(backend) or {}
        records.append(validate(with_fields(RECORDS[rec["type"]], own.get(rec["type"])), rec, f"{path}:{lineno}"))
    return records


_CONFIG_MODEL = None


def config_model():
    """The schema of config.json, made from common.spec.config.Config's own fields (one list of fields,
    so a new flag cannot be missing here): each field's type, strictly; unknown keys refused."""
    global _CONFIG_MODEL
    if _CONFIG_MODEL is None:
        hints = typing.get_type_hints(Config)
        fields = {}
        for f in dataclasses.fields(Config):
            kind = hints[f.name]
            if kind in (typing.Tuple[int, ...],):
                kind = List[int]
            elif kind is float:
                kind = Finite
            elif kind == Optional[float]:
                kind = Optional[Finite]
            fields[f.name] = (kind, None)
        base = type("ConfigBase", (BaseModel,), {
            "model_config": ConfigDict(strict=True, extra="forbid", frozen=True),
            "to_config": lambda self: Config.from_dict(self.model_dump(exclude_unset=True)),
        })
        _CONFIG_MODEL = create_model("ConfigFile", __base__=base, **fields)
    return _CONFIG_MODEL


# Every format hvdps reads and its one reader; tests/test_schemas.py holds the rest of the code to it.
READERS = {
    "comm.json": "common.formats.schemas.read_comm",
    "cluster.json": "common.formats.schemas.read_cluster_description",
    "links.json": "common.formats.schemas.read_links",
    "compare_run.json": "common.formats.schemas.read_run_record",
    "load.json": "common.formats.schemas.read_load",
    "launch.json": "common.formats.schemas.read_launch_record",
    "metrics.jsonl": "common.formats.schemas.read_metrics",
    "config.json": "common.formats.schemas.read_config",
    "model_profiles.json": "common.formats.schemas.read_profiles",
    "dataset.json": "common.formats.schemas.read_record_set",
    "TFRecord (first record, before a run)": "common.inputs.records.check_first_record",
    "TFRecord (streamed by tf.data)": "common.inputs.records.stream",
    "hostfile": "common.launch.hosts.parse_hostfile",
    "cluster spec (JSON/YAML)": "tf_cluster.spec.parse_cluster_spec",
    "TF_CONFIG": "tf_cluster.spec.parse_tf_config",
    "weights.npz": "common.formats.schemas.read_weights",
    "checkpoint (TensorFlow's index)": "common.formats.schemas.read_checkpoint_index",
    "IDX": "common.inputs.data.read_idx",
    "NPZ": "common.inputs.data.load_mnist",
    "CRD schema (hostfiles/k8s/crds/)": "common.formats.schemas.read_crd_schema",
    "a JobSet pod's variables (TF_CONFIG from them)": "tf_cluster.jobset.pod_tf_config",
}
