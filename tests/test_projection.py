"""The alpha-beta cost model against hand-computed values, and the --project command."""
import json
import os
import re

from dataclasses import replace

import pytest

from common.formats.schemas import ClusterDescription
from hvdps import methods
from hvdps.cost.model import Everywhere
from hvdps.cost.ring import RING_NETWORK
from hvdps.cost.shape import StepShape

from hvdps.cost import projection as pj
from hvdps.commands import project as cmd
from hvdps.cost import schedule
from common.formats.schemas import CommRow
from hvdps.cost import fits
from hvdps.cost.schedule import AlphaBeta, Unfitted
from hvdps.render import projection as rpj
from tests.conftest import BIN, run


@pytest.mark.parametrize("n, nbytes, bw, alpha, expected", [
    (1, 100e6, 1e9, 1e-5, 0.0),                                  # nothing to exchange
    (2, 100e6, 1e9, 1e-5, 0.1 + 2 * 1e-5),                       # 2(1)/2 * 0.1 s + 2 alphas
    (4, 100e6, 1e9, 0.0, 2 * 3 / 4 * 0.1),                       # 0.15 s
    (512, 178e6, 3.125e9, 1e-5, 2 * 511 / 512 * 178e6 / 3.125e9 + 2 * 511 * 1e-5),
])
def test_ring(n, nbytes, bw, alpha, expected):
    assert schedule.ring_allreduce_time(n, nbytes, bw, alpha) == pytest.approx(expected)


@pytest.mark.parametrize("n, k, g, expected", [
    (1, 1, 1, 2 * 0.1),            # one worker, one PS: push + pull of M
    (8, 1, 1, 2 * 0.8),            # the PS receives 8 M per direction
    (8, 4, 1, 2 * 0.2),            # sharded over 4 PS
    (8, 8, 4, 2 * 0.4),            # server NIC with 4 workers is now the bottleneck
])
def test_ps(n, k, g, expected):
    assert schedule.ps_time(n, 100e6, 1e9, 0.0, shards=k, per_server=g) == pytest.approx(expected)


def test_efficiency_and_overlap():
    assert pj.efficiency(1.0, 1.0) == pytest.approx(0.5)
    assert pj.efficiency(1.0, 1.0, overlap=0.5) == pytest.approx(1 / 1.5)


def test_fit_recovers_parameters():
    alpha, bw = 5e-5, 2e9
    pts = [(b, alpha + b / bw) for b in (1e5, 1e6, 1e7, 1e8)]
    a, b = fits.fit_alpha_beta(pts)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(bw, rel=1e-6)


@pytest.mark.parametrize("points, why", [
    ([(3e4, 1e-5), (1e6, 8e-4), (1e8, 0.08)], "the fitted latency is"),        # intercept < 0
    ([(1e6, 2e-3), (1e8, 1e-3)], "does not grow with the message size"),       # slope < 0
    ([(1e6, 2e-3)], "at least two measurements"),
])
def test_fit_refuses_what_it_cannot_measure(points, why):
    with pytest.raises(fits.Unmeasurable, match=why):
        fits.fit_alpha_beta(points)


@pytest.mark.parametrize("nbytes, text", [(30040, "30.0 kB"), (605224, "605.2 kB"), (102334368, "102.3 MB"),
                                          (512, "512 bytes")])
def test_gradient_size_in_a_unit_that_shows_it(nbytes, text):
    assert rpj._size(nbytes) == text


def test_fit_from_comm_uses_ring_formula():
    # 2 ranks: t = 2 alpha + M/B, so the per-hop alpha is half the intercept
    res = [{"impl": "horovod-mpi", "bytes": b, "seconds": 2e-5 + b / 1e9} for b in (1e6, 1e7, 1e8)]
    res += [{"impl": "ps-push", "bytes": b, "seconds": 1e-4 + b / 5e8} for b in (1e6, 1e8)]
    res += [{"impl": "ps-pull", "bytes": b, "seconds": 1e-4 + b / 5e8} for b in (1e6, 1e8)]
    fitted = pj.fit_from_comm([CommRow(**r) for r in res], 2)
    assert fitted["allreduce"].alpha == pytest.approx(1e-5)
    assert fitted["allreduce"].bandwidth == pytest.approx(1e9)
    assert fitted["ps"] == AlphaBeta(alpha=pytest.approx(1e-4), bandwidth=pytest.approx(5e8))
    assert set(fitted) == {"allreduce", "ps"}        # the networks the methods declare, nothing else


@pytest.mark.parametrize("ways, why", [
    ({"push": (1e-4, 5e8)}, "PS push and pull: comm.json has no pull rows"),
    ({"push": (1e-4, 5e8), "pull": (-1e-3, 5e8)}, "PS push and pull pull: the fitted latency is"),
])
def test_the_ps_network_needs_both_ways_fitted(ways, why):
    """The parameter servers' network (ps_train/method.py declares its rule, hvdps/cost/fits.py:
    push_pull) is the mean of a push and a pull: one missing or unfittable leaves it Unfitted, which
    the projection refuses in one line where it would use it."""
    res = [{"impl": "horovod-mpi", "bytes": b, "seconds": 2e-5 + b / 1e9} for b in (1e6, 1e7, 1e8)]
    res += [{"impl": f"ps-{way}", "bytes": b, "seconds": alpha + b / bw} for way, (alpha, bw) in ways.items()
            for b in (1e6, 1e8)]
    fitted = pj.fit_from_comm([CommRow(**r) for r in res], 2)
    assert isinstance(fitted["ps"], Unfitted) and why in fitted["ps"].error, fitted["ps"]
    assert isinstance(fitted["allreduce"], AlphaBeta)


