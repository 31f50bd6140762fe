"""Gossip SGD (gossip_train): its registry entry, neighbours, wire rule and cost model in-process, then
the trainer under mpirun: at two ranks its one neighbour's average is the ring's update weight for
weight, at four the ranks mix with two neighbours each and still train to the target; a comparison
reports it, projects it on rows of its own, runs it with a slow worker, and writes its MPIJob."""
import json
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from common.trainer.run_dir import load_weights_npz
from gossip_train.backend import GossipBackend, gossip_wire, neighbours
from hvdps import methods
from hvdps.cost import schedule
from hvdps.cost.model import Everywhere
from hvdps.cost.schedule import AlphaBeta
from hvdps.cost.shape import StepShape
from tests.conftest import BIN, REPO, SYNC_EQUIV, row_and_records, run

MAIN = os.path.join(REPO, "gossip_train", "main.py")
MPI_MAIN = os.path.join(REPO, "mpi_train", "main.py")


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), "-bind-to", "none", "-map-by", "slot",
            "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
            "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]


SIZES = {"dense_bytes": 4000, "sparse_bytes": 50, "sparse_table_bytes": 6000}
NET = AlphaBeta(bandwidth=1e9, alpha=1e-5)


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.mark.unit
@pytest.mark.parametrize("rank, size, expected", [
    (0, 1, []), (0, 2, [1]), (1, 2, [0]), (0, 3, [2, 1]), (2, 3, [1, 0]), (0, 4, [3, 1]), (3, 4, [2, 0]),
    (5, 8, [4, 6]),
])
def test_each_rank_has_its_ring_neighbours(rank, size, expected):
    assert neighbours(rank, size) == expected


@pytest.mark.unit
@pytest.mark.parametrize("workers, degree", [(1, 0), (2, 1), (3, 2), (4, 2), (512, 2)])
def test_the_wire_rule_is_the_whole_model_to_each_neighbour(workers, degree):
    """Whatever the number of workers: the model (tables whole) once per neighbour, not 2(n-1)/n of it."""
    backend = GossipBackend()
    backend.world_size = workers
    wire = backend.wire_bytes(SIZES, plan=None)
    assert wire == gossip_wire(SIZES, workers)
    assert wire["bytes_per_step_per_worker"] == degree * 10000 and f"{degree} neighbour" in wire["wire_rule"]


@pytest.mark.unit
def test_its_entry_and_wording():
    m = methods.get("gossip")
    assert [v.pair for v in methods.parse_variants("gossip,mpi")] == [("gossip", "ring"), ("mpi", "sync")]
    assert m.label("ring") == "gossip SGD (ring)" and m.exchange_timed == "MPI_Neighbor_allgather"
    assert "neighbours" in m.overhead_parts("ring", alone=False, measured_wait=False)[0]
    assert not m.cost.exact and m.cost.collective and methods.get("mpi").cost.exact


@pytest.mark.unit
@pytest.mark.parametrize("n", [2, 4, 64, 512])
def test_the_cost_model_is_a_latency_and_the_neighbours_bytes(n):
    """One latency and degree x M over the bandwidth, against the ring's 2(n-1) latencies and
    2(n-1)/n x M: the ring wins on bytes at small n, gossip on latencies at large n."""
    cost = methods.get("gossip").cost
    grad = 4e6
    row = StepShape(backend="gossip", mode="ring", workers=n, compute_s=0.01, grad_bytes_per_step=grad)
    degree = 1 if n == 2 else 2
    t = NET.alpha + degree * grad / NET.bandwidth
    assert cost.exchange_s(row, Everywhere(NET)) == pytest.approx(t)
    step, how = cost.projected_step(row, None, None, Everywhere(NET), methods.tuning())
    assert step == pytest.approx(0.01 + t) and "neighbour" in how
    ring = schedule.ring_allreduce_time(n, grad, NET.bandwidth, NET.alpha)
    small = StepShape(backend="gossip", mode="ring", workers=n, compute_s=0.01, grad_bytes_per_step=1e3)
    assert (cost.exchange_s(row, Everywhere(NET)) > ring) == (n == 4)             # bytes: the ring's 1.5 M
    assert (cost.exchange_s(small, Everywhere(NET)) < schedule.ring_allreduce_time(n, 1e3, NET.bandwidth, NET.alpha))
    alone = StepShape(backend="gossip", mode="ring", workers=1, compute_s=0.01, grad_bytes_per_step=grad)
    assert cost.projected_step(alone, None, None, Everywhere(NET), methods.tuning())[0] == pytest.approx(0.01)


@pytest.mark.unit
@pytest.mark.parametrize("roles, expected", [
    ({"rank:0": "h1", "rank:1": "h2"}, {"h1": (1, 1), "h2": (1, 1)}),
    ({"rank:0": "h1", "rank:1": "h1"}, {"h1": (0, 0)}),                         # one host: no link
    ({f"rank:{i}": f"h{i}" for i in range(4)}, {f"h{i}": (2, 2) for i in range(4)}),
    # two hosts of two: ranks 0,1 on h1 and 2,3 on h2; 0's left (3) and 1's right (2) cross
    ({"rank:0": "h1", "rank:1": "h1", "rank:2": "h2", "rank:3": "h2"}, {"h1": (2, 2), "h2": (2, 2)}),
])
def test_the_links_carry_what_crosses_hosts(roles, expected):
    gradient = SimpleNamespace(dense_bytes=1000, sparse_bytes=50, sparse_table_bytes=9000)
    links = methods.get("gossip").cost.predict_links("ring", roles, gradient)
    assert links == {h: {"in": i * 10000, "out": o * 10000} for h, (i, o) in expected.items()}


