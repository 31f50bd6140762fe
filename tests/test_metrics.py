import dataclasses
import json

import pytest

from common.base.errors import UsageError

from common.spec.config import make_config
from common.spec.plan import make_plan
from common.trainer.metrics import MetricsWriter, ThroughputMeter, throughput_stats
from hvdps.measure.rows import load_run
from tests.conftest import read_records


def test_round_trip(tmp_path):
    cfg = make_config(batch_size=8)
    w = MetricsWriter(str(tmp_path))
    w.header(cfg, "horovod", "sync", 2, {}, make_plan(cfg, 1000, 2, 2))
    w.step(10, 160, 1.5, 100.0)
    w.eval(1, 10, 1.2, 0.5, target=0.9)
    w.eval(2, 20, 0.4, 0.93, target=0.9)
    w.summary("ok", 20, 320, throughput_stats([100, 110, 90]), 0.4, 0.93, 4000)
    w.close()
    recs = read_records(str(tmp_path / "metrics.jsonl"))
    assert [r["type"] for r in recs] == ["header", "step", "eval", "eval", "summary"]
    row = load_run(str(tmp_path))
    assert row.backend == "horovod" and row.workers == 2 and row.global_batch == 16
    assert row.final_test_accuracy == 0.93 and row.grad_bytes_per_step == 4000
    assert row.samples_per_sec_median == 100 and row.time_to_target is not None
    assert row.time_to_target == row.curves.evals[1].wall_time
    assert recs[0]["config"]["batch_size"] == 8


def test_time_to_target_counts_from_the_first_updates_end(tmp_path):
    """Start-up (the process, the model, tracing, the first exchange) is not in the time to the target: a
    long job pays it once. It is in the summary beside it (first_update_s)."""
    cfg = make_config(batch_size=8)
    w = MetricsWriter(str(tmp_path))
    w.header(cfg, "mpi", "sync", 2, {}, make_plan(cfg, 1000, 2, 2))
    w._t0 -= 5.0                                   # five seconds of start-up before the first update
    w.training_started()
    start = w.first_update_s
    w.training_started()                           # told again: the first is kept
    w.eval(1, 10, 0.4, 0.95, target=0.9)
    w.summary("ok", 20, 320, throughput_stats([100, 110]), 0.4, 0.95, 4000)
    w.close()
    row = load_run(str(tmp_path))
    summary = read_records(str(tmp_path / "metrics.jsonl"))[-1]
    assert start >= 5.0 and summary["first_update_s"] == start
    assert row.time_to_target == pytest.approx(row.curves.evals[0].wall_time - start)
    assert row.time_to_target < 1.0
    assert row.precision.policy == "float32" and row.precision.asked == "float32"


def test_disabled_writer_writes_nothing(tmp_path):
    w = MetricsWriter(str(tmp_path / "x"), enabled=False)
    w.step(1, 1, 1.0, 1.0)
    assert not (tmp_path / "x").exists()


def test_torn_last_line_ignored(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"type": "header", "backend": "ps", "mode": "async", "world_size": 1}) + "\n" + '{"type": "st')
    assert len(read_records(str(p))) == 1
    row = load_run(str(tmp_path))
    assert row.status == "incomplete"


@pytest.mark.parametrize("rates, median, mean", [
    ([10, 20, 30], 20, 20),
    ([5], 5, 5),
    ([], None, None),
    ([float("nan"), 4, 6], 5, 5),
])
def test_throughput_stats(rates, median, mean):
    s = throughput_stats(rates)
    assert s["median"] == median and s["mean"] == mean


def test_meter_excludes_warmup():
    m = ThroughputMeter(warmup_steps=2)
    assert m.update(1, 10, now=0.0) is None       # warm-up
    assert m.update(2, 20, now=1.0) is None       # first mark
    assert m.update(4, 40, now=2.0) == 20.0
    assert m.update(6, 60, now=2.5) == 40.0
    assert m.stats()["n"] == 2


