"""A comparison's rows, read from its run directories: each run's metrics with its start-up and
teardown (hvdps compare's compare_run.json), its links' bytes, its scaling, and the environment it ran in."""
import os
import platform
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Tuple

from common.base.errors import UsageError
from common.base.procs import native_stderr_quiet
from common.formats.schemas import read_config, read_links, read_metrics, read_run_record
from common.model.layer_profile import layer_profile
from common.model.models import build_model
from hvdps.measure.links import LINKS_FILE, cores_busy, link_rows
from hvdps.measure.load import contention
from hvdps.measure.identity import RunId
from hvdps.measure.rows import Links, Load, RunRow, Startup, load_run, measured_interval, workload_of
from hvdps.measure.timeline import rank_files, write_timeline


RUN_RECORD = "compare_run.json"    # written by hvdps compare next to each run: its wall time from launch


@dataclass(frozen=True)
class Outcome:
    """What the launcher saw of one run it started (hvdps compare's ``execute``)."""
    returncode: int
    seconds: Optional[float] = None          # launch to exit
    launched_at: Optional[float] = None      # wall clock at launch
    error: Optional[str] = None              # the run's own error line, or why it was stopped
    interrupted: bool = False                # stopped by the user's signal, not by its own end


@dataclass(frozen=True)
class PlannedRun:
    """One run of a comparison, as planned (``plan_runs``) or found under ``--from`` (``runs_from_dirs``),
    with its ``outcome`` once it ran: what ``collect`` turns into a row."""
    backend: str
    mode: str
    workers: int
    run_dir: str
    name: str = ""
    cmd: Tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)   # what its launcher adds to the environment
    oversubscribed: Optional[bool] = None    # more processes than cores; None: as its compare_run.json says
    roles: Optional[Mapping[str, str]] = None   # {task: host} across hosts
    outcome: Optional[Outcome] = None
    condition: Optional[object] = None       # a slow or stalled worker (hvdps/measure/unhealthy.py), None: healthy
    tasks: int = 0                           # processes the job starts: workers and server tasks
    identity: Optional[RunId] = None         # which run it is (hvdps/measure/identity.py)


def collect(runs, ran=False):
    """A typed row (hvdps/measure/rows.py: RunRow) per planned or found run: its records, then what the
    launcher saw (exit, interruption, oversubscription), start-up, links and scaling. ``ran``: these
    runs have just run, and each run's timeline.json is written into its folder; runs found on disk
    (--from, a finished trial) are only read."""
    rows = []
    for run in runs:
        if os.path.exists(os.path.join(run.run_dir, "metrics.jsonl")):
            row = load_run(run.run_dir)
        else:
            row = RunRow(run_dir=run.run_dir, status="failed")
        done = run.outcome
        record = run_record(run.run_dir)
        status = ("interrupted" if done.interrupted else "failed") if done and done.returncode != 0 else row.status
        row = replace(row, backend=run.backend, mode=run.mode, workers=run.workers, status=status,
                      error=done.error if done else None,
                      oversubscribed=(run.oversubscribed if run.oversubscribed is not None
                                      else bool(record and record.oversubscribed)))
        if record and record.unhealthy:
            row = replace(row, condition=record.unhealthy.condition, unhealthy=record.unhealthy)
        elif run.condition is not None:       # it ended before its worker was found: still that run
            row = replace(row, condition=run.condition.label)
        identity = run.identity or identity_of(row, record)
        row = replace(row, identity=identity, repeat=identity.repeat if identity else None)
        row = replace(row, load=load_of(row),
                      startup=startup_of(row, (done and done.seconds) or (record.seconds if record else None),
                                         (done and done.launched_at) or (record.launched_at if record else None)))
        row = links_of(row, run.roles or (record.roles if record else None))
        row = ranks_of(row, write=ran) if os.path.isdir(run.run_dir) else row
        rows.append(row)
    return with_scaling(rows)


def identity_of(row, record):
    """A found run's identity: the one its comparison recorded, else what its own records say (a
    trainer's folder, or a comparison's from before runs recorded it: no repeat then); None where
    it has no header to say it."""
    if record is not None and record.identity is not None:
        return RunId.of_record(record.identity)
    header = row.header
    if header is None:
        return None
    return RunId(workload_of(header) or "-", header.backend, header.mode, header.world_size, tasks=row.tasks,
                 condition=row.condition)


