"""Local SGD (localsgd_train): its registry entry, wire rule and cost model in-process, then the
trainer under mpirun: k = 1 is the ring's update weight for weight, k = 8 trains to the target with
the ranks' weights averaged every k steps, and a comparison reports it, projects it and draws it
beside the rings in the crossover."""
import json
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from common.base.errors import UsageError
from hvdps.measure.rows import RunRow
from common.trainer.run_dir import load_weights_npz
from hvdps import methods
from hvdps.cost import crossover as cx
from hvdps.cost import schedule
from hvdps.cost.model import Everywhere
from hvdps.cost.schedule import AlphaBeta
from hvdps.cost.shape import StepShape
from tests.conftest import BIN, REPO, SYNC_EQUIV, row_and_records, run

MAIN = os.path.join(REPO, "localsgd_train", "main.py")
MPI_MAIN = os.path.join(REPO, "mpi_train", "main.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
          "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
SIZES = {"dense_bytes": 4000, "sparse_bytes": 0, "sparse_table_bytes": 0}
RING = AlphaBeta(bandwidth=1e9, alpha=1e-5)


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.mark.unit
@pytest.mark.parametrize("text, expected", [
    ("localsgd", [("localsgd", "8")]),                    # the bare name: k = 8
    ("localsgd:1", [("localsgd", "1")]),
    ("localsgd:08", [("localsgd", "8")]),                 # one spelling of k, so one run name
    ("horovod,localsgd:4,ps:sync", [("horovod", "sync"), ("localsgd", "4"), ("ps", "sync")]),
    ("localsgd:2,localsgd:16", [("localsgd", "2"), ("localsgd", "16")]),
])
def test_k_is_the_mode(text, expected):
    assert [v.pair for v in methods.parse_variants(text)] == expected


@pytest.mark.unit
@pytest.mark.parametrize("text, message", [
    ("localsgd:0", "backend localsgd's mode is k, the steps between two averagings of the weights: a whole "
                   "number from 1 to 100000 (e.g. localsgd:8), got '0'"),
    ("localsgd:sync", "got 'sync'"),
    ("localsgd:-3", "got '-3'"),
    ("localsgd:100001", "got '100001'"),
    ("localsgd:8,localsgd:08", "--backends names localsgd:8 twice"),
])
def test_a_bad_k_is_a_usage_error(text, message):
    with pytest.raises(UsageError) as e:
        methods.parse_variants(text)
    assert message in str(e.value)


@pytest.mark.unit
def test_its_wording_names_k():
    m = methods.get("localsgd")
    assert m.label("4") == "local SGD (k=4)" and methods.label("localsgd", "16") == "local SGD (k=16)"
    assert "every 4 steps" in m.overhead_parts("4", alone=False, measured_wait=False)[0]
    assert "no peer" in m.overhead_parts("4", alone=True, measured_wait=False)[0]


@pytest.mark.unit
@pytest.mark.parametrize("k", [1, 4, 8])
def test_the_wire_rule_is_the_rings_over_k(k):
    from allreduce.backend import ring_wire
    from localsgd_train.backend import LocalSGDBackend
    backend = LocalSGDBackend(k)
    backend.world_size = 4
    wire = backend.wire_bytes(SIZES, plan=None)
    assert wire["bytes_per_step_per_worker"] == int(ring_wire(SIZES, 4)["bytes_per_step_per_worker"] / k)
    assert f"every k = {k} steps" in wire["wire_rule"]


@pytest.mark.unit
@pytest.mark.parametrize("k", [1, 8])
def test_the_cost_model_is_the_rings_once_every_k_steps(k):
    cost = methods.get("localsgd").cost
    row = StepShape(backend="localsgd", mode=str(k), workers=4, compute_s=0.01, grad_bytes_per_step=4e6)
    ring = schedule.ring_allreduce_time(4, 4e6, RING.bandwidth, RING.alpha)
    assert cost.exchange_s(row, Everywhere(RING)) == pytest.approx(ring / k)
    step, how = cost.projected_step(row, None, None, Everywhere(RING), methods.tuning())
    assert step == pytest.approx(0.01 + ring / k) and "every k steps" in how
    gradient = SimpleNamespace(dense_bytes=1000, sparse_bytes=50, sparse_table_bytes=9000)   # tables whole
    links = cost.predict_links(str(k), {"rank:0": "h1", "rank:1": "h2"}, gradient)
    assert links == {"h1": {"in": 10000 / k, "out": 10000 / k}, "h2": {"in": 10000 / k, "out": 10000 / k}}
    assert not cost.exact and methods.get("mpi").cost.exact


@pytest.mark.unit
def test_the_crossover_draws_it_but_sets_the_ps_against_the_exact_rings():
    """Local SGD at k = 8 is faster than every ring here, but it is not a drop-in for them: the ring
    side stays bare MPI's, and local SGD is one more line."""
    def row(backend, mode, step, k=None):
        return RunRow(run_dir=f"runs/{backend}-{mode}", backend=backend, mode=mode, workers=2, tasks=(("ps", k),) if k else (),
                      step_s=step, compute_s=0.001, grad_bytes_per_step=1000.0, model="mlp")
    rows = [row("mpi", "sync", 0.050), row("localsgd", "8", 0.010), row("ps", "sync", 0.040, 1)]
    [w] = cx.analyse(rows, lambda r, shards: 0.02)
    [v] = w.variants
    assert v.by_n[0].ring == "bare MPI" and v.by_n[0].ring_measured_s == 0.050
    assert {s.name for s in w.series} == {"bare MPI", "local SGD (k=8)", "PS sync, 1 PS"}


@pytest.mark.process
@pytest.mark.parametrize("argv, message", [
    (["train", "localsgd", "--local_steps", "0"], "error: --local_steps must be in [1, 100000], got 0"),
    (["train", "localsgd", "--local-steps", "x"], "error: argument --local_steps: invalid int value: 'x'"),
    (["launch", "localsgd", "--num_workers", "0"], "error: --num_workers must be in [1, 1024], got 0"),
    (["compare", "--backends", "localsgd:0", "--dry_run"], "error: backend localsgd's mode is k"),
])
def test_a_bad_k_or_size_is_one_line(argv, message):
    r = run([os.path.join(BIN, "hvdps"), *argv], timeout=60)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), (r.returncode, r.stderr)