def test_an_async_interval_spans_at_least_one_round():
    # 4 async workers, a log every 2 updates: an interval closes once it spans 4 updates
    m = ThroughputMeter(warmup_steps=2, min_span=4)
    assert m.update(2, 20, now=1.0) is None       # first mark
    assert m.update(4, 40, now=1.01) is None      # half a round: a burst, not a rate
    assert m.update(6, 60, now=2.0) == 40.0       # (60 - 20) / (2.0 - 1.0)
    assert m.update(8, 80, now=2.1) is None
    assert m.update(10, 100, now=3.0) == 40.0
    assert m.stats()["n"] == 2


def test_a_pause_is_in_no_interval():
    # an evaluation after update 4, logged every 4: the interval begins at the first update after it
    m = ThroughputMeter(warmup_steps=2)
    assert m.update(2, 20, now=1.0) is None       # first mark
    assert m.update(4, 40, now=2.0) == 20.0
    m.pause()                                     # evaluated from 2.0 to 12.0
    m.resume(5, 50, now=12.5)                     # update 5, the first after it
    assert m.update(8, 80, now=14.0) == 20.0      # (80 - 50) / (14.0 - 12.5), not (80 - 40) / 12.0
    m.pause()
    assert m.update(12, 120, now=30.0) is None    # no update told since the pause: a new mark here
    assert m.update(16, 160, now=32.0) == 20.0
    assert m.stats()["n"] == 3 and m.stats()["median"] == 20.0
    m = ThroughputMeter(warmup_steps=10)
    m.pause()
    m.resume(5, 50, now=1.0)                      # still in the warm-up: no mark
    assert m.update(10, 100, now=2.0) is None and m.update(12, 120, now=3.0) == 20.0


@pytest.mark.parametrize("workers, batches_per_update, per_round", [(4, 4, 1), (4, 1, 4), (3, 2, 1), (1, 1, 1)])
def test_updates_per_round(workers, batches_per_update, per_round):
    cfg = make_config(batch_size=8)
    assert make_plan(cfg, 1000, workers, batches_per_update).updates_per_round == per_round


@pytest.mark.parametrize("steps, interval", [
    # every interval one log apart: from the record before the first counted one
    ([(5, None, 1.0), (10, None, 2.0), (15, 100.0, 3.0), (20, 100.0, 4.0)], (2.0, 4.0)),
    # merged intervals: from the first record past the warm-up (10), not the one before the first rate
    ([(5, None, 1.0), (10, None, 2.0), (15, None, 2.1), (20, 100.0, 4.0), (25, None, 4.2), (30, 90.0, 6.0)],
     (2.0, 6.0)),
    ([(5, None, 1.0), (10, None, 2.0)], None),                                 # nothing counted
])
def test_measured_interval_starts_where_the_meter_began(steps, interval):
    from hvdps.measure.rows import measured_interval
    from common.formats.schemas import Header, RunConfig, Step
    header = Header(type="header", backend="ps", mode="async", world_size=1, start_time=100.0,
                    config=RunConfig(warmup_steps=10), start_step=0)
    records = [Step(type="step", global_step=g, samples_seen=32 * g, samples_per_sec=r, wall_time=t)
               for g, r, t in steps]
    got = measured_interval(header, records)
    assert got == (None if interval is None else (100.0 + interval[0], 100.0 + interval[1]))


@pytest.mark.parametrize("compute, rate, workers, batch, step, share", [
    (0.004, 8000.0, 2, 32, 0.008, 0.5),        # 2 workers x 32 samples in 8 ms per worker step
    (0.010, 3200.0, 1, 32, 0.010, 0.0),        # one worker, nothing but compute
    (0.012, 3200.0, 1, 32, 0.010, -0.2),       # noise: the probe was slower; shown, not hidden
])
def test_breakdown_splits_the_measured_step(compute, rate, workers, batch, step, share):
    from common.model.probe import breakdown
    b = breakdown(compute, rate, workers, batch, {"bytes_per_step_per_worker": 7}, exchange_s=0.001)
    assert b["step_s"] == pytest.approx(step) and b["overhead_share"] == pytest.approx(share)
    assert b["compute_s"] + b["overhead_s"] == pytest.approx(b["step_s"])
    assert b["bytes_per_step_per_worker"] == 7 and b["exchange_s"] == 0.001


