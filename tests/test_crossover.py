"""The crossover (hvdps/cost/crossover.py): from which n the ring beats one PS, and the PS shards that
match it, on runs and a step model whose answers are worked out by hand."""
from dataclasses import replace

import pytest

from hvdps.measure.rows import RunRow

from hvdps.cost import crossover as cx
from hvdps.render import crossover as rcx

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("pairs, expected", [
    ({2: (1, 2), 4: (1, 2)}, 2),                    # the ring faster everywhere: from the first n
    ({2: (3, 2), 4: (1, 2)}, 4),                    # one PS faster at 2, the ring from 4
    ({2: (1, 2), 4: (3, 2)}, None),                 # the ring loses at the largest n: no crossover yet
    ({2: (1, 2), 4: (3, 2), 8: (1, 2)}, 8),         # only the last stretch counts
    ({2: (1, 2), 4: (None, 2), 8: (1, 2)}, 2),      # a missing value is skipped
    ({2: (2, 2), 4: (1, 2)}, 4),                    # a tie is not faster
    ({}, None),
])
def test_the_ring_wins_from(pairs, expected):
    assert cx.wins_from(pairs) == expected


@pytest.mark.parametrize("ring_s, expected", [
    (11.0, 1), (3.5, 4), (1.5, 20), (1.0, None), (None, None),
])
def test_fewest_shards_that_match(ring_s, expected):
    assert cx.shards_to_match(lambda k: 10 / k + 1, ring_s) == expected


def test_the_nearest_shard_count_is_the_fewest_within_one_percent():
    # the step stops falling at k = 8 (the worker's own link): 8 shards, not the 64 of a flat tail
    assert cx.closest(lambda k: max(8 / k, 1.0) + 1, 1.0) == (8, pytest.approx(2.0))
    assert cx.closest(lambda k: None, 1.0) is None


def run(backend, mode, n, step, k=None, compute=0.001):
    return RunRow(run_dir=f"runs/{backend}-{mode}-w{n}", backend=backend, mode=mode, workers=n, tasks=(("ps", k),) if k else (),
                  step_s=step, compute_s=compute, grad_bytes_per_step=1000.0, model="mlp")


RUNS = [run("horovod", "sync", 2, 0.050), run("horovod", "sync", 4, 0.080),
        run("mpi", "sync", 2, 0.060), run("mpi", "sync", 4, 0.070),
        run("ps", "sync", 2, 0.040, 1), run("ps", "sync", 4, 0.200, 1),
        run("ps", "sync", 2, 0.030, 2), run("ps", "sync", 4, 0.100, 2),
        run("ps", "sync", 1, 0.010, 1),                      # one worker: no exchange to compare
        run("horovod", "sync", 1, 0.002),
        run("nosuch", "sync", 2, 0.001)]                     # a method this version lacks: left out


def model_step(row, shard_bytes):
    """A hand-checkable model: ring 10 ms x n; PS 100 ms x n / k (k from its shard bytes)."""
    if cx.is_ring(row):
        return 0.010 * row.workers
    k = len(shard_bytes)
    assert sum(shard_bytes.values()) == pytest.approx(1000.0)
    return 0.100 * row.workers / k


def test_measured_and_projected_crossover_from_runs():
    [w] = cx.analyse(RUNS, model_step)
    assert w.model == "mlp" and w.workers == (2, 4)
    [v] = w.variants
    assert v.ps == "PS sync"
    at = {b.workers: b for b in v.by_n}
    # The fastest ring measured at each n: Horovod at 2 (50 ms), bare MPI at 4 (70 ms).
    assert (at[2].ring, at[2].ring_measured_s) == ("Horovod", 0.050)
    assert (at[4].ring, at[4].ring_measured_s) == ("bare MPI", 0.070)
    assert at[2].ps1_measured_s == 0.040 and at[4].ps1_measured_s == 0.200
    # Measured: one PS wins at 2 (40 < 50 ms), the ring from 4.
    assert v.ring_wins_from_measured == 4
    # Measured shards: at 2 one PS already matches; at 4 neither 1 (200) nor 2 (100) reaches 70 ms.
    assert (at[2].shards_measured, at[4].shards_measured, at[4].shards_measured_tried) == (1, None, 2)
    # Projected: ring 10n ms, one PS 100n ms: the ring everywhere; shards k >= 10 match (100n/k <= 10n).
    assert v.ring_wins_from_projected == 2
    assert at[2].ring_projected_s == pytest.approx(0.020) and at[4].ps1_projected_s == pytest.approx(0.4)
    assert at[2].shards_projected == at[4].shards_projected == 10
    # The lines reach twice the largest run; a ring's and each measured shard count's series.
    names = {s.name: s for s in w.series}
    assert set(names) == {"Horovod", "bare MPI", "PS sync, 1 PS", "PS sync, 2 PS"}
    assert [n for n, _ in names["PS sync, 2 PS"].projected] == [2, 4, 8]
    assert names["PS sync, 2 PS"].measured == ((2, 0.030), (4, 0.100))


