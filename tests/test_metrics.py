import json

import pytest

from common.config import make_config
from common.plan import make_plan
from common.metrics import (MetricsWriter, ThroughputMeter, load_run, read_records, throughput_stats)


def test_round_trip(tmp_path):
    cfg = make_config(batch_size=8)
    w = MetricsWriter(str(tmp_path))
    w.header(cfg, "horovod", "sync", 2, 0, make_plan(cfg, 1000, 2, 2))
    w.step(10, 160, 1.5, 100.0)
    w.eval(1, 10, 1.2, 0.5, target=0.9)
    w.eval(2, 20, 0.4, 0.93, target=0.9)
    w.summary("ok", 20, 320, throughput_stats([100, 110, 90]), 0.4, 0.93, 4000)
    w.close()
    recs = read_records(str(tmp_path / "metrics.jsonl"))
    assert [r["type"] for r in recs] == ["header", "step", "eval", "eval", "summary"]
    row, curves = load_run(str(tmp_path))
    assert row["backend"] == "horovod" and row["workers"] == 2 and row["global_batch"] == 16
    assert row["final_test_accuracy"] == 0.93 and row["grad_bytes_per_step"] == 4000
    assert row["samples_per_sec_median"] == 100 and row["time_to_target"] is not None
    assert row["time_to_target"] == curves["evals"][1]["wall_time"]
    assert recs[0]["config"]["batch_size"] == 8


def test_disabled_writer_writes_nothing(tmp_path):
    w = MetricsWriter(str(tmp_path / "x"), enabled=False)
    w.step(1, 1, 1.0, 1.0)
    assert not (tmp_path / "x").exists()


def test_torn_last_line_ignored(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"type": "header", "backend": "ps"}) + "\n" + '{"type": "st')
    assert len(read_records(str(p))) == 1
    row, _ = load_run(str(tmp_path))
    assert row["status"] == "incomplete"


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
