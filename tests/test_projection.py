"""The alpha-beta cost model against hand-computed values, and the --project command."""
import json
import os

import pytest

from hvdps import projection as pj
from tests.conftest import BIN, run


@pytest.mark.parametrize("n, nbytes, bw, alpha, expected", [
    (1, 100e6, 1e9, 1e-5, 0.0),                                  # nothing to exchange
    (2, 100e6, 1e9, 1e-5, 0.1 + 2 * 1e-5),                       # 2(1)/2 * 0.1 s + 2 alphas
    (4, 100e6, 1e9, 0.0, 2 * 3 / 4 * 0.1),                       # 0.15 s
    (512, 178e6, 3.125e9, 1e-5, 2 * 511 / 512 * 178e6 / 3.125e9 + 2 * 511 * 1e-5),
])
def test_ring(n, nbytes, bw, alpha, expected):
    assert pj.ring_allreduce_time(n, nbytes, bw, alpha) == pytest.approx(expected)


@pytest.mark.parametrize("n, k, g, expected", [
    (1, 1, 1, 2 * 0.1),            # one worker, one PS: push + pull of M
    (8, 1, 1, 2 * 0.8),            # the PS receives 8 M per direction
    (8, 4, 1, 2 * 0.2),            # sharded over 4 PS
    (8, 8, 4, 2 * 0.4),            # server NIC with 4 workers is now the bottleneck
])
def test_ps(n, k, g, expected):
    assert pj.ps_time(n, 100e6, 1e9, 0.0, shards=k, per_server=g) == pytest.approx(expected)


def test_efficiency_and_overlap():
    assert pj.efficiency(1.0, 1.0) == pytest.approx(0.5)
    assert pj.efficiency(1.0, 1.0, overlap=0.5) == pytest.approx(1 / 1.5)


def test_fit_recovers_parameters():
    alpha, bw = 5e-5, 2e9
    pts = [(b, alpha + b / bw) for b in (1e5, 1e6, 1e7, 1e8)]
    a, b = pj.fit_alpha_beta(pts)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(bw, rel=1e-6)


def test_fit_from_comm_uses_ring_formula():
    # 2 ranks: t = 2 alpha + M/B, so the per-hop alpha is half the intercept
    res = [{"impl": "horovod-mpi", "bytes": b, "seconds": 2e-5 + b / 1e9} for b in (1e6, 1e7, 1e8)]
    res += [{"impl": "ps-push", "bytes": b, "seconds": 1e-4 + b / 5e8} for b in (1e6, 1e8)]
    res += [{"impl": "ps-pull", "bytes": b, "seconds": 1e-4 + b / 5e8} for b in (1e6, 1e8)]
    fits = pj.fit_from_comm(res, 2)
    assert fits["allreduce"]["alpha"] == pytest.approx(1e-5)
    assert fits["allreduce"]["bandwidth"] == pytest.approx(1e9)
    assert fits["ps"]["bandwidth"] == pytest.approx(5e8)


def test_project_command(tmp_path):
    out = tmp_path / "p"
    r = run([os.path.join(BIN, "hvdps-compare"), "--project", "--bandwidth-gbps", "25", "--latency-us", "10",
             "--model-name", "resnet101", "--step-compute-ms", "580", "--gpus-per-server", "4",
             "--out", str(out)], timeout=120)
    assert r.returncode == 0, r.stderr
    data = json.load(open(out / "projection.json"))
    ring512 = next(x for x in data["rows"] if x["workers"] == 512 and x["arch"] == "ring all-reduce")
    t = pj.ring_allreduce_time(512, 44.5e6 * 4, 25e9 / 8, 10e-6)
    assert ring512["efficiency"] == pytest.approx(0.58 / (0.58 + t))
    assert (out / "projection.png").stat().st_size > 5000


@pytest.mark.parametrize("args, message", [
    (["--bandwidth-gbps", "-3", "--latency-us", "10"], "--bandwidth-gbps must be positive, got -3.0"),
    (["--comm-json", "{bad}"], "not a comm_bandwidth.py result file"),
    (["--comm-json", "/no/such.json"], "--comm-json /no/such.json: no such file"),
])
def test_project_bad_input(tmp_path, args, message):
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    args = [str(bad) if a == "{bad}" else a for a in args]
    r = run([os.path.join(BIN, "hvdps-compare"), "--project", *args, "--model-name", "vgg16",
             "--step-compute-ms", "100", "--out", str(tmp_path / "p")], timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_project_needs_inputs(tmp_path):
    r = run([os.path.join(BIN, "hvdps-compare"), "--project", "--bandwidth-gbps", "25", "--latency-us", "10",
             "--out", str(tmp_path / "p")], timeout=60)
    assert r.returncode == 2 and "needs the gradient size" in r.stderr