def test_each_line_takes_the_compute_measured_at_the_nearest_worker_count():
    seen = {}

    def spy(row, shard_bytes):
        seen[(row.backend, row.workers, dict(row.tasks).get("ps", 1))] = row.compute_s
        return 1.0
    runs = [run("horovod", "sync", 2, 0.05, compute=0.002), run("horovod", "sync", 8, 0.05, compute=0.008),
            run("ps", "async", 2, 0.05, 1, compute=0.003)]
    cx.analyse(runs, spy)
    assert seen[("horovod", 2, 1)] == 0.002 and seen[("horovod", 4, 1)] == 0.002    # 4: nearer 2 than 8
    assert seen[("horovod", 8, 1)] == 0.008 and seen[("horovod", 16, 1)] == 0.008
    assert seen[("ps", 16, 1)] == 0.003


@pytest.mark.parametrize("runs", [
    [],
    [run("horovod", "sync", 2, 0.05)],                       # no PS run
    [run("ps", "sync", 2, 0.05, 1)],                         # no ring run
    [run("horovod", "sync", 1, 0.05), run("ps", "sync", 1, 0.05, 1)],   # one worker only
    [replace(run("horovod", "sync", 2, 0.05), step_s=None), run("ps", "sync", 2, 0.05, 1)],
])
def test_nothing_to_set_side_by_side_gives_no_section(runs, tmp_path):
    result = cx.analyse(runs, model_step)
    assert result == [] and rcx.section(result) == [] and rcx.plot(result, str(tmp_path / "x.png")) is None


def test_section_and_plot(tmp_path):
    result = cx.analyse(RUNS, model_step)
    text = "\n".join(rcx.section(result))
    assert "## Crossover: ring all-reduce against parameter servers" in text
    assert "| PS sync | 4 | 2 |" in text                       # measured from 4, projected from 2
    assert "| 4 | bare MPI | 70 (40) | PS sync | 200 (400) | more than 2 | 10 |" in text
    assert "contention" not in text
    # runs that measured contention for the cores are named under the tables (hvdps project passes its left-out runs)
    busy = "\n".join(rcx.section(result, [("ps-sync-w4-ps1", "oversubscribed: more processes than cores")]))
    assert busy.startswith(text) and "contention for the cores" in busy
    assert "ps-sync-w4-ps1 (oversubscribed: more processes than cores)." in busy
    path = rcx.plot(result, str(tmp_path / "crossover.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("count", [2, 10, 12, 20])
def test_every_series_of_the_plot_has_a_look_of_its_own(count):
    """An emulated pass draws 12 series (three rings, three PS variants with 1, 2 and 4 shards):
    past matplotlib's ten colours two methods would share one, told apart only by a marker."""
    import matplotlib.pyplot as plt
    series = tuple(cx.Series(name=f"method {i}", ring=i < 3, k=None, projected=((2, 0.1), (4, 0.2)),
                             measured=((2, 0.1),)) for i in range(count))
    fig = rcx.figure([cx.Workload(model="mlp", grad_bytes=1e6, workers=(2,), variants=(), series=series)])
    try:
        legend = fig.axes[0].get_legend()
        looks = [(tuple(h.get_color()), h.get_marker(), h.get_linestyle()) for h in legend.legend_handles]
        assert [t.get_text() for t in legend.get_texts()] == [s.name for s in series]
        assert len({(c, m) for c, m, _ in looks}) == count
        assert [style for _, _, style in looks] == ["-" if s.ring else "--" for s in series]
    finally:
        plt.close(fig)


def test_runs_that_measured_contention_are_drawn_apart_and_said_so():
    """The points measured under contention for the cores are hollow, a line projected only from them
    dotted and pale, each said in the legend: the picture ranks no method on them unsaid."""
    import matplotlib.pyplot as plt
    [w] = cx.analyse(RUNS, model_step, contended=["ps-sync-w4"])
    names = {s.name: s for s in w.series}
    assert names["PS sync, 1 PS"].contended == ((4, 0.200),) and not names["PS sync, 1 PS"].contended_line
    assert names["Horovod"].contended == () and not names["Horovod"].contended_line
    [w] = cx.analyse(RUNS, model_step, contended=["ps-sync-w2", "ps-sync-w4"])
    ps = [s for s in w.series if not s.ring]
    assert all(s.contended == s.measured and s.contended_line for s in ps)
    fig = rcx.figure([w])
    try:
        ax = fig.axes[0]
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "PS sync, 1 PS (from contended runs)" in texts and "Horovod" in texts
        assert any(t.startswith("hollow: measured under contention for the cores") for t in texts)
        hollow = [line for line in ax.get_lines() if line.get_markerfacecolor() == "none"]
        assert sorted(p for line in hollow for p in zip(*line.get_data())) == sorted(
            (n, 1e3 * t) for s in ps for n, t in s.measured)
        assert [line.get_linestyle() for line in ax.get_lines() if line.get_marker() in ("None", "", None)
                and line.get_alpha() == 0.45] == [":"] * len(ps)
    finally:
        plt.close(fig)