@pytest.mark.process
def test_project_command(tmp_path):
    out = tmp_path / "p"
    r = run([os.path.join(BIN, "hvdps"), "project", "--bandwidth_gbps", "25", "--latency_us", "10",
             "--model_name", "resnet101", "--step_compute_ms", "580", "--gpus_per_server", "4",
             "--straggler_cv", "0", "--out", str(out)], timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.load(open(out / "projection.json"))
    ring512 = next(x for x in data["rows"] if x["workers"] == 512 and x["arch"] == "ring all-reduce")
    t = schedule.ring_allreduce_time(512, data["grad_bytes"], 25e9 / 8, 10e-6)
    # the schedule hides part of the exchange: better than nothing hidden, never better than free
    assert 0.58 / (0.58 + t) < ring512["efficiency"] < 1.0
    assert ring512["step_s"] == pytest.approx(0.58 + (1 - ring512["overlap"]) * ring512["comm_s"], rel=0.05)
    archs = {x["arch"] for x in data["rows"]}
    assert {"ring all-reduce", "PS k=1", "PS, 1 per server", "BytePS k=n"} <= archs
    assert (out / "projection.png").stat().st_size > 5000


# Published scaling figures and the inputs that reproduce them, written down once for all models
# (docs/projection.md says where each comes from). Single-GPU step at batch 64 on a Pascal P100:
# TensorFlow's 2017 benchmarks page, Inception V3 142 and VGG-16 154 images/s; ResNet-101 is not on
# it and is interpolated by FLOPs between ResNet-50 (219) and ResNet-152 (91.8): 129 images/s.
COMPUTE_S = {"inception_v3": 64 / 142, "resnet101": 64 / 129, "vgg16": 64 / 154}
HOROVOD_2018 = ["--cycle_time_ms", "5", "--fusion_threshold_mb", "64", "--straggler_cv", "0.03",
                "--gpus_per_server", "4", "--ps_sharding", "greedy"]
ROCE = AlphaBeta(bandwidth=0.9 * 25e9 / 8, alpha=5e-6)        # 25 Gbit/s RoCE, 90% goodput, 5 us
TCP = AlphaBeta(bandwidth=0.9 * 25e9 / 8, alpha=25e-6)        # 25 GbE TCP, 25 us
PUBLISHED = [
    # source, model, GPUs, network, architecture row, published efficiency
    ("Horovod docs, 512 GPUs", "inception_v3", 512, ROCE, "ring all-reduce", 0.90),
    ("Horovod docs, 512 GPUs", "resnet101", 512, ROCE, "ring all-reduce", 0.90),
    ("Horovod docs, 512 GPUs", "vgg16", 512, ROCE, "ring all-reduce", 0.68),
    ("Horovod paper, 128 GPUs", "inception_v3", 128, TCP, "ring all-reduce", 0.88),
    ("Horovod paper, 128 GPUs", "resnet101", 128, TCP, "ring all-reduce", 0.88),
    ("Horovod paper, 128 GPUs", "inception_v3", 128, TCP, "PS, 1 per server", 0.50),
]


def project_published(model, gpus, net, arch):
    layers = pj.known_models()[model].layers
    rows = pj.project(layers, COMPUTE_S[model], [gpus], Everywhere(net), per_server=4, straggler_cv=0.03,
                      tuning=methods.tuning(cycle_s=5e-3, fusion_bytes=64 << 20, placement="greedy"))
    return next(r for r in rows if r.arch == arch).efficiency


@pytest.mark.parametrize("source, model, gpus, net, arch, published", PUBLISHED,
                         ids=[f"{p[0]}-{p[1]}-{p[4]}" for p in PUBLISHED])
def test_published_figures_within_5_points(source, model, gpus, net, arch, published):
    got = project_published(model, gpus, net, arch)
    assert abs(got - published) <= 0.05, f"{source} {model}: projected {got:.1%}, published {published:.0%}"


def test_published_ps_resnet101_is_the_documented_miss():
    """Standard distributed TF on ResNet-101 (paper: about 50%) projects to about 42%: the greedy
    placement leaves a 12.4 MB shard that every one of the 128 GPUs pushes to and pulls from.
    docs/projection.md reports this miss; the test pins it so a model change that moves it is seen."""
    got = project_published("resnet101", 128, TCP, "PS, 1 per server")
    assert 0.38 <= got <= 0.46


# The paper does not say how its standard distributed TensorFlow ran. tf_cnn_benchmarks' own
# parameter_server mode (variable_mgr.py, 2017) runs one worker task per server that sums its 4 GPUs'
# gradients before the push; TensorFlow's gRPC moved 100-800 MB/s per process pair in 2017 (tensorflow
# issue 6116), below the 25 GbE link. Whatever the layout and the rate, once the PS step is bound by
# bytes ResNet-101's efficiency is about 0.82 of Inception V3's (its hottest shard per ms of compute is
# 1.2x larger), and "both about 50%" within 5 points needs at least 0.818: no one input reaches both.
@pytest.mark.parametrize("towers, ps_gbps", [(1, 22.5), (4, 5.6), (4, 6.4), (4, 8.0)])
def test_ps_resnet101_trails_inception_v3_by_its_bytes(towers, ps_gbps):
    ps = AlphaBeta(bandwidth=ps_gbps * 1e9 / 8, alpha=TCP.alpha)
    eff = {}
    for model in ("inception_v3", "resnet101"):
        rows = pj.project(pj.known_models()[model].layers, COMPUTE_S[model], [128], {RING_NETWORK: TCP, methods.server_network(): ps}, per_server=4,
                          straggler_cv=0.03, tuning=methods.tuning(placement="greedy", towers=towers))
        eff[model] = next(r for r in rows if r.arch == "PS, 1 per server").efficiency
    assert eff["inception_v3"] < 0.75
    assert 0.80 <= eff["resnet101"] / eff["inception_v3"] <= 0.84, eff
    assert not all(abs(e - 0.50) <= 0.05 for e in eff.values()), eff


@pytest.mark.process
def test_published_command_line_matches(tmp_path):
    # the documented command gives the same figure as the function the checks use
    r = run([os.path.join(BIN, "hvdps"), "project", "--bandwidth_gbps", "22.5", "--latency_us", "5",
             "--model_name", "vgg16", "--step_compute_ms", str(1e3 * 64 / 154), *HOROVOD_2018,
             "--max_workers", "512", "--out", str(tmp_path)], timeout=120)
    assert r.returncode == 0, r.stderr
    rows = json.load(open(tmp_path / "projection.json"))["rows"]
    got = next(x for x in rows if x["workers"] == 512 and x["arch"] == "ring all-reduce")["efficiency"]
    assert got == pytest.approx(project_published("vgg16", 512, ROCE, "ring all-reduce"))


@pytest.mark.process
def test_ps_layout_flags_reach_the_schedule(tmp_path):
    # --ps_gpus_per_worker and --ps_bandwidth_gbps give what project() gives with the same inputs
    r = run([os.path.join(BIN, "hvdps"), "project", "--bandwidth_gbps", "22.5", "--latency_us", "25",
             "--model_name", "resnet101", "--step_compute_ms", str(1e3 * 64 / 129), *HOROVOD_2018,
             "--ps_gpus_per_worker", "4", "--ps_bandwidth_gbps", "6.4", "--max_workers", "128",
             "--out", str(tmp_path)], timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.load(open(tmp_path / "projection.json"))
    got = next(x for x in data["rows"] if x["workers"] == 128 and x["arch"] == "PS, 1 per server")
    ps = AlphaBeta(bandwidth=6.4e9 / 8, alpha=25e-6)
    rows = pj.project(pj.known_models()["resnet101"].layers, 64 / 129, [128], {RING_NETWORK: TCP, methods.server_network(): ps}, per_server=4,
                      straggler_cv=0.03, tuning=methods.tuning(placement="greedy", towers=4))
    want = next(x for x in rows if x.arch == "PS, 1 per server")
    assert got["efficiency"] == pytest.approx(want.efficiency)
    assert data["ps_gpus_per_worker"] == 4 and data["ps"]["bandwidth"] == pytest.approx(0.8e9)
    # one task per GPU (the default) moves 4x the copies: the same cluster scales worse
    per_gpu = pj.project(pj.known_models()["resnet101"].layers, 64 / 129, [128], {RING_NETWORK: TCP, methods.server_network(): ps}, per_server=4,
                         straggler_cv=0.03, tuning=methods.tuning(placement="greedy"))
    assert next(x for x in per_gpu if x.arch == "PS, 1 per server").efficiency < 0.5 * want.efficiency


def fake_sync_run(d, backend, workers, compute_s, step_s, exchange_s=None, mode="sync", num_ps=0, settings=(),
                  spans=False):
    """A finished run of the CNN (8x8 digits: 151,306 parameters) with a breakdown, as a trainer writes it;
    with ``settings``, and its identity as hvdps compare records it beside the run; with ``spans``, each
    worker's ranks/worker-<i>.json: 40 logged steps of ``step_s``, no wait for the batch."""
    from common.spec.config import make_config
    from common.trainer.metrics import MetricsWriter, throughput_stats
    from common.spec.plan import make_plan
    cfg = make_config(model="cnn", batch_size=32, train_dir=str(d))
    cfg.save(str(d))
    w = MetricsWriter(str(d))
    w.header(cfg, backend, mode, workers, {"ps": num_ps} if num_ps else {}, make_plan(cfg, 1000, workers, workers))
    rate = workers * 32 / step_s
    split = {"step_s": step_s, "compute_s": compute_s, "overhead_s": step_s - compute_s,
             "overhead_share": (step_s - compute_s) / step_s}
    if exchange_s is not None:
        split["exchange_s"] = exchange_s
    w.summary("ok", 100, 3200, throughput_stats([rate] * 3), 0.1, 0.95, 605224, breakdown=split)
    w.close()
    if settings:
        from hvdps.measure.identity import RunId
        from hvdps.measure.jobs import run_record
        from hvdps.measure.runs import PlannedRun
        ident = RunId("cnn", backend, mode, workers, settings=settings)
        record = run_record(PlannedRun(backend, mode, workers, str(d), identity=ident), 10.0, 0.0, 0)
        (d / "compare_run.json").write_text(record.model_dump_json())
    if spans:
        (d / "ranks").mkdir()
        for i in range(workers):
            doc = {"task": f"worker:{i}", "pid": 100 + i, "host": f"h{i}",
                   "spans": [[k, 1000.0 + k * step_s, 1000.0 + (k + 1) * step_s, 0.0, None] for k in range(1, 41)]}
            (d / "ranks" / f"worker-{i}.json").write_text(json.dumps(doc))


@pytest.mark.process
def test_project_from_runs(tmp_path):
    # bare MPI at 2 workers: compute 10 ms, exchange 4 ms measured, step 12 ms -> half the exchange hid
    fake_sync_run(tmp_path / "runs" / "mpi-2", "mpi", 2, 0.010, 0.012, exchange_s=0.004)
    fake_sync_run(tmp_path / "runs" / "mpi-1", "mpi", 1, 0.010, 0.010)
    out = tmp_path / "p"
    r = run([os.path.join(BIN, "hvdps"), "project", "--from", str(tmp_path / "runs"),
             "--bandwidth_gbps", "10", "--latency_us", "20", "--max_workers", "64", "--out", str(out)],
            timeout=180)
    assert r.returncode == 0, r.stderr
    # the model was rebuilt in this process: TensorFlow's C++ start-up lines stay off the user's terminal
    assert not re.search(r"^[IWE]0000 |absl::InitializeLog|cuInit", r.stderr + r.stdout, re.M), r.stderr
    data = json.load(open(out / "projection.json"))
    assert data["compute_s"] == pytest.approx(0.010)
    assert data["grad_bytes"] == 605224 and data["layers"] == 4          # the CNN, rebuilt from config
    (label, overlap), = data["measured_overlap"].items()
    assert overlap == pytest.approx(0.5) and label.startswith("ring (overlap of mpi")
    row = next(x for x in data["rows"] if x["workers"] == 64 and x["arch"] == label)
    t = schedule.ring_allreduce_time(64, 605224, 10e9 / 8, 20e-6)
    assert row["step_s"] == pytest.approx(0.010 + 0.5 * t + row["straggler_s"])
    text = (out / "projection.md").read_text()
    assert "exchange 4.00 ms (measured) -> overlap 50%" in text
    # Ring and PS runs of one workload: the crossover section and its plot (hvdps/cost/crossover.py).
    assert "## Crossover" not in text and not (out / "crossover.png").exists()
    fake_sync_run(tmp_path / "runs" / "ps-2", "ps", 2, 0.010, 0.030, num_ps=1)
    r = run([os.path.join(BIN, "hvdps"), "project", "--from", str(tmp_path / "runs"),
             "--bandwidth_gbps", "10", "--latency_us", "20", "--out", str(out)], timeout=180)
    assert r.returncode == 0, r.stderr
    text = (out / "projection.md").read_text()
    assert "## Crossover: ring all-reduce against parameter servers" in text and "![crossover](crossover.png)" in text
    [w] = json.load(open(out / "projection.json"))["crossover"]
    [v] = w["variants"]
    assert v["ps"] == "PS sync" and v["ring_wins_from_measured"] == 2 and w["workers"] == [2]
    assert (out / "crossover.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Held out" not in text                       # one worker count per method: nothing to predict
    # PS at 2, 4 and 8 workers: fitted at 2 and 4, 8 predicted (hvdps/cost/heldout.py)
    # with its ranks' logged steps (ranks/*.json), each run is also replayed (hvdps/cost/replay.py)
    import shutil
    shutil.rmtree(tmp_path / "runs" / "ps-2")
    # on 0.1 Gbit/s, sync PS's exchange is its PS link's 2(n M / B + alpha); each step 10 ms of compute + 1.1x it - 5 ms
    def exchange(n):
        return 2 * (n * 605224 / (0.1e9 / 8) + 20e-6)
    for n in (2, 4, 8):
        fake_sync_run(tmp_path / "runs" / f"ps-{n}", "ps", n, 0.010, 0.010 + 1.1 * exchange(n) - 0.005, num_ps=1,
                      spans=True)
    r = run([os.path.join(BIN, "hvdps"), "project", "--from", str(tmp_path / "runs"),
             "--bandwidth_gbps", "0.1", "--latency_us", "20", "--max_workers", "16", "--out", str(out)], timeout=180)
    assert r.returncode == 0, r.stderr
    text = (out / "projection.md").read_text()
    assert "## Held out: fitted at the two smallest worker counts" in text
    assert "## Held out by replay" in text and "## Replayed at scale" in text
    data = json.load(open(out / "projection.json"))
    held = data["heldout"]
    assert held["cores"] is None                           # no hvdps emulate record: no shared cores
    assert [(e["projector"], e["workers"], e["held_out"]) for e in held["entries"]] == [
        ("link terms", 2, False), ("link terms", 4, False), ("link terms", 8, True),
        ("replay", 2, False), ("replay", 4, False), ("replay", 8, True)]
    replayed = {e["workers"]: e for e in held["entries"] if e["projector"] == "replay"}
    # every worker ready at 10 ms (the probe's compute): the fit is the line, and the held-out run is on it
    assert [replayed[n]["ratio"] for n in (2, 4, 8)] == [pytest.approx(1.0, abs=1e-6)] * 3
    assert (replayed[8]["factor"], replayed[8]["offset_s"]) == (pytest.approx(1.1), pytest.approx(-0.005))
    assert replayed[8]["replayed_from"] == "ps-4"
    assert held["trusted"]["PS sync"]["projector"] in ("replay", "link terms") and held["trusted"]["PS sync"]["why"]
    assert [x["workers"] for x in data["replayed"]] == [1, 2, 4, 8, 16]
    assert {x["replayed_from"] for x in data["replayed"]} == {"ps-8"}


@pytest.mark.process
def test_project_from_runs_costs_each_at_its_own_settings(tmp_path):
    """Horovod at its default cycle and at 10 ms, measured at the same step: the check costs each at
    the cycle it ran at, and the projection draws the 10 ms one on a row of its own."""
    fake_sync_run(tmp_path / "runs" / "horovod-1", "horovod", 1, 0.002, 0.002)
    fake_sync_run(tmp_path / "runs" / "horovod-2", "horovod", 2, 0.002, 0.004, exchange_s=0.002)
    fake_sync_run(tmp_path / "runs" / "horovod-2-slow", "horovod", 2, 0.002, 0.004, exchange_s=0.002,
                  settings=(("cycle_time_ms", "10"),))
    out = tmp_path / "p"
    r = run([os.path.join(BIN, "hvdps"), "project", "--from", str(tmp_path / "runs"),
             "--bandwidth_gbps", "10", "--latency_us", "20", "--max_workers", "8", "--out", str(out)], timeout=180)
    assert r.returncode == 0, r.stderr
    data = json.load(open(out / "projection.json"))
    checked = {c["run"]: c["projected_step_s"] for c in data["checked"]}
    assert checked["horovod-2-slow"] > checked["horovod-2"] + 5e-3, checked
    arches = {x["arch"] for x in data["rows"]}
    assert "Horovod [cycle_time_ms=10]" in arches
    assert any("overlap of horovod sync [cycle_time_ms=10] x2" in a for a in arches), arches
    assert "Horovod [cycle_time_ms=10]" in (out / "projection.md").read_text()


def test_a_run_with_a_slow_worker_is_neither_checked_nor_called_contended(tmp_path):
    # its own section holds it to its healthy twin; the healthy model's check and the crossover's
    # note on contention (shared, oversubscribed runs) are about other runs
    fake_sync_run(tmp_path / "runs" / "mpi-sync-w2", "mpi", 2, 0.010, 0.012, exchange_s=0.004)
    slow = tmp_path / "runs" / "mpi-sync-w2-slow1x4"
    fake_sync_run(slow, "mpi", 2, 0.010, 0.040, exchange_s=0.030)
    (slow / "compare_run.json").write_text(json.dumps({"seconds": 9.0, "unhealthy": {
        "condition": "slow1x4", "what": "worker 1 at 1/4 CPU", "rank": 1, "factor": 4.0}}))
    (tmp_path / "runs" / "mpi-sync-w2" / "compare_run.json").write_text(json.dumps({"seconds": 8.0}))
    net = AlphaBeta(bandwidth=10e9 / 8, alpha=20e-6)
    checked, left_out = cmd.check_runs(cmd.load_found(str(tmp_path / "runs")), None, Everywhere(net), methods.tuning())
    assert [r.run for r in checked] == ["mpi-sync-w2"] and left_out == []


@pytest.mark.parametrize("args, message", [
    (["--bandwidth_gbps", "-3", "--latency_us", "10"], "--bandwidth_gbps must be in [1e-06, 1e+06], got -3.0"),
    (["--comm_json", "{bad}"], "bad.json: not valid JSON"),
    (["--comm_json", "/no/such.json"], "--comm_json /no/such.json: no such file"),
    (["--bandwidth_gbps", "25", "--latency_us", "10", "--from", "/no/runs"], "--from /no/runs: no such directory"),
    (["--bandwidth_gbps", "25", "--latency_us", "10", "--straggler_cv", "1.5"], "--straggler_cv must be in [0, 1], got 1.5"),
    (["--bandwidth_gbps", "25", "--latency_us", "10", "--ps_sharding", "random"], "invalid choice: 'random'"),
    (["--bandwidth_gbps", "25", "--latency_us", "10", "--ps_gpus_per_worker", "3", "--gpus_per_server", "4"],
     "--ps_gpus_per_worker must divide --gpus_per_server (4), got 3"),
    (["--bandwidth_gbps", "25", "--latency_us", "10", "--ps_bandwidth_gbps", "0"],
     "--ps_bandwidth_gbps must be in [1e-06, 1e+06], got 0.0"),
    # the shipped loopback measurements: the ring's small exchanges are too fast to fit a latency
    ([], "cannot fit latency and bandwidth from"),
    (["--comm_json", "{tiny}"], "ring all-reduce: the fitted latency is"),
    (["--comm_json", "{tiny}", "--bandwidth_gbps", "25"], "give the network as --bandwidth_gbps and --latency_us"),
])
def test_project_bad_input(tmp_path, args, message):
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    tiny = tmp_path / "tiny.json"       # 2-rank ring times whose intercept is negative
    tiny.write_text(json.dumps({"np": 2, "results": [
        {"impl": "horovod-mpi", "bytes": b, "seconds": t} for b, t in ((30000, 1e-5), (1e6, 8e-4), (1e8, 0.08))]}))
    args = [str(bad) if a == "{bad}" else str(tiny) if a == "{tiny}" else a for a in args]
    r = run([os.path.join(BIN, "hvdps"), "project", *args, "--model_name", "vgg16",
             "--step_compute_ms", "100", "--out", str(tmp_path / "p")], timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_project_needs_inputs(tmp_path):
    r = run([os.path.join(BIN, "hvdps"), "project", "--bandwidth_gbps", "25", "--latency_us", "10",
             "--out", str(tmp_path / "p")], timeout=60)
    assert r.returncode == 2 and "needs the model" in r.stderr


@pytest.mark.unit
def test_plot_two_families_and_coinciding_curves_once(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ring, ps = "ring all-reduce", "parameter servers"        # the panels: each row's cost model's
    rows = [pj.Projected(arch=a, family=f, workers=n, efficiency=e, comm_s=0.0, overlap=0.0, straggler_s=0.0,
                         step_s=1 / e) for n in (1, 2, 4) for a, f, e in (
        ("ring all-reduce", ring, 1 / n ** 0.1), ("PS k=1", ps, 1 / n), ("PS, 1 per server", ps, 1 / n),
        ("PS k=1 (overlap of ps async x2: 0%)", ps, 0.9 / n),
        ("PS k=1 (overlap of ps sync x2: 0%)", ps, 0.9 / n),
        ("TF all-reduce (MWMS)", ring, 0.8 / n))]
    saved = {}
    real = plt.Figure.savefig

    def keep(fig, *args, **kw):
        saved["legends"] = [[t.get_text().replace("\n", " ") for t in ax.get_legend().get_texts()] for ax in fig.axes]
        return real(fig, *args, **kw)
    plt.Figure.savefig = keep
    try:
        rpj.plot(rows, str(tmp_path / "p.png"), "t")
    finally:
        plt.Figure.savefig = real
    assert saved["legends"] == [["ring all-reduce", "TF all-reduce (MWMS)"],
                                ["PS k=1 = PS, 1 per server", "PS k=1 (overlap of ps async x2, ps sync x2: 0%)"]]


B, A, M, C = 6e6, 1e-4, 300_000, 0.001     # bytes/s, seconds, gradient bytes, compute seconds


@pytest.mark.parametrize("backend, mode, n, shards, expected", [
    # bare MPI: one ring Allreduce after back-propagation
    ("mpi", "sync", 2, None, C + M / B + 2 * A),
    ("mpi", "sync", 3, None, C + 4 / 3 * M / B + 4 * A),
    # PS sync: all push, then all pull, through the busiest PS link (n x its shard)
    ("ps", "sync", 3, {"ps:0": M}, C + 2 * (3 * M / B + A)),
    ("ps", "sync", 3, {"ps:0": M // 3, "ps:1": 2 * M // 3}, C + 2 * (2 * M / B + A)),
    # ... or the worker's own link when the shards are small enough
    ("ps", "sync", 2, {"ps:0": M // 4, "ps:1": M // 4, "ps:2": M // 4, "ps:3": M // 4}, C + 2 * (M / B + A)),
    # PS async: own link (push, then pull) or the busiest PS link's n x shard per round
    ("ps", "async", 2, {"ps:0": M}, C + 2 * (M / B + A)),
    ("ps2", "async", 3, {"ps:0": M}, 3 * M / B + A),
    ("ps2", "async", 3, {"ps:0": M // 2, "ps:1": M // 2}, C + 2 * (M / B + A)),
    # no shard sizes in the header: the gradient split evenly over the PS tasks
    ("ps", "async", 4, None, 4 * M / B + A),
])
def test_projected_step_per_backend(backend, mode, n, shards, expected):
    row = StepShape(backend=backend, mode=mode, workers=n, compute_s=C, grad_bytes_per_step=M, tasks=(("ps", 1),))
    step, how = pj.projected_step(row, shards, pj.single_layer(M), Everywhere(AlphaBeta(bandwidth=B, alpha=A)),
                                  methods.tuning())
    assert step == pytest.approx(expected, rel=1e-9) and how


def test_projected_horovod_step_is_the_ring_schedule():
    row = StepShape(backend="horovod", mode="sync", workers=3, compute_s=C, grad_bytes_per_step=M)
    ring = AlphaBeta(bandwidth=B, alpha=A)
    step, _ = pj.projected_step(row, None, pj.single_layer(M), Everywhere(ring), methods.tuning())
    # one gradient ready at the end of backprop: one fused ring after it (and a cycle's wait)
    assert C + 4 / 3 * M / B + 4 * A <= step <= C + 4 / 3 * M / B + 4 * A + 1e-3


@pytest.mark.parametrize("settings, field, value", [
    ((("cycle_time_ms", "10"),), "cycle_s", 10e-3),                       # a setting its cost model takes
    ((("fusion_threshold_mb", "32"),), "fusion_bytes", 32 << 20),
    ((("cycle_time_ms", "0.1"), ("fp16_allreduce", "true")), "cycle_s", 1e-4),  # fp16: no option of that name
    ((("fp16_allreduce", "true"),), "cycle_s", 1e-3),                     # the defaults stand
    ((), "cycle_s", 1e-3),
])
def test_a_run_is_costed_at_its_own_settings(settings, field, value):
    """hvdps project --from costs each run at the settings it ran at: a setting and the cost model's
    option of one knob share a name (horovod_train/method.py)."""
    row = StepShape(backend="horovod", mode="sync", workers=3, compute_s=C, grad_bytes_per_step=M, settings=settings)
    tuned = methods.tuning_at(row, methods.tuning())
    assert getattr(tuned, field) == pytest.approx(value)
    # and the step follows: a longer cycle is a longer wait for the fused buffer, a shorter one a shorter
    step, _ = pj.projected_step(row, None, pj.single_layer(M), Everywhere(AlphaBeta(bandwidth=B, alpha=A)),
                                methods.tuning())
    at_default, _ = pj.projected_step(replace(row, settings=()), None, pj.single_layer(M),
                                      Everywhere(AlphaBeta(bandwidth=B, alpha=A)), methods.tuning())
    if field == "cycle_s":
        assert (step > at_default, step < at_default) == (value > 1e-3, value < 1e-3)


def test_a_run_at_its_own_settings_is_projected_on_a_row_of_its_own():
    ring = AlphaBeta(bandwidth=B, alpha=A)
    nets = {"allreduce": ring, "ps": ring}
    ran = [("horovod", "sync", ()), ("horovod", "sync", (("cycle_time_ms", "0.1"), ("fp16_allreduce", "true"))),
           ("mpi", "sync", ())]
    own = cmd.own_rows(nets, ring, ran)
    # only the part of its settings the cost model takes names the row; the defaults are the generic ring's
    assert own["Horovod [cycle_time_ms=0.1]"][2:] == ("sync", (("cycle_time_ms", "0.1"),))
    assert not any(k.startswith(("Horovod", "bare MPI")) and "[" not in k for k in own)
    rows = pj.project(pj.single_layer(M), C, [4], nets, own=own)
    fast = next(r for r in rows if r.arch == "Horovod [cycle_time_ms=0.1]")
    generic = next(r for r in rows if r.arch == methods.scheduler(collective=True).panel)
    assert fast.step_s < generic.step_s - 1e-4


@pytest.mark.parametrize("where", ["out", "out/runs", "out/runs/ps-sync-w2-ps1"])
def test_cluster_description_is_found_above_the_runs(tmp_path, where):
    (tmp_path / "out" / "runs" / "ps-sync-w2-ps1").mkdir(parents=True)
    (tmp_path / "out" / "cluster.json").write_text(json.dumps({"rate": "50mbit", "rate_bps": 5e7,
                                                               "latency_s": 4e-5}))
    desc = cmd.cluster_of(str(tmp_path / where))
    assert desc.rate_bps == 5e7
    assert cmd.cluster_of(str(tmp_path)) is None


def test_network_from_the_cluster_is_its_rate_at_tcp_goodput_and_its_latency():
    class Args:
        bandwidth_gbps = latency_us = None
    nets = cmd.networks(Args(), {}, cluster=ClusterDescription(rate_bps=5e7, latency_s=4e-5))
    assert list(nets) == list(cmd.generic_networks())           # every generic network, the cluster's links
    assert all(net == AlphaBeta(bandwidth=pytest.approx(5e7 / 8 * 1448 / 1514), alpha=4e-5) for net in nets.values())
    Args.bandwidth_gbps, Args.latency_us = 1.0, 10.0            # given flags win
    nets = cmd.networks(Args(), {}, cluster=ClusterDescription(rate_bps=5e7, latency_s=4e-5))
    assert all(net == AlphaBeta(bandwidth=1e9 / 8, alpha=pytest.approx(1e-5)) for net in nets.values())


def test_tf_ring_is_fitted_from_its_own_measurements():
    """comm_bandwidth.py's mwms rows (TensorFlow's ring) get a fit of their own, by the ring's formula."""
    res = [{"impl": "horovod-mpi", "bytes": b, "seconds": 2e-5 + b / 1e9} for b in (1e6, 1e7, 1e8)]
    res += [{"impl": "mwms", "bytes": b, "seconds": 6e-4 + b / 8e8} for b in (1e6, 1e7, 1e8)]
    fitted = pj.fit_from_comm([CommRow(**r) for r in res], 2)
    assert fitted["mwms"].alpha == pytest.approx(3e-4) and fitted["mwms"].bandwidth == pytest.approx(8e8)
    assert fitted["allreduce"].alpha == pytest.approx(1e-5)


@pytest.mark.parametrize("flags, cluster, own", [
    ({}, None, True),                                              # measured alone: each method its own fit
    ({"bandwidth_gbps": 10.0, "latency_us": 5.0}, None, False),    # given hardware: the same for every method
    ({}, ClusterDescription(rate_bps=5e7, latency_s=4e-5), False),             # an emulated cluster's links: likewise
])
def test_a_method_is_costed_with_its_own_fit_only_where_the_network_is_measured(flags, cluster, own):
    class Args:
        bandwidth_gbps = flags.get("bandwidth_gbps")
        latency_us = flags.get("latency_us")
    ring, ps, tf_ring = AlphaBeta(bandwidth=B, alpha=A), AlphaBeta(bandwidth=B, alpha=A), AlphaBeta(bandwidth=B / 2, alpha=3 * A)
    nets = cmd.networks(Args(), {"allreduce": ring, "ps": ps, "mwms": tf_ring}, cluster=cluster)
    row = StepShape(backend="mwms", mode="sync", workers=3, compute_s=C, grad_bytes_per_step=M)
    step, _ = pj.projected_step(row, None, pj.single_layer(M), nets, methods.tuning())
    net = tf_ring if own else nets["allreduce"]
    assert step == pytest.approx(C + schedule.ring_allreduce_time(3, M, net.bandwidth, net.alpha), rel=1e-9)
    # bare MPI's ring is the shared one either way
    step, _ = pj.projected_step(replace(row, backend="mpi"), None, pj.single_layer(M), nets, methods.tuning())
    shared = nets["allreduce"]
    assert step == pytest.approx(C + schedule.ring_allreduce_time(3, M, shared.bandwidth, shared.alpha), rel=1e-9)


def test_projection_lines_for_tf_ring_from_a_comm_file(tmp_path):
    """A comm file with TensorFlow's ring measured: the projection adds its line, on its own fit."""
    res = [{"impl": "horovod-mpi", "bytes": b, "seconds": 2e-5 + b / 1e9} for b in (1e6, 1e7, 1e8)]
    res += [{"impl": "mwms", "bytes": b, "seconds": 6e-4 + b / 8e8} for b in (1e6, 1e7, 1e8)]
    res += [{"impl": p, "bytes": b, "seconds": 1e-4 + b / 5e8} for p in ("ps-push", "ps-pull") for b in (1e6, 1e8)]
    comm = tmp_path / "comm.json"
    comm.write_text(json.dumps({"np": 2, "results": res}))
    out = tmp_path / "p"
    assert cmd.main(["--comm_json", str(comm), "--model_name", "resnet101", "--step_compute_ms", "500",
                    "--max_workers", "64", "--straggler_cv", "0", "--out", str(out)]) == 0
    data = json.load(open(out / "projection.json"))
    (label, fit), = data["own_fits"].items()
    assert fit["alpha"] == pytest.approx(3e-4) and "MWMS" in label
    tf64 = next(r for r in data["rows"] if r["workers"] == 64 and r["arch"] == label)
    assert tf64["step_s"] == pytest.approx(0.5 + schedule.ring_allreduce_time(64, data["grad_bytes"], 8e8, 3e-4), rel=1e-6)
    assert label in open(out / "projection.md").read()


@pytest.mark.unit
def test_an_in_process_projection_leaves_no_plugin_deadline_behind(tmp_path):
    """hvdps project bounds the plug-ins it rebuilds (--run_timeout) for its own life only: a test or a
    notebook that calls it in-process keeps its own budget (none) afterwards."""
    from common.spec import plugins
    from hvdps.commands import project
    before = plugins._budget
    assert project.main(["--bandwidth_gbps", "10", "--latency_us", "10", "--model_params", "25",
                         "--step_compute_ms", "100", "--run_timeout", "5", "--out", str(tmp_path / "p")]) in (0, None)
    assert plugins._budget == before


@pytest.mark.parametrize("repeat", [1, 2, 3])
def test_a_run_is_held_to_the_healthy_run_of_its_own_repeat(tmp_path, repeat):
    """The names hvdps compare gives its runs (plan_runs): each run with a slow or stalled worker is
    predicted from the healthy run of the same shape and the same repeat, which ran beside it in
    the alternating order (BENCHMARKS.md section 18), never another repeat's."""
    from hvdps.commands import compare
    args = compare.make_parser().parse_args(["--workers", "1,2", "--backends", "mpi,ps", "--straggler", "1:2,1:4",
                                             "--stall", "1:1000:250", "--slow_link", "h2=10mbit",
                                             "--repeat", str(repeat)])
    args.out = str(tmp_path)                      # as compare() sets it from the trainer's --train_dir
    runs = compare.plan_runs(args, [], cores=2)
    healthy = {r.identity: r for r in runs if r.condition is None}
    sick = [r for r in runs if r.condition is not None]
    # mpi, ps async, ps sync at 2 workers: F = 2, F = 4, the stall, the slow link; at 1 worker the slow link
    assert len(sick) == (3 * 4 + 3) * repeat
    for r in sick:
        twin = healthy[r.identity.healthy]
        assert (twin.backend, twin.mode, twin.workers) == (r.backend, r.mode, r.workers), (r.name, twin.name)
        assert twin.identity.repeat == r.identity.repeat and (r.identity.repeat is None) == (repeat == 1)
        assert os.path.basename(r.run_dir) == r.identity.name and os.path.basename(twin.run_dir) == twin.identity.name
    # a run on a cluster built with a slow link has no condition: its twin is its namesake
    assert next(iter(healthy)).healthy == next(iter(healthy))
