"""Repeated runs (hvdps compare --repeat; hvdps/measure/repeats.py): the order they go in, a
configuration's row over its runs, and the verdict's call across the runs, on recorded runs."""
import csv
import dataclasses
import os
import re

import pytest

from hvdps.measure.rows import RunRow
from hvdps.measure.identity import RunId
from hvdps.measure.repeats import alternating, merge
from hvdps.measure.runs import collect, with_scaling
from hvdps.render.report import differ, ratio_interval, verdicts, write_report
from tests.test_compare import fake_run

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("repeats, order", [
    (1, "ABC"),
    (2, "ABC CBA"),
    (3, "ABC CBA ABC"),
    (4, "ABC CBA ABC CBA"),
])
def test_the_methods_order_reverses_on_every_other_pass(repeats, order):
    got = alternating(list("ABC"), repeats)
    assert " ".join("".join(s for k, s in got if k == i) for i in range(1, repeats + 1)) == order
    assert [k for k, _ in got] == sorted(k for k, _ in got)            # pass by pass


def test_a_dry_run_prints_the_repeats_in_the_order_they_go(capsys, tmp_path):
    from hvdps.commands.compare import main
    from common.spec import plugins
    before = plugins._budget
    assert main(["--dry_run", "--repeat", "3", "--workers", "1,2", "--backends", "horovod,mpi",
                 "--out", str(tmp_path / "cmp")]) == 0
    assert plugins._budget == before         # its plug-in deadline (--run_timeout) was its own, not the caller's
    names = [os.path.basename(d) for d in re.findall(r"--train_dir (\S+)", capsys.readouterr().out)]
    shapes = ["horovod-sync-w1", "horovod-sync-w2", "mpi-sync-w1", "mpi-sync-w2"]
    assert names == [f"{s}-r1" for s in shapes] + [f"{s}-r2" for s in reversed(shapes)] + \
        [f"{s}-r3" for s in shapes]