@pytest.mark.process
def test_k1_is_the_rings_update_and_k4_is_not(tmp_path):
    """Averaging the weights after every plain-SGD step is averaging the gradients: the same weights
    as bare MPI's ring at 2 ranks (relative 1e-5). At k = 4 the ranks drift apart between averagings,
    and the weights differ: the check can fail."""
    def train(main, name, *extra):
        out = str(tmp_path / name)
        ok(run([*MPIRUN, sys.executable, main, *SYNC_EQUIV, "--batch_size", "16", *extra, "--train_dir", out],
               timeout=240))
        return load_weights_npz(os.path.join(out, "weights.npz"))
    ring, k1, k4 = train(MPI_MAIN, "ring"), train(MAIN, "k1", "--local_steps", "1"), train(MAIN, "k4", "--local_steps", "4")
    for a, b in zip(k1, ring):
        assert np.linalg.norm(a - b) <= 1e-5 * max(np.linalg.norm(b), 1e-12), np.linalg.norm(a - b)
    assert max(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12) for a, b in zip(k4, ring)) > 1e-3


@pytest.mark.process
def test_hvdps_launch_runs_its_mpirun_line(tmp_path):
    """``hvdps launch localsgd`` is the mpirun line hvdps compare starts, run in its place: the job
    trains, the user's k wins over the default, and --dry_run prints the line instead."""
    out = str(tmp_path / "run")
    hvdps = os.path.join(BIN, "hvdps")
    dry = ok(run([hvdps, "launch", "localsgd", "--num_workers", "2", "--dry_run", "--train_dir", out], timeout=60))
    assert dry.stdout.startswith("/") and "localsgd_train/main.py --local_steps 8 --train_dir" in dry.stdout
    assert not os.path.exists(out)
    ok(run([hvdps, "launch", "localsgd", "--num-workers", "2", "--local_steps", "3", "--train_steps", "12",
            "--log_every", "4", "--eval_every_epoch", "false", "--train_dir", out], timeout=240))
    row, curves = row_and_records(out)
    assert row.status == "ok" and row.workers == 2 and row.mode == "3" and curves["summary"]["averagings"] == 4


@pytest.mark.process
def test_a_comparison_trains_reports_and_projects_it(tmp_path):
    """hvdps compare with local SGD beside bare MPI on the digits CNN: both reach the CNN's target,
    the run's books say what was exchanged (the ring's bytes over k, one averaging per k steps and at
    the end, the ranks equal at the end), the report names it, and the projection draws its rows."""
    out = tmp_path / "cmp"
    r = run([os.path.join(BIN, "hvdps"), "compare", "--workers", "2", "--backends", "mpi,localsgd:4",
             "--model", "cnn", "--dataset", os.path.join(REPO, "examples", "digits28.py") + ":load",
             "--batch_size", "64", "--epochs", "3", "--log_every", "4", "--warmup_steps", "4",
             "--probe_steps", "10", "--checkpoint_every_epoch", "false", "--no_progress", "--out", str(out)],
            timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {x["backend"]: x for x in json.load(open(out / "results.json"))["rows"]}
    assert set(rows) == {"mpi", "localsgd"} and rows["localsgd"]["mode"] == "4"
    for x in rows.values():
        assert x["status"] == "ok" and x["final_test_accuracy"] >= 0.9, x
    run_dir = rows["localsgd"]["run_dir"]
    row, curves = row_and_records(run_dir)
    summary = curves["summary"]
    steps = row.steps
    assert summary["averagings"] == math.ceil(steps / 4) and summary["max_weight_divergence"] == 0.0
    assert summary["breakdown"]["bytes_per_step_per_worker"] == int(row.grad_bytes_per_step / 4)   # n = 2: 2(n-1)/n = 1
    assert 0 < summary["exchange_s_per_step"] < summary["breakdown"]["step_s"]
    assert curves["header"]["local_steps"] == 4
    report = (out / "report.md").read_text()
    assert "local SGD (k=4)" in report and "| localsgd | 4 | 2 |" in report
    p = run([os.path.join(BIN, "hvdps"), "project", "--from", str(out / "runs"), "--bandwidth_gbps", "25",
             "--latency_us", "10", "--max_workers", "16", "--out", str(tmp_path / "proj")], timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    projection = (tmp_path / "proj" / "projection.md").read_text()
    assert "| local SGD (k=4) eff. (step ms) |" in projection           # rows in the k the runs measured
    assert "local SGD (k=4): its own fit" not in projection             # costed on the ring's network
    # held against its run, or named as left out where the machine's other load made it shared
    assert "| localsgd-4-w2 | localsgd | 4 | 2 |" in projection or "localsgd-4-w2 (shared: " in projection, projection
