"""The metrics file both backends write, and the reader the report uses.

One JSON object per line in ``<train_dir>/metrics.jsonl``; the schema is in
docs/metrics.md. Only the chief / rank 0 writes (the writer is a no-op
elsewhere), and each record is flushed on its own line so a crash leaves a
readable prefix and a live progress bar can tail the file.
"""
import dataclasses
import json
import math
import os
import platform
import socket
import statistics
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from common.formats.schemas import Eval, Header, Step, Summary

SCHEMA_VERSION = 3
RECORD_TYPES = ("header", "step", "eval", "summary")
HEADER_FIELDS = ("backend", "mode", "world_size", "num_ps", "batch_size_per_worker",
                 "global_batch_size", "model", "dataset", "config", "host", "versions")
STEP_FIELDS = ("global_step", "samples_seen", "wall_time", "loss", "samples_per_sec")
EVAL_FIELDS = ("epoch", "global_step", "wall_time", "loss", "accuracy")
SUMMARY_FIELDS = ("status", "total_time", "steps", "samples_seen", "throughput",
                  "time_to_target", "final_test_accuracy", "final_test_loss",
                  "grad_bytes_per_step")
BREAKDOWN_FIELDS = ("step_s", "compute_s", "overhead_s", "overhead_share", "exchange_s", "wait_s", "input_s",
                    "input_share",
                    "bytes_per_step_per_worker", "bytes_per_update_per_ps")