@pytest.mark.parametrize("compute, rate", [(None, 100.0), (0.01, None), (0.01, 0.0)])
def test_no_breakdown_without_both_measurements(compute, rate):
    from common.model.probe import breakdown
    assert breakdown(compute, rate, 2, 32) is None


@pytest.mark.parametrize("workers, grad, per_worker", [(1, 1000, 0), (2, 1000, 1000), (4, 1000, 1500)])
def test_ring_wire(workers, grad, per_worker):
    from allreduce.backend import ring_wire
    sizes = {"dense_bytes": grad, "sparse_bytes": 0, "sparse_table_bytes": 0}
    assert ring_wire(sizes, workers)["bytes_per_step_per_worker"] == per_worker


@pytest.mark.parametrize("mode, workers, num_ps, where, per_ps", [
    ("async", 2, 1, "wire", 2000),         # async: one push an update, one PS task
    ("sync", 2, 1, "wire", 4000),          # sync, 2 workers: both pushes make the update
    ("sync", 2, 2, "breakdown", 2000),     # split evenly over 2 PS tasks; the breakdown's figure
    ("backup1", 4, 2, "both", 4000),       # 4 workers, 1 backup: 3 applied and 1 dropped, all 4 carried
    ("sync", 2, 1, None, None),            # no wire figure recorded: none, not a guess
])
def test_a_ps_tasks_bytes_per_update_are_the_ps_methods_measure(mode, workers, num_ps, where, per_ps):
    """ps_wire gives a worker's bytes (the shared wire record); what one PS task carries per update
    is the PS method's own figure, from the header's mode, workers and PS count: every push an update
    takes crosses the PS link, a dropped one too."""
    from common.formats.schemas import Header, Summary
    from ps_train.backend import ps_wire
    from ps_train.cluster import backups
    from ps_train.method import per_ps_bytes
    wire = ps_wire({"dense_bytes": 1000, "sparse_bytes": 0, "sparse_table_bytes": 0})
    assert wire["bytes_per_step_per_worker"] == 2000 and set(wire) == {"bytes_per_step_per_worker", "wire_rule"}
    batches = 1 if mode == "async" else workers - backups(mode)
    header = Header(type="header", backend="ps", mode=mode, world_size=workers, tasks={"ps": num_ps},
                    batch_size_per_worker=32, global_batch_size=32 * batches)
    split = {"step_s": 0.1, "compute_s": 0.05, "overhead_s": 0.05, **wire}
    records = {"wire": {"wire": wire}, "breakdown": {"breakdown": split}, "both": {"wire": wire, "breakdown": split},
               None: {}}[where]
    summary = Summary(type="summary", status="ok", **records)
    assert per_ps_bytes(header, summary) == per_ps


def test_probe_times_the_step_alone():
    """The probe really trains (median of interval means, positive), and 0 turns it off."""
    from common.spec.config import make_config
    from common.model.probe import compute_step_time
    assert compute_step_time(make_config(probe_steps=0)) is None
    seconds = compute_step_time(make_config(probe_steps=10, batch_size=16))
    assert 0 < seconds < 5


T0 = 1_000_000.0        # the trainer's start (header start_time); measured interval: wall 2.0 to 6.0 s
SERIES = {"ps:0": [[T0 - 5, 3.0], [T0 + 2, 4.0], [T0 + 4, 5.0], [T0 + 6, 6.0], [T0 + 8, 9.0]],
          "ps:1": [[T0 - 5, 1.0], [T0 + 1, 1.5], [T0 + 7, 4.5]]}


