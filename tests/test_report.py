"""The report's per-run sentences and breakdown bars (hvdps/render/report.py): what dominates a step."""
from dataclasses import replace

import pytest

from hvdps.measure.rows import Curves, RunRow, Startup
from common.formats.schemas import Eval, Header, PrecisionChosen
from hvdps.render.report import explanations, step_parts

from hvdps.render.plots import write_breakdown_plot


def row(backend, mode, step_ms, compute_ms, wait_ms=None, **extra):
    step, compute = step_ms / 1000, compute_ms / 1000
    fields = {"status": "ok", "model": "mlp", "backend": backend, "mode": mode, "workers": 2,
              "step_s": step, "compute_s": compute, "overhead_s": step - compute,
              "overhead_share": (step - compute) / step, **extra}
    if wait_ms is not None:
        fields["wait_s"] = wait_ms / 1000
    return RunRow(run_dir=f"runs/{backend}-{mode}", **fields)


@pytest.mark.parametrize("r, starts, names", [
    # sync PS with its measured wait: three parts, the largest named first with its share
    (row("ps", "sync", 10.0, 3.0, wait_ms=5.0), "50% of each step (5.00 ms of 10.00 ms) is waiting for the other "
     "workers' gradients and the update", ["compute 30% (3.00 ms)", "the PS round trip and the rest 20% (2.00 ms)"]),
    # the same step with compute the largest part
    (row("ps", "sync", 10.0, 6.0, wait_ms=1.0), "60% of each step (6.00 ms of 10.00 ms) is compute, the largest",
     ["waiting for the other workers' gradients and the update (measured at the token queue) 10% (1.00 ms)",
      "the PS round trip and the rest 30% (3.00 ms)"]),
    # the round trip, not the wait, dominates
    (row("ps", "sync", 10.0, 2.0, wait_ms=1.0), "70% of each step (7.00 ms of 10.00 ms) is the PS round trip and "
     "the rest, the largest", ["compute 20% (2.00 ms)"]),
    # no wait measured: compute and the method's overhead as a whole
    (row("horovod", "sync", 10.0, 4.0), "60% of each step (6.00 ms of 10.00 ms) is Horovod's negotiation",
     ["compute 40% (4.00 ms)"]),
    (row("ps", "async", 10.0, 7.0), "70% of each step (7.00 ms of 10.00 ms) is compute, the largest part",
     ["pushing gradients to and pulling weights from the parameter servers 30% (3.00 ms)"]),
    # under 10% overhead: compute dominates, said the short way
    (row("mpi", "sync", 10.0, 9.5, exchange_s=0.0004), "compute dominates: 9.50 ms of a 10.00 ms step; distribution "
     "adds 5%", ["measured inside MPI_Allreduce: 0.40 ms"]),
    # compute timed on its own above the step (noise): no "72.89 ms of a 71.52 ms step"
    (row("horovod", "sync", 71.52, 72.89), "compute is the whole step: 72.89 ms timed on its own against a "
     "71.52 ms step; distribution adds nothing measurable", []),
    # the input's part (inside compute), and input-bound past 30% of the step
    (row("horovod", "sync", 10.0, 9.5, input_s=0.002, input_share=0.2), "compute dominates",
     ["compute includes waiting for the next batch: 20% of the step (2.00 ms)"]),
    (row("horovod", "sync", 10.0, 9.5, input_s=0.004, input_share=0.4), "compute dominates",
     ["waiting for the next batch: 40% of the step (4.00 ms): input-bound", "hvdps data --shards"]),
    # a sub-millisecond step waiting as long as the iterator call itself takes: not called input-bound
    (row("mpi", "sync", 0.8, 0.75, input_s=0.0003, input_share=0.375), "compute dominates",
     ["compute includes waiting for the next batch: 38% of the step (0.30 ms)"]),
])
def test_sentence_names_what_dominates(r, starts, names):
    (sentence,) = explanations([r])
    body = sentence.split(" worker(s): ", 1)[1]
    assert body.startswith(starts), sentence
    for name in names:
        assert name in sentence, sentence
    assert ("input-bound" in sentence) == ((r.input_share or 0) >= 0.3 and (r.input_s or 0) >= 1e-3), sentence


