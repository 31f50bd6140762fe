"""The metrics file both backends write, and the reader the report uses.

One JSON object per line in ``<train_dir>/metrics.jsonl``; the schema is in
docs/metrics.md. Only the chief / rank 0 writes (the writer is a no-op
elsewhere), and each record is flushed on its own line so a crash leaves a
readable prefix and a live progress bar can tail the file.
"""
import json
import math
import os
import platform
import socket
import statistics
import time

SCHEMA_VERSION = 3
RECORD_TYPES = ("header", "step", "eval", "summary")
HEADER_FIELDS = ("backend", "mode", "world_size", "num_ps", "batch_size_per_worker",
                 "global_batch_size", "model", "dataset", "config", "host", "versions")
STEP_FIELDS = ("global_step", "samples_seen", "wall_time", "loss", "samples_per_sec")
EVAL_FIELDS = ("epoch", "global_step", "wall_time", "loss", "accuracy")
SUMMARY_FIELDS = ("status", "total_time", "steps", "samples_seen", "throughput",
                  "time_to_target", "final_test_accuracy", "final_test_loss",
                  "grad_bytes_per_step")
BREAKDOWN_FIELDS = ("step_s", "compute_s", "overhead_s", "overhead_share", "exchange_s", "wait_s",
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


class MetricsWriter:
    def __init__(self, train_dir, enabled=True, name="metrics.jsonl"):
        self.enabled = enabled
        self.path = os.path.join(train_dir, name)
        self.start = time.time()
        self.target_time = None
        self._f = None
        if enabled:
            from common.files import make_dirs, open_append
            make_dirs(train_dir)
            self._f = open_append(self.path)

    def elapsed(self):
        return time.time() - self.start

    def _write(self, record):
        if self._f:
            try:
                self._f.write(json.dumps(record, sort_keys=True, default=_plain) + "\n")
                self._f.flush()
            except OSError as exc:          # a full disk: one line, and the records before stay whole
                from common.errors import RunError
                raise RunError(f"cannot write {self.path}: {exc.strerror}")

    def header(self, cfg, backend, mode, world_size, num_ps, plan, **extra):
        """``global_batch_size`` is what one update of the weights averages: b x n for
        all-reduce, b x R for sync PS, b for async PS (one worker batch per update)."""
        from common.data import data_fingerprint
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
                         grad_bytes_per_step=grad_bytes_per_step, **extra))

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
    """All complete records of a metrics file, each held to its schema (common/schemas.py)."""
    from common.schemas import read_metrics
    return read_metrics(path)


def measured_interval(header, steps):
    """(start, end) in Unix time of the intervals the throughput is taken over (warm-up
    excluded), or None: from the step record where the first counted interval began (the first
    past the warm-up, ThroughputMeter) to the last counted."""
    start = header.get("start_time")
    counted = [i for i, s in enumerate(steps) if s.get("samples_per_sec") is not None]
    if not counted or not isinstance(start, (int, float)):
        return None
    begin = counted[0] - 1
    warmup = (header.get("config") or {}).get("warmup_steps")
    if isinstance(warmup, int):
        past = warmup + (header.get("start_step") or 0)
        begin = next((i for i in range(counted[0]) if (steps[i].get("global_step") or 0) >= past), begin)
    first = steps[begin]["wall_time"] if begin >= 0 else 0.0
    last = steps[counted[-1]]["wall_time"]
    return (start + first, start + last) if last > first else None


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
    from common.schemas import read_launch_record
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
    marks = [s for i, s in enumerate(steps) if s.get("sync_wait_total_s") is not None and s.get("worker_steps")
             and (s.get("samples_per_sec") is not None or
                  (i + 1 < len(steps) and steps[i + 1].get("samples_per_sec") is not None))]
    if len(marks) < 2:
        return None
    first, last = marks[0], marks[-1]
    pairs = list(zip(first["sync_wait_total_s"], last["sync_wait_total_s"], first["worker_steps"],
                     last["worker_steps"]))
    if any(w1 < w0 or n1 <= n0 for w0, w1, n0, n1 in pairs):
        return None
    return [(w1 - w0) / (n1 - n0) for w0, w1, n0, n1 in pairs]


def load_run(run_dir, name="metrics.jsonl"):
    """One run as a flat row for tables, plus its curves. Missing parts become None."""
    recs = read_records(os.path.join(run_dir, name))
    header = next((r for r in recs if r["type"] == "header"), {})
    summary = next((r for r in reversed(recs) if r["type"] == "summary"), {})
    evals = [r for r in recs if r["type"] == "eval"]
    steps = [r for r in recs if r["type"] == "step"]
    tp = summary.get("throughput") or {}
    row = {
        "run_dir": run_dir,
        "backend": header.get("backend"), "mode": header.get("mode"),
        "workers": header.get("world_size"), "num_ps": header.get("num_ps"),
        "model": header.get("model"), "dataset": header.get("dataset"),
        "batch_per_worker": header.get("batch_size_per_worker"),
        "global_batch": header.get("global_batch_size"),
        "status": summary.get("status", "incomplete"),
        "samples_per_sec_median": tp.get("median"), "samples_per_sec_mean": tp.get("mean"),
        "samples_per_sec_error": tp.get("error"), "intervals": tp.get("n"),
        "target_accuracy": (header.get("config") or {}).get("target_accuracy"),
        "time_to_target": summary.get("time_to_target"),
        "final_test_accuracy": summary.get("final_test_accuracy",
                                           evals[-1].get("accuracy") if evals else None),
        "final_test_loss": summary.get("final_test_loss", evals[-1].get("loss") if evals else None),
        "final_train_loss": steps[-1].get("loss") if steps else None,
        "grad_bytes_per_step": summary.get("grad_bytes_per_step"),
        "wall_time": summary.get("total_time"),
        "steps": summary.get("steps"),
    }
    split = summary.get("breakdown") or {}
    wire = summary.get("wire") if isinstance(summary.get("wire"), dict) else {}
    for key in BREAKDOWN_FIELDS:
        row[key] = split.get(key, wire.get(key))
    gradient = summary.get("gradient") if isinstance(summary.get("gradient"), dict) else {}
    row["sparse_bytes"], row["sparse_table_bytes"] = gradient.get("sparse_bytes"), gradient.get("sparse_table_bytes")
    row["wire_rule"] = wire.get("wire_rule") or split.get("wire_rule")
    row["wait_per_worker_s"] = wait_per_worker(steps)
    interval = measured_interval(header, steps)
    row["ps_cpu_s"] = _ps_cpu_seconds(run_dir, interval)
    if row["ps_cpu_s"] is not None:
        row["ps_cpu_share"] = row["ps_cpu_s"] / (max(1, row["num_ps"] or 1) * (interval[1] - interval[0]))
    return row, {"header": header, "evals": evals, "steps": steps, "summary": summary}