def ranks_of(row, write=False):
    """``row`` with {task: its step-time quantiles} from what each rank wrote (ranks/<task>.json), the
    files that do not read named in its ``left_out``; ``write``: the run's timeline.json made from them
    too (hvdps/measure/timeline.py), by the comparison that ran it."""
    damaged = []
    ranks = rank_files(row.run_dir, damaged)
    if ranks and write:
        write_timeline(row.run_dir, row.compute_s)
    steps = {task: rank.step_s for task, rank in ranks.items() if rank.step_s is not None} or None
    return replace(row, rank_steps=steps, left_out=tuple(damaged))


def load_of(row):
    """The run's ``Load``: the cores the rest of the machine and the job used over the measured
    interval, and whether the run was shared (hvdps/measure/load.py); empty where it was not sampled."""
    if row.curves.header is None:
        return Load()
    used, cores, shared = contention(row.run_dir, row.curves.header, row.curves.steps)
    if used is None:
        return Load(machine_cores=cores)
    return Load(others_cores=used.others, job_cores=used.job, hypervisor_cores=used.hypervisor,
                kernel_cores=used.kernel, machine_cores=cores, shared=shared)


def run_record(run_dir):
    """compare_run.json's typed record, or None where the run has none."""
    path = os.path.join(run_dir, RUN_RECORD)
    return read_run_record(path) if os.path.lexists(path) else None


def startup_of(row, run_seconds, launched_at=None):
    """Warm-up = the trainer's time before its first measured interval (tracing, the excluded
    steps, the first negotiation or session); its share of the trainer's wall time says whether
    the throughput columns describe steady state. Start-up = everything from launch to that point
    (processes, cluster, TensorFlow import, then the warm-up): what one run of this backend
    costs before it trains at speed. Teardown = the trainer's end to the job's exit (releasing PS
    tasks, MPI finalisation); known when the launch time was recorded, else it is counted in
    start-up (runs recorded before launch times were). A ``Startup``, empty where nothing was measured."""
    steps, header = row.curves.steps, row.curves.header
    total = row.wall_time
    counted = [i for i, s in enumerate(steps) if s.samples_per_sec is not None]
    if not counted or not total:
        return Startup()
    first = counted[0]
    warmup = steps[first - 1].wall_time if first > 0 else 0.0
    start = header.start_time if header else None
    if run_seconds and launched_at and start:
        return Startup(warmup, warmup / total, startup_s=max(0.0, start - launched_at) + warmup,
                       teardown_s=max(0.0, launched_at + run_seconds - (start + total)))
    return Startup(warmup, warmup / total, startup_s=max(0.0, run_seconds - total) + warmup if run_seconds else None)


def links_of(row, roles):
    """The row with where the run's tasks ran (``--hosts``) and, where the links' counters were sampled
    (hvdps emulate), the cores busy and its ``Links``: the bytes per round each host's link carried
    against the formula (hvdps/measure/links.py), the busiest link's share of its rate, and the round time."""
    path = os.path.join(row.run_dir, LINKS_FILE)
    if not os.path.lexists(path) or row.curves.header is None:
        return replace(row, roles=roles or None)
    links = read_links(path)
    interval = measured_interval(row.curves.header, row.curves.steps)
    busy = cores_busy(links, interval)
    table = link_rows(None, row, links, interval)
    if not table:
        return replace(row, roles=roles or None, cores_busy=busy)
    return replace(row, roles=roles or links.roles, cores_busy=busy, links=link_figures(row, links, interval, table))


def link_figures(row, links, interval, table):
    """A run's ``Links`` from its hosts' LinkRows (``table``) over the measured ``interval``."""
    busiest = max(table, key=lambda x: max(x.in_bytes, x.out_bytes))
    way = "in" if busiest.in_bytes >= busiest.out_bytes else "out"
    # Worst measured/formula over the links that carry a tenth of the model or more: on a shard of a few
    # kB the fixed costs of each RPC (step counter reads, headers) outweigh the tensors themselves.
    floor = 0.1 * (row.grad_bytes_per_step or 0)
    ratios = [x.carried(w) / x.expected(w) for x in table for w in ("in", "out")
              if x.expected(w) and x.expected(w) >= floor]
    round_s = (interval[1] - interval[0]) / busiest.rounds
    out = Links(hosts=tuple(table), busiest_link_bytes=busiest.carried(way), busiest_link_predicted=busiest.expected(way),
                link_bytes_ratio=max(ratios, key=lambda q: abs(q - 1)) if ratios else None,
                round_s=round_s, link_rate_bps=links.rate_bps)
    rate = lambda host: (links.rates or {}).get(host) or links.rate_bps      # noqa: E731  a host's own, else the cluster's
    shares = [(x.carried(w) * 8 / round_s / rate(x.host), x.host) for x in table for w in ("in", "out") if rate(x.host)]
    if not shares:
        return out
    share, host = max(shares)        # the link nearest its rate: a slow link (--link) before the busiest
    return replace(out, link_utilisation=share, fullest_link=host, fullest_link_bps=rate(host),
                   busiest_link=busiest.host, link_rates=dict(links.rates or {}) or None)


