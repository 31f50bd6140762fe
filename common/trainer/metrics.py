"""The metrics file every trainer writes, and the records read back (the application's typed row of
a run is hvdps/measure/rows.py).

One JSON object per line in ``<train_dir>/metrics.jsonl``; the schema is in
docs/metrics.md. Only the chief / rank 0 writes (the writer is a no-op
elsewhere), and each record is flushed on its own line so a crash leaves a
readable prefix and a live progress bar can tail the file.
"""
import json
import math
import os
import platform
import resource
import socket
import statistics
import time
from importlib import metadata

from common.formats.schemas import read_metrics as read
from common.base.files import make_dirs, open_append
from common.base.errors import RunError
from common.inputs.data import data_fingerprint, data_shards, input_fed
from common.spec.precision import of_config as precision_of

SCHEMA_VERSION = 3
RECORD_TYPES = ("header", "step", "eval", "summary")
HEADER_FIELDS = ("backend", "mode", "world_size", "tasks", "batch_size_per_worker",
                 "global_batch_size", "model", "dataset", "config", "host", "versions")
STEP_FIELDS = ("global_step", "samples_seen", "wall_time", "loss", "samples_per_sec")
EVAL_FIELDS = ("epoch", "global_step", "wall_time", "loss", "accuracy")
SUMMARY_FIELDS = ("status", "total_time", "steps", "samples_seen", "throughput",
                  "time_to_target", "final_test_accuracy", "final_test_loss",
                  "grad_bytes_per_step")
BREAKDOWN_FIELDS = ("step_s", "compute_s", "overhead_s", "overhead_share", "exchange_s", "wait_s", "input_s",
                    "input_share", "bytes_per_step_per_worker")


def library_versions():
    """Installed versions, read from package metadata: nothing is imported (common/ stays
    free of Horovod and tf.distribute imports)."""
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

    def pause(self):
        """An evaluation or a checkpoint has just ended: the interval it fell in is dropped, and the
        next one begins at the first update after it (``resume``). Counted, a pause would be throughput
        in one run and not in another: a synchronous job stops for its evaluation, an asynchronous
        chief's peers keep training through it, and with an evaluation every epoch of a small set half
        the intervals held one, enough to move the median."""
        self._mark = None

    def resume(self, step, samples_seen, now=None):
        """The first update after a pause: the next interval begins here (an asynchronous chief's
        step already counts what its peers made meanwhile), not at the next logged update."""
        if self._mark is None and step >= self.warmup_steps:
            self._mark = (step, samples_seen, time.perf_counter() if now is None else now)

    def stats(self):
        return throughput_stats(self.rates)


def peak_rss_mib():
    """This process's peak resident memory (getrusage: KiB on Linux), in MiB: the process that writes
    the summary, the chief or rank 0; what streaming bounds and loading a data set whole does not."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


class MetricsWriter:
    def __init__(self, train_dir, enabled=True, name="metrics.jsonl"):
        self.enabled = enabled
        self.path = os.path.join(train_dir, name)
        self.start = time.time()           # when, for the header; durations use the monotonic clock
        self._t0 = time.monotonic()
        self.target_time = None
        self.first_update_s = None         # when the first update ended: time to target counts from there
        self._f = None
        if enabled:
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
                raise RunError(f"cannot write {self.path}: {exc.strerror}")

    def header(self, cfg, backend, mode, world_size, tasks, plan, **extra):
        """``global_batch_size`` is what one update of the weights averages: b x n for
        all-reduce, b x R for sync PS, b for async PS (one worker batch per update)."""
        self._write(dict(type="header", schema_version=SCHEMA_VERSION, backend=backend, mode=mode,
                         world_size=world_size, tasks=dict(tasks),
                         batch_size_per_worker=cfg.batch_size,
                         global_batch_size=plan.samples_per_update, plan=plan.to_dict(),
                         model=cfg.model, dataset=cfg.dataset, config=cfg.to_dict(),
                         data_fingerprint=data_fingerprint(cfg), data_shards=data_shards(cfg),
                         input=input_fed(cfg), precision=precision_of(cfg).to_dict(),
                         host=socket.gethostname(), cpus=os.cpu_count(),
                         versions=library_versions(), start_time=self.start, **extra))

    def step(self, global_step, samples_seen, loss, samples_per_sec, **extra):
        self._write(dict(type="step", global_step=int(global_step), samples_seen=int(samples_seen),
                         wall_time=self.elapsed(), loss=_num(loss),
                         samples_per_sec=_num(samples_per_sec), **extra))

    def training_started(self):
        """The first update has ended. Time to the target counts from here: what came before (the
        process's start, the model, the data, tracing the step, the first exchange) is start-up, which
        a long job pays once and the report gives beside it."""
        if self.first_update_s is None:
            self.first_update_s = self.elapsed()

    def eval(self, epoch, global_step, loss, accuracy, target=None, **extra):
        now = self.elapsed()
        if target is not None and self.target_time is None and accuracy >= target:
            self.target_time = max(0.0, now - (self.first_update_s or 0.0))
        self._write(dict(type="eval", split="test", epoch=epoch, global_step=int(global_step),
                         wall_time=now, loss=_num(loss), accuracy=_num(accuracy), **extra))

    def summary(self, status, steps, samples_seen, throughput, final_loss, final_accuracy,
                grad_bytes_per_step, **extra):
        self._write(dict(type="summary", status=status, total_time=self.elapsed(), steps=int(steps),
                         samples_seen=int(samples_seen), throughput=throughput,
                         time_to_target=self.target_time, first_update_s=self.first_update_s,
                         final_test_accuracy=_num(final_accuracy),
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
def read_metrics(path):
    """All complete records of a metrics file, as the schema's typed records."""
    return read(path)