@pytest.mark.parametrize("launch, cpu", [
    # ps:0 2.0 CPU s between T0+2 and T0+6; ps:1 interpolated: 2.0 at T0+2, 4.0 at T0+6 -> 2.0
    ({"cpu_seconds": {"ps:0": 9.0, "ps:1": 4.5, "worker:0": 9.0}, "cpu_series": SERIES}, 4.0),
    # whole-process totals alone (start-up included) give no figure
    ({"cpu_seconds": {"ps:0": 9.0, "ps:1": 4.5}}, None),
    # samples that stop before the interval ends: no figure rather than a short one
    ({"cpu_series": {"ps:0": [[T0 - 5, 3.0], [T0 + 3, 4.0]]}}, None),
    ({"cpu_seconds": {"worker:0": 9.0}, "cpu_series": {}}, None),              # no PS in the run
    ("not json", "launch.json: not valid JSON"),                            # damaged: refused, not guessed
    (None, None),                                                            # not started by the launcher
])
def test_ps_cpu_over_the_measured_interval_only(tmp_path, launch, cpu):
    records = [{"type": "header", "backend": "ps", "mode": "async", "world_size": 1, "tasks": {"ps": 2},
                "start_time": T0},
               {"type": "step", "global_step": 4, "samples_seen": 128, "loss": 1.0, "wall_time": 2.0, "samples_per_sec": None},   # warm-up
               {"type": "step", "global_step": 8, "samples_seen": 256, "loss": 1.0, "wall_time": 4.0, "samples_per_sec": 100.0},
               {"type": "step", "global_step": 12, "samples_seen": 384, "loss": 1.0, "wall_time": 6.0, "samples_per_sec": 100.0},
               {"type": "summary", "status": "ok", "total_time": 9.0, "throughput": throughput_stats([100, 100]),
                "breakdown": {"step_s": 0.08, "compute_s": 0.05, "overhead_s": 0.03, "overhead_share": 0.375}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if launch is not None:
        (tmp_path / "launch.json").write_text(launch if isinstance(launch, str) else json.dumps(launch))
    if isinstance(cpu, str):
        with pytest.raises(UsageError, match=cpu):
            load_run(str(tmp_path))
        return
    row = load_run(str(tmp_path))
    assert row.measured.ps_cpu_s == (None if cpu is None else pytest.approx(cpu))
    assert row.compute_s == 0.05 and row.overhead_share == 0.375
    if cpu is not None:   # 2 PS tasks over 4 s: 50% of a core each, not whole-process CPU over the run
        assert row.measured.ps_cpu_share == pytest.approx(cpu / (2 * 4.0))
        assert row.column("ps_cpu_s") == row.measured.ps_cpu_s        # results.csv's PS column
    with pytest.raises(dataclasses.FrozenInstanceError):     # built once: a figure added later is a new row
        row.measured = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.measured.ps_cpu_s = 1.0
    # The PS figures are what the PS entry measures (ps_train/method.py: PSMethod.measures), not the
    # reader: the same files recorded by an all-reduce method give none, and its PS columns are empty.
    records[0]["backend"], records[0]["mode"] = "horovod", "sync"
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    ring = load_run(str(tmp_path))
    assert ring.measured is None and ring.column("ps_cpu_s") is None
    assert ring.compute_s == 0.05
    with pytest.raises(AttributeError):                       # a column no one declares: named, not None
        ring.column("ps_cpu_seconds")


def _rec(total, counts, rate, **extra):
    from common.formats.schemas import Step
    return Step(type="step", global_step=counts[0], samples_seen=32 * counts[0], wall_time=float(counts[0]),
                sync_wait_total_s=total, worker_steps=counts, samples_per_sec=rate, **extra)


@pytest.mark.parametrize("steps, expected", [
    # the warm-up record (rate None) before the first measured one is where measuring starts
    ([_rec([0.5, 0.5], [5, 5], None), _rec([0.6, 0.9], [15, 15], 100.0), _rec([0.7, 1.3], [25, 25], 100.0)],
     [0.01, 0.04]),
    # warm-up records further back are left out
    ([_rec([5.0, 5.0], [1, 1], None), _rec([5.1, 5.1], [2, 2], None), _rec([5.2, 5.3], [12, 12], 9.0)],
     [0.01, 0.02]),
    # async runs have no wait records; one interval is not enough
    ([_rec(None, [3, 3], 1.0)] * 3, None),
    ([_rec([0.1, 0.1], [5, 5], 100.0)], None),
    # a restarted chief zeroed the sums: no figure rather than a wrong one
    ([_rec([2.0, 2.0], [10, 10], None), _rec([0.1, 0.1], [20, 20], 100.0)], None),
])
def test_wait_per_worker_over_the_measured_intervals(steps, expected):
    from ps_train.method import wait_per_worker
    got = wait_per_worker(steps)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("counts_rates, median, expected", [
    # worker 1 joins late: the intervals before it are the job's start-up, not its pace
    ([([5, 0], None), ([15, 0], 400.0), ([25, 0], 400.0), ([35, 2], 400.0), ([45, 9], 700.0), ([55, 16], 720.0)],
     400.0, 710.0),
    # every worker in from the first record: the median of every counted interval
    ([([5, 5], None), ([10, 10], 500.0), ([15, 15], 600.0), ([20, 20], 700.0)], 600.0, 600.0),
    # a worker that never came (lost before its first step): no interval has everyone, the row's median
    ([([5, 0], None), ([15, 0], 400.0), ([25, 0], 420.0)], 410.0, 410.0),
    # records that carry no worker_steps: every interval counts
    ([(None, None), (None, 300.0), (None, 500.0), (None, 400.0)], 400.0, 400.0),
])
def test_steady_rate_counts_the_intervals_that_began_with_every_worker_in(counts_rates, median, expected):
    from common.formats.schemas import Step
    from hvdps.measure.rows import Curves, RunRow, steady_rate
    steps = tuple(Step(type="step", global_step=i, samples_seen=32 * i, wall_time=float(i), samples_per_sec=rate,
                       **({"worker_steps": counts} if counts else {})) for i, (counts, rate) in enumerate(counts_rates))
    row = RunRow(run_dir="r", backend="ps", samples_per_sec_median=median, curves=Curves(steps=steps))
    assert steady_rate(row) == pytest.approx(expected)


def test_a_method_that_does_not_count_each_workers_steps_counts_every_interval():
    from common.formats.schemas import Step
    from hvdps.measure.rows import Curves, RunRow, steady_rate
    steps = tuple(Step(type="step", global_step=i, samples_seen=32 * i, wall_time=float(i), samples_per_sec=r)
                  for i, r in enumerate([None, 300.0, 500.0, 400.0]))
    assert steady_rate(RunRow(run_dir="r", backend="horovod", samples_per_sec_median=1.0,
                              curves=Curves(steps=steps))) == 400.0


def test_breakdown_keeps_a_measured_wait():
    from common.model.probe import breakdown
    b = breakdown(0.004, 1000.0, 2, 10, wait_s=0.005)          # step = 2 x 10 / 1000 = 20 ms
    assert b["wait_s"] == 0.005 and b["wait_share"] == pytest.approx(0.25)
    assert "wait_s" not in breakdown(0.004, 1000.0, 2, 10)


@pytest.mark.unit
def test_tensorboard_scalars_also_against_samples_seen(tmp_path):
    """Backends count global steps differently (async PS: one worker batch; all-reduce: a batch from
    every worker); the by_samples/ tags put every backend on one axis."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from common.trainer.runlog import TensorBoard
    tb = TensorBoard(str(tmp_path))
    tb.scalars(10, 640, loss=0.5)
    tb.scalars(20, 1280, loss=0.25, test_accuracy=float("nan"))   # non-finite values are dropped
    tb.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(10, 0.5), (20, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("by_samples/loss")] == [(640, 0.5), (1280, 0.25)]
    assert "test_accuracy" not in acc.Tags()["scalars"]


def test_a_row_holds_each_summary_figure_once(tmp_path):
    """load_run keeps the header, steps and evaluations as records and the summary's figures as the
    row's own fields, not the summary beside them: each figure in one place, typed (the gradient a
    schemas.Gradient; its embedding sizes read from it, as results.csv's columns are)."""
    from common.formats.schemas import Gradient
    records = [{"type": "header", "backend": "horovod", "mode": "sync", "world_size": 2, "start_time": 1.7e9},
               {"type": "step", "global_step": 5, "samples_seen": 160, "loss": 1.0, "wall_time": 1.0},
               {"type": "summary", "status": "ok", "total_time": 9.0, "peak_rss_mib": 512.5,
                "gradient": {"dense_bytes": 1000, "sparse_bytes": 300, "sparse_table_bytes": 90000}}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    row = load_run(str(tmp_path))
    assert "summary" not in {f.name for f in dataclasses.fields(row.curves)}
    assert isinstance(row.gradient, Gradient) and row.gradient.dense_bytes == 1000
    assert (row.wall_time, row.peak_rss_mib, row.status) == (9.0, 512.5, "ok")
    assert (row.column("sparse_bytes"), row.column("sparse_table_bytes")) == (300, 90000)


def _timed_row(name, times, evals=(), unhealthy=None, backend="mpi"):
    """A 2-worker run logged every 10 updates of 64 samples at ``times`` (seconds since its start),
    warm-up 10, evaluated at ``evals``."""
    from common.formats.schemas import Eval, Header, RunConfig, Step
    from hvdps.measure.rows import Curves, RunRow
    header = Header(type="header", backend=backend, mode="sync", world_size=2, start_time=100.0,
                    config=RunConfig(warmup_steps=10), start_step=0)
    steps = [Step(type="step", global_step=10 * (i + 1), samples_seen=640 * (i + 1), wall_time=t,
                  samples_per_sec=None if i == 0 else 640 / (t - times[i - 1]))
             for i, t in enumerate(times)]
    rates = sorted(s.samples_per_sec for s in steps if s.samples_per_sec)
    return RunRow(run_dir=name, status="ok", backend=backend, mode="sync", workers=2,
                  samples_per_sec_median=rates[len(rates) // 2], unhealthy=unhealthy,
                  condition=unhealthy and unhealthy.condition,
                  curves=Curves(header=header, steps=tuple(steps),
                                evals=tuple(Eval(type="eval", epoch=1, global_step=20, split="test", loss=1.0,
                                                 accuracy=0.5, wall_time=t) for t in evals)))


@pytest.mark.parametrize("stalled, expected", [
    # a stall: 3 of its 10 intervals hold its stops (3 s in all), its median none; held over the whole interval
    (True, (6400 / 10.0, 6400 / 13.0)),
    # a slow CPU: the steady intervals' medians
    (False, (640.0, 640.0)),
])
def test_what_a_run_keeps_is_taken_one_way_for_the_report_and_the_projection(stalled, expected):
    from common.formats.schemas import Unhealthy
    from hvdps.measure.rows import kept_rates
    healthy = _timed_row("h", [float(t) for t in range(1, 12)])
    stall = Unhealthy(condition="stall1-1000-250", what="w", rank=1, every_ms=1000, for_ms=250) if stalled else \
        Unhealthy(condition="slow1x4", what="w", rank=1, factor=4)
    run = _timed_row("s", [1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 9.0, 10.0, 11.0, 12.0, 14.0], unhealthy=stall)
    assert kept_rates(run, healthy, stalled=stall.stalled) == pytest.approx(expected)


def test_an_evaluation_pause_is_in_no_whole_interval_rate():
    from hvdps.measure.rows import interval_rate
    plain = _timed_row("p", [1.0, 2.0, 3.0, 4.0, 5.0])
    paused = _timed_row("e", [1.0, 2.0, 13.0, 14.0, 15.0], evals=[12.0])     # 10 s evaluating between 20 and 30
    assert interval_rate(plain) == interval_rate(paused) == pytest.approx(640.0)