def with_scaling(rows):
    """The rows with their efficiency = throughput(n) / (n * throughput(1)) within the same shape of
    run (its identity's: workload, method, mode, settings, other tasks and condition)."""
    base = {r.identity.shape: r.samples_per_sec_median
            for r in rows if r.identity and r.workers == 1 and r.status == "ok"}

    def efficiency(r):
        b, t = base.get(r.identity.shape) if r.identity else None, r.samples_per_sec_median
        return (t / (r.workers * b)) if b and t and r.status == "ok" else None
    return [replace(r, scaling_efficiency=efficiency(r)) for r in rows]


def environment_of(rows):
    header = next((r.header for r in rows if r.header), None)
    env = {"host": (header.host if header else None) or platform.node(), "cores": os.cpu_count()}
    env.update(header.versions if header else {})
    by_keras = {}                    # which Keras built each run's model (common/spec/keras3.py: keras_of)
    for r in rows:
        kind = r.header.keras if r.header else None
        if kind:
            by_keras.setdefault(kind, []).append(r.name)
    if len(by_keras) == 1:
        env["model built with"] = f"{next(iter(by_keras))} (every run)"
    elif by_keras:
        env["model built with"] = "; ".join(f"{k}: {', '.join(names)}" for k, names in sorted(by_keras.items()))
    return env


def runs_from_dirs(dirs):
    """Runs found below the given directories (each holding metrics.jsonl, or runs/*)."""
    runs = []
    for d in dirs:
        if not os.path.isdir(d):
            raise UsageError(f"--from {d}: no such directory")
        candidates = [d] if os.path.exists(os.path.join(d, "metrics.jsonl")) else \
            sorted(os.path.join(root, "") [:-1] for root, _, files in os.walk(d) if "metrics.jsonl" in files)
        for c in candidates:
            header = next((r for r in read_metrics(os.path.join(c, "metrics.jsonl")) if r.type == "header"), None)
            if header:
                runs.append(PlannedRun(header.backend, header.mode, header.world_size, c,
                                       name=os.path.basename(c)))
    if not runs:
        raise UsageError(f"--from: no runs (metrics.jsonl) found in {', '.join(dirs)}")
    return sorted(runs, key=_launch_order)


def _launch_order(run):
    """The order the comparison ran its runs in (each compare_run.json's launch time), so a rebuilt
    report lists them as the live one did; runs no comparison launched come after, by method."""
    record = run_record(run.run_dir)
    launched = record.launched_at if record is not None else None
    return (launched is None, launched or 0.0, run.backend, run.mode, run.workers)


def runs_configs(rows):
    """{workload: config} (a row's model is its workload: precision and ``xla`` included), one per
    workload whose runs share a config (training flags: the worker count and output folder aside); a
    workload whose runs differ gets one entry per run folder, so runs of different settings never
    hide behind one config."""
    by_model = {}
    for r in rows:
        if r.header is not None and r.header.config is not None:
            config = r.header.config.model_dump(exclude_unset=True)
            by_model.setdefault(r.model or r.run_dir, []).append((r.run_dir, config))   # the workload
    out = {}
    for model, entries in by_model.items():
        same = lambda c: {k: v for k, v in c.items() if k not in ("train_dir", "resume")}
        if all(same(c) == same(entries[0][1]) for _, c in entries):
            out[model] = entries[0][1]
        else:
            out.update({f"{model} ({run_dir})": c for run_dir, c in entries})
    return out


def model_layers_of(run_dir):
    """The run's model, rebuilt from its config.json, as per-layer gradient sizes and FLOPs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's C++ start-up chatter stays out
    with native_stderr_quiet():
        return layer_profile(build_model(read_config(os.path.join(run_dir, "config.json"))))