def test_parts_add_up_to_the_step():
    for r in (row("ps", "sync", 12.0, 3.0, wait_ms=7.5), row("ps", "async", 12.0, 3.0), row("ps", "sync", 12.0, 3.0)):
        assert sum(seconds for _, seconds in step_parts(r)) == pytest.approx(r.step_s)
    # a wait is split out only where the method defines one
    assert len(step_parts(row("horovod", "sync", 12.0, 3.0, wait_ms=1.0))) == 2


def test_failed_and_unmeasured_runs_get_no_sentence():
    assert explanations([replace(row("ps", "sync", 10.0, 3.0), status="failed"),
                         replace(row("ps", "sync", 10.0, 3.0), compute_s=None)]) == []


def test_breakdown_plot_stacks_the_wait(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    saved = {}
    real = plt.Figure.savefig

    def keep(fig, *args, **kw):          # read the bars back from the figure that is written
        saved["bars"] = [(p.get_x(), p.get_y(), p.get_height()) for p in fig.axes[0].patches]
        saved["labels"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        saved["top"] = fig.axes[0].get_ylim()[1]
        return real(fig, *args, **kw)
    plt.Figure.savefig = keep
    try:
        assert write_breakdown_plot([row("ps", "sync", 10.0, 3.0, wait_ms=5.0), row("ps", "async", 8.0, 6.0)],
                                    str(tmp_path)) == "breakdown.png"
    finally:
        plt.Figure.savefig = real
    assert (tmp_path / "breakdown.png").stat().st_size > 0
    heights = [round(h * 1000) / 1000 for _, _, h in saved["bars"]]
    # bars by backend name (async, then sync): compute (6, 3), the rest of the overhead (2, 2), the wait
    # (0, 5) on top of them
    assert heights == [6.0, 3.0, 2.0, 2.0, 0.0, 5.0]
    assert saved["bars"][5][1] == pytest.approx(5.0)      # the wait starts where compute + rest end
    assert any("waiting for the other workers" in label for label in saved["labels"])
    assert saved["top"] > 1.1 * 10.0              # the tallest bar (10 ms) is held whole, with room above


def test_sentence_names_the_slowest_rank():
    """The PS entry's measures (ps_train/method.py: PSMeasured) are said by its own clause (ps_train/report.py)."""
    from ps_train.method import PSMeasured
    waits = lambda *w: PSMeasured(wait_per_worker_s=w)
    (sentence,) = explanations([row("ps", "sync", 10.0, 3.0, wait_ms=2.2, measured=waits(0.0005, 0.0039))])
    assert "; wait per step: rank 0 (the chief) 0.50 ms, rank 1 3.90 ms;" in sentence
    assert sentence.endswith("the one that waits least, rank 0 (the chief), is the slowest.")
    (sentence,) = explanations([row("ps", "sync", 10.0, 3.0, wait_ms=2.2, measured=waits(0.004, 0.003, 0.0001))])
    assert "the one that waits least, rank 2, is the slowest" in sentence
    (sentence,) = explanations([row("ps", "sync", 10.0, 3.0, measured=PSMeasured(dropped_gradients=1234))])
    assert "; 1,234 gradient(s) pushed and dropped as stale" in sentence
    (sentence,) = explanations([row("ps", "sync", 10.0, 3.0, measured=PSMeasured(bytes_per_update_per_ps=120160))])
    assert "; 120,160 bytes per update through each PS task" in sentence


def vrow(backend, mode, workers, median, err=100.0, ttt=None, acc=0.95, startup=None, intervals=20, evals=(),
         precision=None):
    """A verdict's row; ``evals`` ((update, accuracy), ...) its evaluations, ``precision`` (the flag, the
    CPU's flags) its header's choice."""
    header = None
    if precision:
        from common.spec.precision import Hardware, choose
        asked, flags = precision
        chosen = choose(asked, Hardware("CPU", frozenset(flags)))
        header = Header(type="header", backend=backend, mode=mode, world_size=workers,
                        precision=PrecisionChosen(**chosen.to_dict()))
    curves = Curves(header=header, evals=tuple(Eval(type="eval", global_step=u, wall_time=u / 100, accuracy=a)
                                               for u, a in evals))
    return RunRow(run_dir=f"runs/{backend}-{mode}-w{workers}", status="ok", model="mlp", backend=backend,
                  mode=mode, workers=workers, samples_per_sec_median=median, samples_per_sec_mean=median,
                  samples_per_sec_error=err, intervals=intervals, time_to_target=ttt, final_test_accuracy=acc,
                  target_accuracy=0.9, startup=Startup(startup_s=startup), curves=curves)


@pytest.mark.unit
@pytest.mark.parametrize("rows, says, never_says", [
    # the fastest per sample never reached the target: the one that did is named first, the other with its end
    ([vrow("horovod", "sync", 2, 6330, ttt=None, acc=0.82), vrow("ps", "sync", 2, 4554, ttt=12.5, acc=0.90)],
     ["PS sync reaches the target accuracy 0.9 first, in 12.5 s", "never reached it: Horovod (ended at 0.82)",
      "Throughput: Horovod 6,330 samples/s: 1.39x PS sync (4,554)."],
     ["Horovod is fastest", "Horovod reaches"]),
    # both reached it at their first evaluation: the time says when each evaluated, so throughput ranks
    ([vrow("horovod", "sync", 2, 6000, ttt=0.9, evals=((44, 0.95), (88, 0.97))),
      vrow("ps", "async", 2, 2000, ttt=0.6, evals=((88, 0.93),))],
     ["every run reaches the target accuracy 0.9 at its first evaluation (Horovod at update 44, PS async at update 88)",
      "ranked by throughput instead, Horovod first", "Throughput: Horovod 6,000 samples/s: 3.00x PS async"],
     ["PS async reaches the target accuracy 0.9 first"]),
    # one crossed later: time to the target ranks, as it measures training
    ([vrow("horovod", "sync", 2, 6000, ttt=1.9, evals=((44, 0.8), (88, 0.85), (132, 0.88), (176, 0.95))),
      vrow("ps", "async", 2, 2000, ttt=0.6, evals=((88, 0.93),))],
     ["PS async reaches the target accuracy 0.9 first, in 0.6 s; then Horovod in 1.9 s"], ["first evaluation"]),
    # one crossed at its second evaluation, but within the first's window: the evaluations cannot tell them apart
    ([vrow("horovod", "sync", 2, 6000, ttt=0.5, evals=((44, 0.85), (88, 0.95))),
      vrow("ps", "async", 2, 2000, ttt=0.3, evals=((88, 0.93),))],
     ["every run reaches the target accuracy 0.9 within a few evaluations, too far apart to time the crossing "
      "(Horovod between 0.06 and 0.50 s, PS async between 0.00 and 0.30 s)", "ranked by throughput instead, Horovod first"],
     ["PS async reaches the target accuracy 0.9 first"]),
    # the precision each trained in, and an emulated one named beside its runs
    ([vrow("horovod", "sync", 2, 6000, ttt=1.0, precision=("mixed_bfloat16", ())),
      vrow("ps", "sync", 2, 5000, ttt=2.0, precision=("mixed_bfloat16", ()))],
     ["Precision: --precision mixed_bfloat16: emulated, CPU: no avx512_bf16 or amx_bf16.",
      "**mixed_bfloat16 is emulated by this hardware** in Horovod, PS sync: their throughput measures the emulation"],
     ["--precision auto chose"]),
    ([vrow("horovod", "sync", 2, 6000, ttt=1.0, precision=("auto", ()))],
     ["Precision: --precision auto chose float32: CPU: no avx512_bf16 or amx_bf16, so mixed_bfloat16 would be emulated"],
     ["is emulated by this hardware"]),
    # both reached it: ranked by time, the ratio given
    ([vrow("horovod", "sync", 2, 6000, ttt=20.0), vrow("ps", "async", 2, 5000, ttt=10.0)],
     ["PS async reaches the target accuracy 0.9 first, in 10.0 s; then Horovod in 20.0 s (2.00x)"], ["never"]),
    # a 1.03x gap inside +/- 6,082: noise
    ([vrow("horovod", "sync", 2, 6180, err=6082, ttt=5.0), vrow("ps", "sync", 2, 6000, err=300, ttt=6.0)],
     ["1.03x PS sync (6,000, within noise: the 95% intervals overlap)"], []),
    # the same gap with tight intervals: a difference, said without the noise tag
    ([vrow("horovod", "sync", 2, 6180, err=20, ttt=5.0), vrow("ps", "sync", 2, 6000, err=20, ttt=6.0)],
     ["1.03x PS sync (6,000)."], ["within noise"]),
    # one logging interval: no interval, so no call either way (never "+/- 0")
    ([vrow("horovod", "sync", 2, 6180, err=None, ttt=5.0, intervals=1), vrow("ps", "sync", 2, 6000, ttt=6.0)],
     ["no interval to tell noise by (one logging interval)"], ["within noise"]),
    # nobody reached it
    ([vrow("horovod", "sync", 2, 6180, ttt=None, acc=0.5), vrow("ps", "sync", 2, 6000, ttt=None, acc=0.6)],
     ["no backend reaches the target accuracy 0.9: Horovod (ended at 0.5), PS sync (ended at 0.6)."], []),
    # start-up is each run's own, of the runs at the verdict's worker count (not the mean over 1 and 2)
    ([vrow("horovod", "sync", 1, 3000, ttt=9.0, startup=6.0), vrow("horovod", "sync", 2, 5000, ttt=8.0, startup=14.0)],
     ["Start-up of these runs: Horovod 14.0 s."], ["10.0 s"]),
    # bytes are counted in whole bytes, whatever type the record carried them in
    ([replace(vrow("horovod", "sync", 2, 6000, ttt=5.0), bytes_per_step_per_worker=30040.0),
      replace(vrow("ps", "sync", 2, 5000, ttt=6.0), bytes_per_step_per_worker=60080.0)],
     ["Bytes on the wire per worker step: Horovod 30,040, PS sync 60,080."], ["30,040.0"]),
])
def test_verdict_ranks_by_time_to_target_and_calls_noise(rows, says, never_says):
    from hvdps.render.report import verdicts
    (text,) = verdicts(rows)
    for part in says:
        assert part in text, text
    for part in never_says:
        assert part not in text, text


@pytest.mark.unit
def test_one_interval_has_no_spread():
    from common.trainer.metrics import format_throughput, throughput_stats
    stats = throughput_stats([5000.0])
    assert stats["error"] is None and stats["n"] == 1
    assert "+/-" not in format_throughput(stats)


@pytest.mark.unit
@pytest.mark.parametrize("r, never, says", [
    (row("horovod", "sync", 10.0, 4.0, workers=1), "waiting for the slower rank", "no peer to exchange with"),
    (row("mpi", "sync", 10.0, 4.0, workers=1), "waiting for the slower rank", "no peer to exchange with"),
    (row("ps", "sync", 10.0, 3.0, wait_ms=5.0, workers=1), "the other workers' gradients",
     "no one else to wait for"),
])
def test_one_worker_has_no_peer_to_blame(r, never, says):
    (sentence,) = explanations([r])
    assert never not in sentence and says in sentence, sentence


def ps_row(num_ps, shares, placement, backend="ps"):
    header = Header(type="header", backend=backend, mode="async", world_size=2, tasks={"ps": num_ps},
                    ps_shard_bytes=shares, placement=placement)
    return RunRow(run_dir="runs/ps", status="ok", model="mlp", backend=backend, mode="async", workers=2,
                  tasks=(("ps", num_ps),), curves=Curves(header=header))


@pytest.mark.parametrize("r, says", [
    (ps_row(2, {"ps:0": 151592, "ps:1": 155648},
            {"dense/kernel": ["/job:ps/task:1", "/job:ps/task:0"], "dense/bias": ["/job:ps/task:1"],
             "dense_1/kernel": ["/job:ps/task:0", "/job:ps/task:1"]}),
     "| mlp PS async (2 PS), 2 workers | ps:0 151,592 (49%), ps:1 155,648 (51%) | 1.01 | dense/kernel, "
     "dense_1/kernel |"),
    (ps_row(2, {"ps:0": 4000, "ps:1": 26040}, {"dense/kernel": ["/job:ps/task:1"]}, backend="ps2"),
     "ps:0 4,000 (13%), ps:1 26,040 (87%) | 1.73 | - |"),
])
def test_shards_section_says_how_each_ps_task_is_loaded(r, says):
    from hvdps.render.report import methods_sections
    text = "\n".join(methods_sections([r]))
    assert text.startswith("## Model bytes per PS task") and says in text, text


def test_shards_section_only_for_several_ps_tasks():
    """The section is ps_train's (ps_train/report.py), written once over ps and ps2 runs: none for one
    PS task, and an all-reduce run's header is not read for it."""
    from hvdps.render.report import methods_sections
    ring = RunRow(run_dir="h", backend="horovod", workers=2,
                  curves=Curves(header=Header(type="header", backend="horovod", mode="sync", world_size=2,
                                              ps_shard_bytes={"ps:0": 10, "ps:1": 20})))
    assert methods_sections([ps_row(1, {"ps:0": 30040}, {}), ring]) == []
    text = "\n".join(methods_sections([ps_row(2, {"ps:0": 4000, "ps:1": 26040}, {}),
                                         ps_row(2, {"ps:0": 4000, "ps:1": 4000}, {}, backend="ps2")]))
    assert text.count("## Model bytes per PS task") == 1 and text.count("| mlp ") == 2, text


@pytest.mark.parametrize("count", [1, 10, 12, 20, 48, 140])
def test_every_series_of_a_panel_has_a_look_of_its_own(count):
    """matplotlib's default colours repeat from the eleventh line: an emulated pass draws 12 methods
    in throughput.png and 48 runs in accuracy_vs_time.png."""
    from hvdps.render.styles import series_styles
    styles = series_styles([f"method {i}" for i in range(count)])
    looks = {(tuple(colour), marker) for colour, marker in styles.values()}
    assert len(styles) == count and len(looks) == count


def test_a_method_looks_the_same_in_every_workloads_panel(tmp_path, monkeypatch):
    """PS sync is the only method of the second workload: it keeps the colour and marker it has in the
    first, beside Horovod, so a reader matches lines across panels by their look."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.axes import Axes
    from hvdps.render.plots import write_plots
    drawn, errorbar = [], Axes.errorbar

    def record(self, *args, **kw):
        drawn.append((self.get_title() or id(self), kw["label"], tuple(kw["color"]), kw["fmt"]))
        return errorbar(self, *args, **kw)
    monkeypatch.setattr(Axes, "errorbar", record)
    row = lambda model, backend, mode, workers: RunRow(          # noqa: E731
        run_dir=f"{model}/{backend}-{workers}", model=model, backend=backend, mode=mode, workers=workers, status="ok",
        samples_per_sec_median=100.0 * workers, samples_per_sec_error=1.0, scaling_efficiency=1.0)
    write_plots([row("a", "horovod", "sync", 1), row("a", "horovod", "sync", 2), row("a", "ps", "sync", 1),
                 row("a", "ps", "sync", 2), row("b", "ps", "sync", 1), row("b", "ps", "sync", 2)], str(tmp_path))
    looks = {}
    for _, label, colour, fmt in drawn:
        looks.setdefault(label, set()).add((colour, fmt))
    assert sorted(looks) == ["Horovod", "PS sync"] and all(len(v) == 1 for v in looks.values()), drawn
    assert looks["Horovod"] != looks["PS sync"]


@pytest.mark.parametrize("step, compute, says", [
    (0.17714, 0.20807, "177.14 = compute (208.07 alone) + overhead within noise"),   # faster than its probe
    (0.36530, 0.40514, "365.30 = compute (405.14 alone) + overhead within noise"),
    (0.0402, 0.0131, "40.20 = 13.10 + 27.10"),
    (0.0131, 0.0131, "13.10 = 13.10 + 0.00"),
])
def test_a_step_faster_than_its_compute_is_noise_not_a_negative_overhead(step, compute, says):
    from hvdps.render.report import _split
    assert _split(RunRow(run_dir="r", step_s=step, compute_s=compute, overhead_s=step - compute)) == says


@pytest.mark.unit
def test_every_plot_axis_holds_every_point(tmp_path):
    """A superlinear run (noise, or caches: efficiency 1.6) stays on the scaling panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from hvdps.render.plots import write_plots
    axes = []
    real = plt.Figure.savefig

    def keep(fig, *args, **kw):          # every panel of every figure written
        axes.extend((ax.get_ylabel(), ax.get_ylim()) for ax in fig.axes)
        return real(fig, *args, **kw)
    rows = [replace(vrow("horovod", "sync", 1, 1000.0), scaling_efficiency=1.0),
            replace(vrow("horovod", "sync", 2, 3200.0), scaling_efficiency=1.6)]
    plt.Figure.savefig = keep
    try:
        write_plots(rows, str(tmp_path))
    finally:
        plt.Figure.savefig = real
    (low, high), = [lim for label, lim in axes if label.startswith("throughput(n)")]
    assert low <= 0 and high >= 1.6, (low, high)
    (low, high), = [lim for label, lim in axes if label.startswith("samples/sec")]
    assert low <= 1000 - 100 and high >= 3200 + 100


@pytest.mark.unit
@pytest.mark.parametrize("configs, says, never", [
    # each workload read from TFRecord files gets its own Data line, from its own config
    ({"mlp": {"dataset": "tfrecord", "data_dir": "/d/a", "shard_by": "file"}, "cnn": {"dataset": "digits"}},
     ["Data (mlp): the TFRecord shards in `/d/a`, `--shard_by file`"], ["Data (cnn)"]),
    ({"mlp": {"dataset": "tfrecord", "data_dir": "/d/a"}, "cnn": {"dataset": "tfrecord", "data_dir": "/d/b"}},
     ["Data (mlp): the TFRecord shards in `/d/a`, `--shard_by record`", "Data (cnn): the TFRecord shards in `/d/b`"],
     []),
    ({"mlp": {"dataset": "digits"}}, ['"mlp": {'], ["Data ("]),
])
def test_the_report_names_each_workloads_data(tmp_path, configs, says, never):
    """The config is {workload: its runs' config} in every report, so a report rebuilt with --from (which
    reads the runs' own) says what the live one said, the TFRecord line included."""
    from hvdps.render.report import write_report
    write_report([vrow("horovod", "sync", 2, 6000, ttt=5.0)], str(tmp_path), configs, {"host": "h"})
    text = (tmp_path / "report.md").read_text()
    for part in says:
        assert part in text, text
    for part in never:
        assert part not in text, text