@pytest.mark.parametrize("argv, says", [
    (["--repeat", "0"], "error: --repeat must be in [1, 100], got 0"),
    (["--repeat", "101"], "error: --repeat must be in [1, 100], got 101"),
    (["--repeat", "two"], "error: argument --repeat: invalid int value: 'two'"),
])
def test_a_bad_repeat_is_one_line(capsys, tmp_path, argv, says):
    from hvdps.commands.compare import main
    with pytest.raises(SystemExit) as exc:
        main(["--dry_run", *argv, "--out", str(tmp_path / "cmp")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("error:") == 1 and says in err, err


@pytest.mark.parametrize("identity, name, configuration, healthy", [
    (RunId("mlp", "horovod", "sync", 2, repeat=3), "horovod-sync-w2-r3", "horovod-sync-w2", "horovod-sync-w2-r3"),
    (RunId("mlp", "ps", "async", 2, tasks=(("ps", 1),), repeat=12), "ps-async-w2-ps1-r12", "ps-async-w2-ps1",
     "ps-async-w2-ps1-r12"),
    (RunId("mlp", "mpi", "sync", 4, condition="slow1x4", repeat=2), "mpi-sync-w4-slow1x4-r2", "mpi-sync-w4-slow1x4",
     "mpi-sync-w4-r2"),
    (RunId("mlp", "horovod", "sync", 2), "horovod-sync-w2", "horovod-sync-w2", "horovod-sync-w2"),
])
def test_a_runs_identity_names_its_folder_its_configuration_and_its_twin(identity, name, configuration, healthy):
    """The folder, the configuration --repeat merges and the healthy twin all come from the run's
    identity, never from parsing a folder's name."""
    assert (identity.name, identity.configuration.name, identity.healthy.name) == (name, configuration, healthy)


def rrow(name, median, ttt=None, status="ok", workers=2, acc=0.95, repeat=None):
    backend, mode = name.split("-")[:2]
    identity = RunId("mlp", backend, mode, workers, repeat=repeat)
    return RunRow(run_dir=f"runs/{identity.name}", status=status, model="mlp", backend=backend, mode=mode,
                  workers=workers, samples_per_sec_median=median if status == "ok" else None,
                  samples_per_sec_mean=median, samples_per_sec_error=10.0, intervals=20, time_to_target=ttt,
                  final_test_accuracy=acc, target_accuracy=0.9, error=None if status == "ok" else "error: boom",
                  identity=identity, repeat=repeat)


def test_a_configuration_is_the_median_of_its_runs():
    rows = merge([rrow("horovod-sync", 900, ttt=9.0, repeat=1), rrow("ps-async", 500, ttt=None, repeat=1),
                  rrow("ps-async", 700, ttt=7.0, repeat=2), rrow("horovod-sync", 1100, ttt=11.0, repeat=2),
                  rrow("horovod-sync", 1000, ttt=10.0, repeat=3), rrow("ps-async", 0, status="failed", repeat=3),
                  rrow("mpi-sync", 800, ttt=8.0)])
    assert [r.name for r in rows] == ["horovod-sync-w2", "ps-async-w2", "mpi-sync-w2"]
    hvd, ps, mpi = rows
    assert (hvd.samples_per_sec_median, hvd.time_to_target, hvd.repeats, hvd.repeats_ok) == (1000, 10.0, 3, 3)
    assert hvd.repeat_throughputs == [900, 1100, 1000] and hvd.error is None
    # two of three ended ok; of those, one never reached the target: the median time is "never"
    assert (ps.samples_per_sec_median, ps.time_to_target, ps.repeats, ps.repeats_ok) == (600, None, 3, 2)
    assert ps.error.startswith("1 of 3 runs did not end ok (r3): error: boom")
    assert mpi.repeats is None and mpi.samples_per_sec_median == 800       # one run: itself


@pytest.mark.parametrize("a, b, real, says", [
    # ranges apart: a real difference, whatever the bootstrap
    ([1000, 1010, 990], [800, 810, 790], True, "the runs' ranges do not overlap"),
    # overlapping ranges, and the ratio's interval holds 1: not called
    ([1000, 700, 1300], [950, 1200, 800], False, "within the runs' spread"),
    # one run on either side: nothing to judge across runs by
    ([1000], [800, 810], None, "one run"),
])
def test_a_difference_is_real_only_when_the_runs_show_it(a, b, real, says):
    x = RunRow(run_dir="runs/a", repeat_throughputs=a)
    y = RunRow(run_dir="runs/b", repeat_throughputs=b)
    got, why = differ(x, y)
    assert got is real and says in why, why


def test_the_ratios_interval_is_seeded_and_holds_the_ratio_of_medians():
    lo, hi = ratio_interval([10, 11, 12, 13, 14], [5, 6, 7])
    assert (lo, hi) == ratio_interval([10, 11, 12, 13, 14], [5, 6, 7])     # a rebuilt report says the same
    assert lo <= 12 / 6 <= hi


def test_time_to_target_is_judged_lower_first():
    fast = RunRow(run_dir="runs/a", repeat_times=[5.0, 5.2, 5.1])
    slow = RunRow(run_dir="runs/b", repeat_times=[7.0, 7.3, 6.9])
    real, why = differ(fast, slow, higher_is_better=False)
    assert real is True
    # the interval is of the ratio the verdict states (slow's median time over fast's, "1.37x"), not its inverse
    lo, hi = map(float, why.rsplit(" ", 1)[1].split("-"))
    assert 1 < lo <= 7.0 / 5.1 <= hi, why
    assert differ(slow, fast, higher_is_better=False)[0] is False
    never = RunRow(run_dir="runs/c", repeat_times=[7.0, None, 6.9])
    assert differ(fast, never, higher_is_better=False)[0] is None


def test_the_verdict_rests_on_the_repeats(tmp_path):
    """Recorded runs, three of each configuration: the table, results.csv and the verdict."""
    runs = []
    for k, (hvd, ps) in enumerate([(1000, 700), (1010, 1100), (990, 720)], start=1):
        for identity, rate in ((RunId("mlp", "horovod", "sync", 2, repeat=k), hvd),
                               (RunId("mlp", "ps", "async", 2, tasks=(("ps", 1),), repeat=k), ps)):
            run = fake_run(tmp_path / "runs" / identity.name, identity.method, identity.mode, 2, [rate] * 3,
                           [0.5, 0.95], tasks=dict(identity.tasks))
            runs.append(dataclasses.replace(run, identity=identity))     # as the comparison planned it
    every = collect(runs)
    rows = with_scaling(merge(every))
    out = tmp_path / "report"
    write_report(rows, str(out), {"mlp": {"x": 1}}, {"host": "h"}, every_run=every)
    with open(out / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert [(c["backend"], c["repeat"], float(c["samples_per_sec_median"])) for c in table] == [
        ("horovod", "1", 1000), ("ps", "1", 700), ("horovod", "2", 1010), ("ps", "2", 1100),
        ("horovod", "3", 990), ("ps", "3", 720)]                      # every run, in the order they went
    report = (out / "report.md").read_text()
    assert "- **mlp**, 2 worker(s), 3 runs each: " in report
    assert "| mlp | horovod | sync | 2 | - | 1,000 (3 runs: 990-1,010) |" in report
    assert "| mlp | ps | async | 2 | 1 PS | 720 (3 runs: 700-1,100) |" in report
    # Horovod's median is 1.39x PS async's, but one PS run was faster than every Horovod run
    assert "1.39x PS async (720, within the runs' spread: their ranges overlap and the bootstrap 95% interval " \
        "of the ratio" in report
    assert "Each configuration ran up to 3 times, the methods' order reversed on every other pass" in report


@pytest.mark.parametrize("repeats, says", [
    (1, ["one run each", "Each configuration ran once: a drift of the machine between runs cannot be seen"]),
    (3, ["3 runs each", "a real difference: the runs' ranges do not overlap"]),
])
def test_a_verdict_says_how_many_runs_it_rests_on(repeats, says):
    from hvdps.render.report import method_note
    top = [1000 + i for i in range(repeats)]
    low = [500 + i for i in range(repeats)]
    rows = [RunRow(run_dir="runs/horovod-sync-w2", status="ok", model="mlp", backend="horovod", mode="sync",
                   workers=2, samples_per_sec_median=top[len(top) // 2], samples_per_sec_error=1.0,
                   samples_per_sec_mean=1000, intervals=10, repeats=repeats if repeats > 1 else None,
                   repeat_throughputs=top if repeats > 1 else None),
            RunRow(run_dir="runs/ps-async-w2", status="ok", model="mlp", backend="ps", mode="async",
                   workers=2, samples_per_sec_median=low[len(low) // 2], samples_per_sec_error=1.0,
                   samples_per_sec_mean=500, intervals=10, repeats=repeats if repeats > 1 else None,
                   repeat_throughputs=low if repeats > 1 else None)]
    text = verdicts(rows)[0] + " " + method_note(rows)
    for part in says:
        assert part in text, text