def library_versions():
    """Installed versions, read from package metadata: nothing is imported (common/ stays
    free of Horovod and tf.distribute imports)."""
    from importlib import metadata
    versions = {"python": platform.python_version()}
    for key, dist in (("tensorflow", "tensorflow-cpu"), ("horovod", "horovod"), ("numpy", "numpy"),
                      ("mpi4py", "mpi4py"), ("tf_keras", "tf-keras"), ("keras", "keras")):
        for name in (key, dist):
            try:
                versions[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                versions[key] = None
    return versions


def throughput_stats(rates):
    """Median, mean and 95% half-width (1.96 standard errors) of per-interval samples/sec.

    One interval has no spread to measure: its ``error`` is None (unknown), never 0."""
    rates = [float(r) for r in rates if r is not None and math.isfinite(r) and r > 0]
    if not rates:
        return {"median": None, "mean": None, "error": None, "n": 0}
    mean = statistics.fmean(rates)
    err = 1.96 * statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else None
    return {"median": statistics.median(rates), "mean": mean, "error": err, "n": len(rates)}


def format_throughput(stats):
    if not stats or stats.get("mean") is None:
        return "n/a"
    spread = (f"+/- {stats['error']:.1f}" if stats.get("error") is not None
              else "(one interval: no spread)")
    return f"{stats['mean']:.1f} {spread} (median {stats['median']:.1f})"


class ThroughputMeter:
    """Samples/sec per logging interval, ignoring the first ``warmup_steps`` steps.

    Warm-up steps include graph tracing, Horovod's first negotiation and the PS
    variable fetches; counting them would penalise whichever backend starts slower.

    An interval closes only once it spans ``min_span`` updates or more (RunPlan.updates_per_round):
    asynchronous workers each add an update, and an interval shorter than one update per worker
    times whichever ones happen to land in it, so its rate swings with the workers' phase (a
    coordinator that fetches a step finds the next few already done: bursts of 10k samples/s
    between gaps of 100).
    """

    def __init__(self, warmup_steps, min_span=1):
        self.warmup_steps = warmup_steps
        self.min_span = max(1, int(min_span))
        self.rates = []
        self._mark = None   # (step, samples, time) at the start of the current interval

    def update(self, step, samples_seen, now=None):
        """Record progress; returns the rate of the interval just closed, or None."""
        now = time.perf_counter() if now is None else now
        if step < self.warmup_steps:
            return None
        if self._mark is None or step <= self._mark[0]:
            self._mark = (step, samples_seen, now)
            return None
        if step - self._mark[0] < self.min_span:
            return None
        _, samples0, t0 = self._mark
        self._mark = (step, samples_seen, now)
        if now <= t0:
            return None
        rate = (samples_seen - samples0) / (now - t0)
        self.rates.append(rate)
        return rate

    def stats(self):
        return throughput_stats(self.rates)


def peak_rss_mib():
    """This process's peak resident memory (getrusage: KiB on Linux), in MiB: the process that writes
    the summary, the chief or rank 0; what streaming bounds and loading a data set whole does not."""
    import resource
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


class MetricsWriter:
    def __init__(self, train_dir, enabled=True, name="metrics.jsonl"):
        self.enabled = enabled
        self.path = os.path.join(train_dir, name)
        self.start = time.time()           # when, for the header; durations use the monotonic clock
        self._t0 = time.monotonic()
        self.target_time = None
        self._f = None
        if enabled:
            from common.base.files import make_dirs, open_append
            make_dirs(train_dir)
            self._f = open_append(self.path)

    def elapsed(self):
        return time.monotonic() - self._t0

    def _write(self, record):
        if self._f:
            try:
                self._f.write(json.dumps(record, sort_keys=True, default=_plain) + "\n")
                self._f.flush()
            except OSError as exc:          # a full disk: one line, and the records before stay whole
                from common.base.errors import RunError
                raise RunError(f"cannot write {self.path}: {exc.strerror}")

    def header(self, cfg, backend, mode, world_size, num_ps, plan, **extra):
        """``global_batch_size`` is what one update of the weights averages: b x n for
        all-reduce, b x R for sync PS, b for async PS (one worker batch per update)."""
        from common.inputs.data import data_fingerprint
        self._write(dict(type="header", schema_version=SCHEMA_VERSION, backend=backend, mode=mode,
                         world_size=world_size, num_ps=num_ps,
                         batch_size_per_worker=cfg.batch_size,
                         global_batch_size=plan.samples_per_update, plan=plan.to_dict(),
                         model=cfg.model, dataset=cfg.dataset, config=cfg.to_dict(),
                         data_fingerprint=data_fingerprint(cfg),
                         host=socket.gethostname(), cpus=os.cpu_count(),
                         versions=library_versions(), start_time=self.start, **extra))

    def step(self, global_step, samples_seen, loss, samples_per_sec, **extra):
        self._write(dict(type="step", global_step=int(global_step), samples_seen=int(samples_seen),
                         wall_time=self.elapsed(), loss=_num(loss),
                         samples_per_sec=_num(samples_per_sec), **extra))

    def eval(self, epoch, global_step, loss, accuracy, target=None, **extra):
        now = self.elapsed()
        if target is not None and self.target_time is None and accuracy >= target:
            self.target_time = now
        self._write(dict(type="eval", split="test", epoch=epoch, global_step=int(global_step),
                         wall_time=now, loss=_num(loss), accuracy=_num(accuracy), **extra))

    def summary(self, status, steps, samples_seen, throughput, final_loss, final_accuracy,
                grad_bytes_per_step, **extra):
        self._write(dict(type="summary", status=status, total_time=self.elapsed(), steps=int(steps),
                         samples_seen=int(samples_seen), throughput=throughput,
                         time_to_target=self.target_time, final_test_accuracy=_num(final_accuracy),
                         final_test_loss=_num(final_loss),
                         grad_bytes_per_step=grad_bytes_per_step, peak_rss_mib=peak_rss_mib(), **extra))

    def close(self):
        if self._f:
            self._f.close()
            self._f = None


def _plain(x):
    """NumPy scalars/arrays (TF session results) as plain JSON values."""
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def _num(x):
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------- reading back
def read_records(path):
    """All complete records of a metrics file as plain dicts, each held to its schema
    (common/formats/schemas.py): for code that copies or re-writes records (a resumed run's bookkeeping).
    What reads a run to report on it takes ``load_run``'s typed records."""
    return [r.model_dump(exclude_unset=True) for r in read_metrics(path)]


def read_metrics(path):
    """All complete records of a metrics file, as the schema's typed records."""
    from common.formats.schemas import read_metrics as read
    return read(path)


@dataclasses.dataclass(frozen=True)
class Curves:
    """A run's records as validated (common/formats/schemas.py): the header and the summary when the
    run wrote them, every step and evaluation in order."""
    header: Optional["Header"] = None
    steps: Tuple["Step", ...] = ()
    evals: Tuple["Eval", ...] = ()
    summary: Optional["Summary"] = None


# A run is *shared* when, over its measured interval, anything but its own processes and the
# comparison used more than this share of the machine's cores (hvdps/measure/load.py).
SHARED_SHARE = 0.10


@dataclasses.dataclass(slots=True)
class RunRow:
    """One run as the comparison's tables, verdicts and projections read it: the figures its
    records hold (``load_run``), then what the comparison adds (``hvdps/measure/runs.py``: the
    launcher's outcome, start-up, links, scaling). Every figure a run may lack is Optional and is
    handled where it is read; a misspelt field is an AttributeError here, not a silent None."""
    run_dir: str
    backend: Optional[str] = None
    mode: Optional[str] = None
    workers: Optional[int] = None
    num_ps: Optional[int] = None
    model: Optional[str] = None
    dataset: Optional[str] = None
    batch_per_worker: Optional[int] = None
    global_batch: Optional[int] = None
    status: str = "incomplete"
    samples_per_sec_median: Optional[float] = None
    samples_per_sec_mean: Optional[float] = None
    samples_per_sec_error: Optional[float] = None
    intervals: Optional[int] = None
    target_accuracy: Optional[float] = None
    time_to_target: Optional[float] = None
    final_test_accuracy: Optional[float] = None
    final_test_loss: Optional[float] = None
    final_train_loss: Optional[float] = None
    grad_bytes_per_step: Optional[float] = None
    wall_time: Optional[float] = None
    steps: Optional[int] = None
    step_s: Optional[float] = None
    compute_s: Optional[float] = None
    overhead_s: Optional[float] = None
    overhead_share: Optional[float] = None
    exchange_s: Optional[float] = None
    wait_s: Optional[float] = None
    input_s: Optional[float] = None
    input_share: Optional[float] = None
    bytes_per_step_per_worker: Optional[float] = None
    bytes_per_update_per_ps: Optional[float] = None
    sparse_bytes: Optional[float] = None
    sparse_table_bytes: Optional[float] = None
    wire_rule: Optional[str] = None
    wait_per_worker_s: Optional[List[float]] = None
    ps_cpu_s: Optional[float] = None
    ps_cpu_share: Optional[float] = None
    curves: Curves = Curves()
    # what the comparison adds (hvdps/measure/runs.py)
    error: Optional[str] = None
    oversubscribed: bool = False
    warmup_s: Optional[float] = None
    warmup_share: Optional[float] = None
    startup_s: Optional[float] = None
    teardown_s: Optional[float] = None
    roles: Optional[Dict[str, Any]] = None
    cores_busy: Optional[float] = None
    links: Optional[List[Dict[str, Any]]] = None
    busiest_link_bytes: Optional[float] = None
    busiest_link_predicted: Optional[float] = None
    link_bytes_ratio: Optional[float] = None
    round_s: Optional[float] = None
    link_rate_bps: Optional[float] = None
    link_utilisation: Optional[float] = None
    scaling_efficiency: Optional[float] = None
    # the machine's other load over the measured interval (hvdps/measure/load.py): cores the rest of
    # the machine used, cores the job used, the machine's cores, and whether that made the run shared
    others_cores: Optional[float] = None
    job_cores: Optional[float] = None
    machine_cores: Optional[int] = None
    shared: Optional[bool] = None
    # repeated runs (hvdps compare --repeat; hvdps/measure/repeats.py): which run this is, and on a
    # configuration's row its runs' count and their own figures
    repeat: Optional[int] = None
    repeats: Optional[int] = None
    repeats_ok: Optional[int] = None
    repeat_throughputs: Optional[List[float]] = None
    repeat_times: Optional[List[Optional[float]]] = None

    @property
    def name(self):
        """The run's folder name, as the report and the projection's tables call it."""
        return os.path.basename(self.run_dir.rstrip(os.sep)) or self.run_dir

    @property
    def header(self):
        return self.curves.header

    @property
    def ps_shard_bytes(self):
        """PS: {task: model bytes it holds} as the run recorded it (header), or None."""
        return self.curves.header.ps_shard_bytes if self.curves.header else None

    def column(self, key):
        """A table column's value by name (results.csv, results.json)."""
        return getattr(self, key)


def measured_interval(header, steps):
    """(start, end) in Unix time of the intervals the throughput is taken over (warm-up
    excluded), or None: from the step record where the first counted interval began (the first
    past the warm-up, ThroughputMeter) to the last counted."""
    counted = [i for i, s in enumerate(steps) if s.samples_per_sec is not None]
    if not counted or header is None or header.start_time is None:
        return None
    begin = counted[0] - 1
    warmup = header.config.warmup_steps if header.config else None
    if warmup is not None:
        past = warmup + header.start_step
        begin = next((i for i in range(counted[0]) if steps[i].global_step >= past), begin)
    first = steps[begin].wall_time if begin >= 0 else 0.0
    last = steps[counted[-1]].wall_time
    return (header.start_time + first, header.start_time + last) if last > first else None


def _cpu_at(series, t):
    """CPU seconds of one process at Unix time ``t``, linear between the launcher's samples."""
    before = [p for p in series if p[0] <= t]
    after = [p for p in series if p[0] >= t]
    if not before or not after:
        return None
    (t0, c0), (t1, c1) = before[-1], after[0]
    return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def _ps_cpu_seconds(run_dir, interval):
    """CPU seconds the PS tasks spent in the measured interval, from the local launcher's samples
    (launch.json's cpu_series); None when the run was not started by it or the samples do not
    cover the interval. Whole-process totals would count start-up and imports against a
    training-only time."""
    from common.formats.schemas import read_launch_record
    path = os.path.join(run_dir, "launch.json")
    if not interval or not os.path.lexists(path):
        return None
    series = read_launch_record(path).cpu_series
    total = 0.0
    for name, points in series.items():
        if not name.startswith("ps:"):
            continue
        a, b = _cpu_at(points, interval[0]), _cpu_at(points, interval[1])
        if a is None or b is None:
            return None
        total += b - a
    return total if series else None


def wait_per_worker(steps):
    """Sync PS: each worker's mean wait for its token per step of its own, over the measured
    intervals (warm-up excluded, as the throughput); None without the records or across a reset."""
    marks = [s for i, s in enumerate(steps) if s.sync_wait_total_s is not None and s.worker_steps
             and (s.samples_per_sec is not None or
                  (i + 1 < len(steps) and steps[i + 1].samples_per_sec is not None))]
    if len(marks) < 2:
        return None
    first, last = marks[0], marks[-1]
    pairs = list(zip(first.sync_wait_total_s, last.sync_wait_total_s, first.worker_steps, last.worker_steps))
    if not pairs or len({len(first.sync_wait_total_s), len(last.sync_wait_total_s), len(first.worker_steps),
                         len(last.worker_steps)}) != 1 or any(w1 < w0 or n1 <= n0 for w0, w1, n0, n1 in pairs):
        return None
    return [(w1 - w0) / (n1 - n0) for w0, w1, n0, n1 in pairs]


def load_run(run_dir, name="metrics.jsonl"):
    """One run's typed row for tables, with its records (``row.curves``). What a run lacks is None."""
    recs = read_metrics(os.path.join(run_dir, name))
    header = next((r for r in recs if r.type == "header"), None)
    summary = next((r for r in reversed(recs) if r.type == "summary"), None)
    evals = tuple(r for r in recs if r.type == "eval")
    steps = tuple(r for r in recs if r.type == "step")
    curves = Curves(header=header, steps=steps, evals=evals, summary=summary)
    row = RunRow(run_dir=run_dir, curves=curves)
    if header is not None:
        row.backend, row.mode, row.workers, row.num_ps = header.backend, header.mode, header.world_size, header.num_ps
        row.model, row.dataset = header.model, header.dataset
        row.batch_per_worker, row.global_batch = header.batch_size_per_worker, header.global_batch_size
        row.target_accuracy = header.config.target_accuracy if header.config else None
    last_eval = evals[-1] if evals else None
    row.final_train_loss = steps[-1].loss if steps else None
    row.final_test_accuracy = last_eval.accuracy if last_eval else None
    row.final_test_loss = last_eval.loss if last_eval else None
    if summary is not None:
        row.status = summary.status or row.status
        tp = summary.throughput
        if tp is not None:
            row.samples_per_sec_median, row.samples_per_sec_mean = tp.median, tp.mean
            row.samples_per_sec_error, row.intervals = tp.error, tp.n
        row.time_to_target, row.wall_time, row.steps = summary.time_to_target, summary.total_time, summary.steps
        if "final_test_accuracy" in summary.model_fields_set:
            row.final_test_accuracy = summary.final_test_accuracy
        if "final_test_loss" in summary.model_fields_set:
            row.final_test_loss = summary.final_test_loss
        row.grad_bytes_per_step = summary.grad_bytes_per_step
        split, wire = summary.breakdown, summary.wire
        for key in BREAKDOWN_FIELDS:
            value = getattr(split, key, None) if split is not None else None
            setattr(row, key, value if value is not None else getattr(wire, key, None))
        if summary.gradient is not None:
            row.sparse_bytes, row.sparse_table_bytes = summary.gradient.sparse_bytes, summary.gradient.sparse_table_bytes
        row.wire_rule = (wire.wire_rule if wire else None) or (split.wire_rule if split else None)
    row.wait_per_worker_s = wait_per_worker(steps)
    interval = measured_interval(header, steps)
    row.ps_cpu_s = _ps_cpu_seconds(run_dir, interval)
    if row.ps_cpu_s is not None:
        row.ps_cpu_share = row.ps_cpu_s / (max(1, row.num_ps or 1) * (interval[1] - interval[0]))
    return row
