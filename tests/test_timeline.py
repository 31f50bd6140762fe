"""hvdps/measure/timeline.py: a run's ranks as one Chrome trace, each step's parts end to end."""
import hashlib
import json
import os

import pytest

from common.formats.schemas import RankFile
from conftest import check_timeline
from hvdps.measure.timeline import parts, trace, write_timeline
from tests.test_cli import _hvdps, _recorded_run


@pytest.mark.parametrize("span, compute_s, want", [
    # the exchange the backend timed: compute is the rest of the call
    ([10, 100.0, 100.010, 0.002, 0.003], None, [("input", 0.002), ("compute", 0.005), ("exchange + waiting", 0.003)]),
    # no exchange timed: the compute timed alone, the rest is exchange and waiting
    ([10, 100.0, 100.010, 0.001, None], 0.004, [("input", 0.001), ("compute", 0.004), ("exchange + waiting", 0.005)]),
    # a compute timed alone longer than this step's rest: all of it compute
    ([10, 100.0, 100.010, 0.0, None], 0.5, [("input", 0.0), ("compute", 0.010), ("exchange + waiting", 0.0)]),
    # nothing but the step: compute
    ([10, 100.0, 100.010, None, None], None, [("input", 0.0), ("compute", 0.010), ("exchange + waiting", 0.0)]),
    # an input wait longer than the step (clocks apart): at most the step
    ([10, 100.0, 100.010, 0.02, None], None, [("input", 0.010), ("compute", 0.0), ("exchange + waiting", 0.0)]),
])
def test_a_steps_parts_add_up_to_it(span, compute_s, want):
    got = parts(span, compute_s)
    assert [(n, pytest.approx(s, abs=1e-9)) for n, s, in [(p[0], p[2]) for p in got]] == want
    assert got[0][1] == span[1]
    for a, b in zip(got, got[1:]):
        assert a[1] + a[2] == pytest.approx(b[1])
    assert sum(p[2] for p in got) == pytest.approx(span[2] - span[1])


def _rank(task, start):
    return RankFile(task=task, pid=1, host="h", spans=[[5, start, start + 0.004, 0.001, None],
                                                       [10, start + 0.1, start + 0.108, 0.0, 0.006]])


def test_a_run_becomes_one_trace_with_a_track_per_rank(tmp_path):
    ranks = {"rank:0": _rank("rank:0", 1_700_000_000.0), "rank:1": _rank("rank:1", 1_700_000_000.002)}
    doc = trace(ranks, compute_s=0.001, name="mpi-sync-w2")
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["t0_unix_s"] == 1_700_000_000.0
    complete = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 2 * 2 * 3 and {e["tid"] for e in complete} == {1, 2}
    assert min(e["ts"] for e in complete) == 0
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    for task, rank in ranks.items():
        (run_dir / "ranks" / (task.replace(":", "-") + ".json")).write_text(rank.model_dump_json())
    (run_dir / "ranks" / "rank-9.json").write_text("{broken")          # left out, not fatal
    assert write_timeline(str(run_dir), 0.001)
    check_timeline(str(run_dir), ["rank:0", "rank:1"])
    assert trace({}, None) is None
    assert json.load(open(run_dir / "timeline.json"))["traceEvents"][0]["args"]["name"] == "run"


DAMAGED = [
    ("cut", lambda text: text[: len(text) // 2], "not valid JSON"),
    ("far future", lambda text: text.replace("1700000000.006", "1e303"), "unix times"),
    ("a task of Unicode digits", lambda text: text.replace('"rank:1"', '"rank:\u00b2"'), None),
]


@pytest.mark.parametrize("name, damage, says", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_rank_file_is_named_and_left_out_and_reading_never_writes(tmp_path, name, damage, says):
    """What each rank wrote is read, never rewritten: a file that does not read is left out and named
    (the report says so); a task numbered in other than ASCII digits is ordered, not a traceback; and
    nothing a timeline holds is past JSON (no Infinity)."""
    from hvdps.measure.timeline import rank_files
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    for task, start in (("rank:0", 1_700_000_000.0), ("rank:1", 1_700_000_000.002)):
        (run_dir / "ranks" / (task.replace(":", "-") + ".json")).write_text(_rank(task, start).model_dump_json())
    one = run_dir / "ranks" / "rank-1.json"
    one.write_text(damage(one.read_text()))
    damaged = []
    ranks = rank_files(str(run_dir), damaged)
    if says:
        assert list(ranks) == ["rank:0"] and len(damaged) == 1, (ranks, damaged)
        assert damaged[0].startswith("ranks/rank-1.json: ") and says in damaged[0], damaged
    else:
        assert sorted(ranks) == ["rank:0", "rank:\u00b2"] and damaged == []
    write_timeline(str(run_dir), 0.001)
    json.loads((run_dir / "timeline.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in a timeline"))


def _tree(folder):
    """{path under ``folder``: its bytes' SHA-256} of every file there."""
    return {os.path.relpath(os.path.join(d, f), folder): hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest()
            for d, _, files in os.walk(folder) for f in files}


@pytest.mark.parametrize("name, damage, says", DAMAGED[:2], ids=[d[0] for d in DAMAGED[:2]])
def test_compare_from_leaves_the_runs_it_reads_byte_identical_and_says_what_it_left_out(tmp_path, name, damage, says):
    """A rebuild reads its sources and writes only into --out: a run folder with one rank file cut in half
    or holding a span past any Unix time hashes the same after ``compare --from``, and the report names
    the file it left out."""
    run_dir = tmp_path / "runs" / "horovod-sync-w2"
    _recorded_run(run_dir)
    (run_dir / "ranks").mkdir()
    for task, start in (("rank:0", 1_700_000_000.0), ("rank:1", 1_700_000_000.002)):
        (run_dir / "ranks" / (task.replace(":", "-") + ".json")).write_text(_rank(task, start).model_dump_json())
    one = run_dir / "ranks" / "rank-1.json"
    one.write_text(damage(one.read_text()))
    before = _tree(tmp_path / "runs")
    code, _, err = _hvdps(["compare", "--from", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    assert code == 0, err
    assert _tree(tmp_path / "runs") == before
    report = (tmp_path / "out" / "report.md").read_text()
    assert "left out, damaged: ranks/rank-1.json: " in report and says in report, report
