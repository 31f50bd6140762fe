"""A run as the application reads it back: its records (``Curves``) and the typed row the comparison's
tables, verdicts and projections read (``RunRow``), built once by ``load_run`` from the records the
trainers write (common/trainer/metrics.py) and the figures its method measures of its own
(``Method.measures``: the parameter servers' CPU, per-worker waits and dropped gradients,
ps_train/method.py), with the fields each method adds to the records (``Method.records``)."""
import dataclasses
import os
import statistics
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from common.formats.schemas import read_metrics
from common.trainer.metrics import BREAKDOWN_FIELDS
from hvdps import methods
from hvdps.measure.identity import settings_text, tasks_text, workload_name

if TYPE_CHECKING:
    from common.formats.schemas import Eval, Gradient, Header, Step


@dataclasses.dataclass(frozen=True)
class Curves:
    """A run's records over time as validated (common/formats/schemas.py): the header when the run
    wrote one, every step and evaluation in order. The summary is not kept: its figures are the
    row's own fields (``summary_figures``), each held once."""
    header: Optional["Header"] = None
    steps: Tuple["Step", ...] = ()
    evals: Tuple["Eval", ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Startup:
    """What a run costs around its measured steps (hvdps/measure/runs.py: ``startup_of``): the trainer's
    warm-up before its first measured interval and its share of the trainer's wall time, the start-up
    from launch to that point, and the teardown from the trainer's end to the job's exit."""
    warmup_s: Optional[float] = None
    warmup_share: Optional[float] = None
    startup_s: Optional[float] = None
    teardown_s: Optional[float] = None


@dataclasses.dataclass(frozen=True, slots=True)
class Links:
    """What each host's link carried, where its counters were sampled (hvdps emulate;
    hvdps/measure/runs.py: ``links_of``): a LinkRow per host (hvdps/measure/links.py), the busiest
    link's bytes per round against its method's formula, the round, and the link that came nearest its
    rate (a slow link's before the busiest) with each host's own rate."""
    hosts: Tuple[Any, ...] = ()
    busiest_link_bytes: Optional[float] = None
    busiest_link_predicted: Optional[float] = None
    link_bytes_ratio: Optional[float] = None
    round_s: Optional[float] = None
    link_rate_bps: Optional[float] = None
    link_utilisation: Optional[float] = None      # the fullest link's share of its own rate
    busiest_link: Optional[str] = None            # the host whose link carried the most bytes
    fullest_link: Optional[str] = None            # the host whose link came nearest its rate (a slow link's)
    fullest_link_bps: Optional[float] = None
    link_rates: Optional[Dict[str, float]] = None # each host's own link rate (hvdps emulate --link)


@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """The machine's other load over a run's measured interval (hvdps/measure/load.py): cores the rest
    of the machine used, cores the job used, cores the hypervisor gave other tenants (steal), cores the
    kernel's own threads used, the machine's cores, and whether that made the run shared."""
    others_cores: Optional[float] = None
    job_cores: Optional[float] = None
    hypervisor_cores: Optional[float] = None
    kernel_cores: Optional[float] = None
    machine_cores: Optional[int] = None
    shared: Optional[bool] = None


@dataclasses.dataclass(frozen=True, slots=True)
class RunRow:
    """One run as the comparison's tables, verdicts and projections read it: the figures its
    records hold (``load_run``), then what the comparison adds (``hvdps/measure/runs.py``: the
    launcher's outcome, start-up, links, scaling). Every figure a run may lack is Optional and is
    handled where it is read; a misspelt field is an AttributeError here, not a silent None. Frozen:
    each step that adds figures makes a new row (``dataclasses.replace``), so a row a table or a
    verdict read is the row the report prints."""
    run_dir: str
    backend: Optional[str] = None
    mode: Optional[str] = None
    workers: Optional[int] = None
    tasks: Tuple[Tuple[str, int], ...] = ()    # its tasks besides the workers, by role (("ps", 2),)
    model: Optional[str] = None              # the workload: the model, its precision and xla (workload_of)
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
    gradient: Optional["Gradient"] = None         # one worker's gradient of one batch, as measured
    peak_rss_mib: Optional[float] = None          # the chief's (rank 0's) peak resident memory
    float32_compute_s: Optional[float] = None     # an emulated policy's run: its compute step timed in float32
    wire_rule: Optional[str] = None
    curves: Curves = Curves()
    # what its method measures of its own (``Method.measures``: an instance of its ``measured``), or None
    measured: Optional[Any] = None
    # what the comparison adds (hvdps/measure/runs.py)
    error: Optional[str] = None
    oversubscribed: bool = False
    startup: Startup = Startup()
    roles: Optional[Dict[str, Any]] = None
    cores_busy: Optional[float] = None
    links: Links = Links()
    scaling_efficiency: Optional[float] = None
    # a slow or stalled worker (hvdps compare --straggler / --stall): the run's folder suffix, None for
    # a healthy run, and what was applied (common/formats/schemas.py: Unhealthy)
    condition: Optional[str] = None
    unhealthy: Optional[Any] = None
    rank_steps: Optional[Dict[str, Any]] = None   # {task: its step times' n, p50, p95, max} (ranks/<task>.json)
    left_out: Tuple[str, ...] = ()                # its files that did not read ("ranks/rank:1.json: why")
    load: Load = Load()
    # repeated runs (hvdps compare --repeat; hvdps/measure/repeats.py): which run this is, and on a
    # configuration's row its runs' count and their own figures
    repeat: Optional[int] = None
    repeats: Optional[int] = None
    repeats_ok: Optional[int] = None
    repeat_throughputs: Optional[List[float]] = None
    repeat_times: Optional[List[Optional[float]]] = None
    identity: Optional[Any] = None                # which run it is (hvdps/measure/identity.py: RunId)

    @property
    def name(self):
        """The run's folder name, as the report and the projection's tables call it."""
        return os.path.basename(self.run_dir.rstrip(os.sep)) or self.run_dir

    @property
    def header(self):
        return self.curves.header

    @property
    def settings(self):
        """Its method's own settings it ran at ((name, value), ...: its identity's), () at the defaults."""
        return self.identity.settings if self.identity is not None else ()

    @property
    def method(self):
        """Its method's registry entry (hvdps/methods.py), resolved here for every reader; None for a
        run of a method this version does not know."""
        return methods.lookup(self.backend) if self.backend else None

    @property
    def shard_bytes(self):
        """{server task: model bytes it holds} as the run recorded it, where its method has server
        tasks that hold shares of the model (``Method.shard_bytes``), or None."""
        method = self.method if self.header is not None else None
        return method.shard_bytes(self.header) if method else None

    @property
    def sparse_bytes(self):
        """Bytes of an embedding gradient's looked-up rows and their ids, one batch (the gradient's)."""
        return self.gradient.sparse_bytes if self.gradient else None

    @property
    def sparse_table_bytes(self):
        """Bytes of the embedding tables those rows come from (the gradient's)."""
        return self.gradient.sparse_table_bytes if self.gradient else None

    @property
    def precision(self):
        """The policy it trained in and why (its header's PrecisionChosen), or None for a run that recorded none."""
        return self.header.precision if self.header is not None else None

    @property
    def target_at_first_eval(self):
        """Whether its first evaluation already reached its target accuracy: its time to the target then
        measures how soon it first evaluated, not how fast it trained to the target."""
        first = self.curves.evals[0] if self.curves.evals else None
        return (self.time_to_target is not None and first is not None and first.accuracy is not None
                and self.target_accuracy is not None and first.accuracy >= self.target_accuracy)


    @property
    def target_window(self):
        """(earliest, latest) seconds in which it crossed its target: from its last evaluation below the
        target (0 where the first was already at it) to the first at or above it (its time to the target),
        or None where it never reached it. Two runs whose windows overlap are not told apart by time."""
        if self.time_to_target is None or self.target_accuracy is None:
            return None
        hit = next((i for i, e in enumerate(self.curves.evals)
                    if e.accuracy is not None and e.accuracy >= self.target_accuracy), None)
        if hit is None:
            return (self.time_to_target, self.time_to_target)
        if hit == 0:
            return (0.0, self.time_to_target)
        before = self.curves.evals[hit - 1].wall_time - self.curves.evals[hit].wall_time + self.time_to_target
        return (max(0.0, before), self.time_to_target)

    def column(self, key):
        """A table column's value by name (results.csv, results.json): the row's own, else its
        method's measures' (None for a run of another method)."""
        if key == "tasks":
            return tasks_text(self.tasks) or None
        if key == "settings":
            return settings_text(self.settings) or None
        if key in _OWN:
            return getattr(self, key)
        for part in (self.startup, self.links, self.load):
            if key in _PARTS[type(part)]:
                return getattr(part, key)
        if key not in methods.measured_columns():
            raise AttributeError(f"RunRow has no column {key!r}")
        return getattr(self.measured, key, None)


# the row's columns: its fields, and the figures it reads from its gradient
_OWN = frozenset(f.name for f in dataclasses.fields(RunRow)) | {"sparse_bytes", "sparse_table_bytes"}
_PARTS = {part: frozenset(f.name for f in dataclasses.fields(part)) for part in (Startup, Links, Load)}


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


def steady_rate(row):
    """Samples/s: the median of the logging intervals that began with every worker in (its method's
    ``Method.all_in``: every interval where its records do not count each worker's steps), else the
    row's median. A worker slowed by a CPU quota also starts slowly (its TensorFlow import and graph
    at its quota) while asynchronous workers already train without it: those first intervals are the
    job's start-up, not the pace it keeps."""
    method = row.method
    steps = row.curves.steps
    rates = [s.samples_per_sec for before, s in zip(steps, steps[1:])
             if s.samples_per_sec and (method is None or method.all_in(before))]
    return statistics.median(rates) if rates else row.samples_per_sec_median


def interval_rate(row):
    """Samples/s over the whole measured interval (the samples it saw over its wall time), or None:
    what a run kept where a few intervals were slow (a stalled worker), which the median and the mean of
    the intervals' rates (each interval one vote) leave out. A logging interval an evaluation fell in
    (and the epoch's checkpoint after it) is left out, as the trainer's own rates leave it out
    (common/trainer/metrics.py: ThroughputMeter.pause)."""
    steps, header = row.curves.steps, row.curves.header
    span = measured_interval(header, steps)
    if span is None:
        return None
    inside = [s for s in steps if span[0] <= header.start_time + s.wall_time <= span[1]]
    paused = [e.wall_time for e in row.curves.evals]
    samples = seconds = 0.0
    for a, b in zip(inside, inside[1:]):
        if b.wall_time > a.wall_time and not any(a.wall_time < t <= b.wall_time for t in paused):
            samples += b.samples_seen - a.samples_seen
            seconds += b.wall_time - a.wall_time
    return samples / seconds if seconds > 0 and samples > 0 else None


def kept_rates(run, healthy, stalled):
    """(healthy, run) samples/s, taken one way wherever a run is held to its healthy twin: the report's
    "keeps", straggler.png and the projection's measured share. The median of the steady logging
    intervals (steady_rate), except where the cost falls in a few intervals only, a stalled worker's
    stops or a method that exchanges once in several steps (local SGD's intervals alternate between
    those with an averaging and those without): there the samples over the whole measured interval
    (interval_rate), where both runs have one. A median would call a stalled ring faster than its
    healthy twin."""
    method = run.method
    periodic = method is not None and method.cost.steps_per_exchange(run.mode) > 1
    if stalled or periodic:
        rates = (interval_rate(healthy), interval_rate(run))
        if all(rates):
            return rates
    return steady_rate(healthy), steady_rate(run)



def workload_of(header):
    """The workload a run's header describes (its model, and its precision and ``xla`` where they are
    not the defaults: hvdps/measure/identity.py), so that every table, panel and verdict keeps runs of
    one model at two precisions apart."""
    config = header.config
    return workload_name(header.model, config and config.precision, config and config.jit_compile) \
        if header.model else None


def load_run(run_dir, name="metrics.jsonl"):
    """One run's typed row for tables, with its records (``row.curves``). What a run lacks is None."""
    recs = read_metrics(os.path.join(run_dir, name), methods.record_fields())
    header = next((r for r in recs if r.type == "header"), None)
    summary = next((r for r in reversed(recs) if r.type == "summary"), None)
    evals = tuple(r for r in recs if r.type == "eval")
    steps = tuple(r for r in recs if r.type == "step")
    figures = {}
    if header is not None:
        figures.update(backend=header.backend, mode=header.mode, workers=header.world_size, tasks=tuple(header.tasks.items()),
                       model=workload_of(header), dataset=header.dataset, batch_per_worker=header.batch_size_per_worker,
                       global_batch=header.global_batch_size,
                       target_accuracy=header.config.target_accuracy if header.config else None)
    last_eval = evals[-1] if evals else None
    figures.update(final_train_loss=steps[-1].loss if steps else None,
                   final_test_accuracy=last_eval.accuracy if last_eval else None,
                   final_test_loss=last_eval.loss if last_eval else None)
    if summary is not None:
        figures.update(summary_figures(summary))
    curves = Curves(header=header, steps=steps, evals=evals)
    method = methods.lookup(header.backend) if header is not None else None
    measured = method.measures(run_dir, curves, summary, measured_interval(header, steps)) if method else None
    return RunRow(run_dir=run_dir, curves=curves, measured=measured, **figures)


def summary_figures(summary):
    """{RunRow field: value} of what a summary record holds: its status and throughput, time to
    target, final accuracy where the trainer gave one, and the step's breakdown (the wire's
    figures where the breakdown has none)."""
    figures = {"time_to_target": summary.time_to_target, "wall_time": summary.total_time, "steps": summary.steps,
               "grad_bytes_per_step": summary.grad_bytes_per_step, "gradient": summary.gradient,
               "peak_rss_mib": summary.peak_rss_mib, "float32_compute_s": summary.float32_compute_s}
    if summary.status:
        figures["status"] = summary.status
    tp = summary.throughput
    if tp is not None:
        figures.update(samples_per_sec_median=tp.median, samples_per_sec_mean=tp.mean,
                       samples_per_sec_error=tp.error, intervals=tp.n)
    for key in ("final_test_accuracy", "final_test_loss"):
        if key in summary.model_fields_set:
            figures[key] = getattr(summary, key)
    split, wire = summary.breakdown, summary.wire
    for key in BREAKDOWN_FIELDS:
        value = getattr(split, key, None) if split is not None else None
        figures[key] = value if value is not None else getattr(wire, key, None)
    figures["wire_rule"] = (wire.wire_rule if wire else None) or (split.wire_rule if split else None)
    return figures


MIN_EVALS = 4       # a crossing at one of a run's first three evaluations is timed to a third of itself at best


def _crossing(row):
    """Which evaluation (1, 2, ...) first reached the row's target (the last where none did)."""
    hit = [i for i, e in enumerate(row.curves.evals) if e.accuracy is not None and e.accuracy >= row.target_accuracy]
    return hit[0] + 1 if hit else len(row.curves.evals)


def unresolved(rows):
    """Whether time to the target cannot rank ``rows`` (two or more, each reached it): every one reached
    it at its first evaluation; even the slowest before its MIN_EVALS-th (what the time then holds
    is mostly start-up, the first evaluation's tracing and the pauses, not training); or each crossed it
    within the window of the fastest (between its last evaluation below the target and its first at
    it). The evaluations were too far apart to tell."""
    windows = [r.target_window for r in rows]
    if len(rows) < 2 or None in windows or not all(r.curves.evals for r in rows):
        return False
    if all(r.target_at_first_eval for r in rows) or max(_crossing(r) for r in rows) < MIN_EVALS:
        return True
    fastest = min(windows, key=lambda w: w[1])
    return all(w[0] <= fastest[1] for w in windows)