@pytest.mark.process
def test_two_ranks_are_the_rings_update_and_four_are_not(tmp_path):
    """At two ranks the one neighbour's average after a plain-SGD step is the averaged gradient's step:
    bare MPI's weights (relative 1e-5). At four each rank mixes with two of three, and the ranks'
    weights differ from the ring's before the run's final average: the check can fail."""
    def train(main, name, n, *extra):
        out = str(tmp_path / name)
        ok(run([*mpirun(n), sys.executable, main, *SYNC_EQUIV, "--batch_size", "16", *extra, "--train_dir", out],
               timeout=240))
        return load_weights_npz(os.path.join(out, "weights.npz")), out
    (ring, _), (two, _) = train(MPI_MAIN, "ring", 2), train(MAIN, "g2", 2)
    for a, b in zip(two, ring):
        assert np.linalg.norm(a - b) <= 1e-5 * max(np.linalg.norm(b), 1e-12), np.linalg.norm(a - b)
    (ring4, _), (four, out) = train(MPI_MAIN, "ring4", 4), train(MAIN, "g4", 4)
    assert max(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12) for a, b in zip(four, ring4)) > 1e-4
    row, curves = row_and_records(out)
    assert curves["header"]["neighbours"] == 2 and curves["summary"]["mixings"] == row.steps
    assert curves["summary"]["max_weight_divergence"] == 0.0          # the run ends in the ranks' average


@pytest.mark.process
def test_a_comparison_trains_projects_and_slows_it(tmp_path):
    """hvdps compare with gossip SGD at 2 and 4 ranks beside bare MPI on the digits MLP: every run
    reaches 0.9, the books say what was exchanged, the report names the neighbourhood collective, the
    projection draws its own rows to 512 workers, and a slow worker slows it (its healthy twin beside)."""
    out = tmp_path / "cmp"
    hvdps = os.path.join(BIN, "hvdps")
    ok(run([hvdps, "compare", "--workers", "2,4", "--backends", "mpi,gossip", "--no_progress", "--out", str(out)],
           timeout=600))
    rows = {(x["backend"], x["workers"]): x for x in json.load(open(out / "results.json"))["rows"]}
    assert set(rows) == {("mpi", 2), ("mpi", 4), ("gossip", 2), ("gossip", 4)}
    for x in rows.values():
        assert x["status"] == "ok" and x["final_test_accuracy"] >= 0.9, x
    row, curves = row_and_records(rows[("gossip", 4)]["run_dir"])
    assert curves["summary"]["breakdown"]["bytes_per_step_per_worker"] == 2 * row.grad_bytes_per_step
    assert 0 < curves["summary"]["exchange_s_per_step"] < curves["summary"]["breakdown"]["step_s"]
    report = (out / "report.md").read_text()
    assert "| mlp | gossip | ring | 4 |" in report and "measured inside MPI_Neighbor_allgather" in report
    ok(run([hvdps, "project", "--from", str(out / "runs"), "--bandwidth_gbps", "25", "--latency_us", "10",
            "--max_workers", "512", "--out", str(tmp_path / "proj")], timeout=300))
    projection = (tmp_path / "proj" / "projection.md").read_text()
    header = next(line for line in projection.splitlines() if line.startswith("| workers |"))
    at512 = next(line for line in projection.splitlines() if line.startswith("| 512 |"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in at512.split("|")]))
    gossip, ring = (float(cells[k].split("%")[0]) for k in ("gossip SGD (ring) eff. (step ms)",
                                                           "ring all-reduce eff. (step ms)"))
    assert gossip > ring                 # one latency a step against the ring's 2(n-1) on a 1 ms step
    slow = tmp_path / "slow"
    ok(run([hvdps, "compare", "--workers", "2", "--backends", "gossip", "--straggler", "1:4", "--train_steps", "200",
            "--no_progress", "--out", str(slow)], timeout=600))
    by = {x["run_dir"].rsplit("/", 1)[-1]: x for x in json.load(open(slow / "results.json"))["rows"]}
    assert set(by) == {"gossip-ring-w2", "gossip-ring-w2-slow1x4"}
    assert by["gossip-ring-w2-slow1x4"]["samples_per_sec_median"] < 0.8 * by["gossip-ring-w2"]["samples_per_sec_median"]


@pytest.mark.process
def test_its_mpijob_and_launch_line(tmp_path):
    hvdps = os.path.join(BIN, "hvdps")
    dry = ok(run([hvdps, "launch", "gossip", "--num_workers", "4", "--dry_run", "--train_dir", str(tmp_path / "r")],
                 timeout=60))
    assert "-np 4" in dry.stdout and "gossip_train/main.py --train_dir" in dry.stdout
    ok(run([hvdps, "k8s", "--backends", "gossip", "--workers", "4", "--image", "hvdps:dev", "--out",
            str(tmp_path / "k8s")], timeout=120))
    manifest = (tmp_path / "k8s" / "gossip-ring-w4.yaml").read_text()
    assert "kind: MPIJob" in manifest and "gossip_train/main.py" in manifest and "-np, '4'" in manifest
