"""The sparse workload: a recommendation-style model (rec) on a Zipf-skewed click log (clicks).

Its embedding gradient is tf.IndexedSlices; every backend trains it, and the wire bytes each
reports are its own method's, from the gradient measured on a real batch: a PS moves the rows a
batch looks up, Horovod all-gathers them (or all-reduces whole tables with sparse_as_dense), bare
MPI all-reduces whole tables."""
import os
import sys

import numpy as np
import pytest

from allreduce.backend import ring_wire
from ps_train.backend import ps_wire
from common.spec.config import make_config
from common.inputs.data import CLICK_FEATURES
from common.base.errors import UsageError
from tests.conftest import BIN, REPO, py, run, row_and_records

ROWS, DIM, BATCH, HIDDEN = 20000, 8, 32, 32
FLAGS = ["--model", "rec", "--dataset", "clicks", "--embedding_rows", str(ROWS), "--embedding_dim", str(DIM),
         "--batch_size", str(BATCH), "--hidden_units", str(HIDDEN), "--train_steps", "200", "--log_every", "20",
         "--checkpoint_every_epoch", "false", "--target_accuracy", "0.7", "--probe_steps", "10"]
SPARSE = BATCH * CLICK_FEATURES * (DIM * 4 + 8)              # looked-up rows (float32) and their int64 ids
TABLE = 4 * CLICK_FEATURES * ROWS * DIM
DENSE = 4 * (CLICK_FEATURES * DIM * HIDDEN + HIDDEN + HIDDEN * 2 + 2)


def cfg(**kw):
    return make_config(model="rec", dataset="clicks", embedding_rows=ROWS, embedding_dim=DIM, batch_size=BATCH,
                       hidden_units=HIDDEN, **kw)


@pytest.mark.unit
def test_gradient_sizes_are_measured_slices():
    from common.model.models import build_model, gradient_sizes
    c = cfg()
    sizes = gradient_sizes(c, build_model(c))
    assert sizes["sparse_bytes"] == SPARSE and sizes["sparse_table_bytes"] == TABLE
    assert sizes["dense_bytes"] == DENSE
    assert sizes["sparse_rows"] == BATCH * CLICK_FEATURES
    assert 0 < sizes["sparse_unique_rows"] < sizes["sparse_rows"]      # hot ids repeat within a batch


@pytest.mark.unit
def test_dense_models_have_no_sparse_part():
    from common.model.models import build_model, gradient_bytes, gradient_sizes
    c = make_config()
    model = build_model(c)
    assert gradient_sizes(c, model) == {"dense_bytes": gradient_bytes(model), "sparse_bytes": 0,
                                        "sparse_table_bytes": 0, "sparse_rows": 0, "sparse_unique_rows": 0}


SIZES = {"dense_bytes": 1000, "sparse_bytes": 300, "sparse_table_bytes": 100000}


@pytest.mark.unit
@pytest.mark.parametrize("rule, n, expected", [
    (lambda n: ring_wire(SIZES, n, sparse="dense"), 2, 101000),            # 2(n-1)/n = 1: tables whole
    (lambda n: ring_wire(SIZES, n, sparse="dense"), 4, 151500),
    (lambda n: ring_wire(SIZES, n, sparse="allgather"), 2, 1000 + 300),    # dense ring + (n-1) x slices
    (lambda n: ring_wire(SIZES, n, sparse="allgather"), 4, 1500 + 900),
    (lambda n: ring_wire(SIZES, n, sparse="allgather", scale=0.5), 4, 1200),
    (lambda n: ps_wire(SIZES), 4, 2 * 1300),                                # push + pull, rows only
])
def test_wire_rules(rule, n, expected):
    assert rule(n)["bytes_per_step_per_worker"] == expected


def make_plan_for(n):
    from common.spec.plan import make_plan
    return make_plan(make_config(), 1000, n, 1)


@pytest.mark.unit
def test_clicks_are_skewed_and_balanced():
    from common.inputs.data import load_arrays
    x, y, xt, yt = load_arrays(cfg())
    assert x.dtype == np.int64 and x.shape == (32768, CLICK_FEATURES) and 0 <= x.min() and x.max() < ROWS
    counts = np.sort(np.bincount(x[:, 0], minlength=ROWS))[::-1]
    assert counts[:ROWS // 100].sum() > 0.6 * counts.sum()               # the hottest 1% of ids: most lookups
    assert 0.4 < y.mean() < 0.6 and 0.4 < yt.mean() < 0.6


@pytest.mark.unit
@pytest.mark.parametrize("kw, message", [
    ({"model": "rec", "dataset": "digits"}, "--model rec embeds categorical ids: it needs --dataset clicks"),
    ({"model": "mlp", "dataset": "clicks"}, "--dataset clicks holds categorical ids, not pixels"),
    ({"model": "rec", "dataset": "clicks", "embedding_rows": 10 ** 9, "embedding_dim": 64}, "GiB per process"),
    ({"model": "rec", "dataset": "clicks", "embedding_dim": 0}, "--embedding_dim must be positive"),
])
def test_bad_sparse_configs(kw, message):
    with pytest.raises(UsageError, match=message):
        make_config(**kw)


HVD = os.path.join(REPO, "horovod_train", "main.py")
MPI = os.path.join(REPO, "mpi_train", "main.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
          "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
HOROVODRUN = [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, HVD]
# backend -> (launch, bytes per worker step at 2 workers by its rule)
LAUNCH = {
    "horovod allgather": (lambda out: run([*HOROVODRUN, *FLAGS, "--train_dir", out], timeout=300),
                          DENSE + SPARSE),
    "horovod sparse_as_dense": (lambda out: run([*HOROVODRUN, *FLAGS, "--sparse_as_dense", "--train_dir", out],
                                                timeout=300), DENSE + TABLE),
    "mpi": (lambda out: run([*MPIRUN, sys.executable, MPI, *FLAGS, "--train_dir", out], timeout=300),
            DENSE + TABLE),
    "ps async": (lambda out: py("-m", "ps_train.launch", "--num_workers", "2", "--async", *FLAGS,
                                "--train_dir", out, timeout=300), 2 * (DENSE + SPARSE)),
    "ps sync": (lambda out: py("-m", "ps_train.launch", "--num_workers", "2", "--sync", *FLAGS,
                               "--train_dir", out, timeout=300), 2 * (DENSE + SPARSE)),
    "ps2": (lambda out: py("-m", "ps_train.launch", "--ps_api", "v2", "--num_workers", "2", *FLAGS,
                           "--train_dir", out, timeout=300), 2 * (DENSE + SPARSE)),
    "mwms": (lambda out: py("-m", "mwms_train.launch", "--num_workers", "2", *FLAGS, "--train_dir", out, timeout=300),
             DENSE + SPARSE),
}


@pytest.mark.process
@pytest.mark.parametrize("backend", list(LAUNCH))
def test_every_backend_trains_the_sparse_workload(tmp_path, backend):
    launch, wire = LAUNCH[backend]
    out = str(tmp_path / "run")
    r = launch(out)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    row, curves = row_and_records(out)
    assert row.status == "ok" and row.workers == 2 and row.model == "rec"
    assert row.time_to_target is not None, [e["accuracy"] for e in curves["evals"]]
    assert curves["summary"]["gradient"]["sparse_bytes"] == SPARSE
    assert row.bytes_per_step_per_worker == wire, (backend, row.wire_rule)


@pytest.mark.unit
@pytest.mark.parametrize("key, value", [("embedding_rows", ROWS // 2), ("embedding_dim", DIM * 2)])
def test_resume_refuses_another_table_size(tmp_path, key, value):
    from common.trainer.run_dir import check_resume_compatible
    cfg().save(str(tmp_path))
    with pytest.raises(UsageError, match=f"--resume: {key} was"):
        check_resume_compatible(cfg().replace(**{key: value}), str(tmp_path))
    check_resume_compatible(cfg(), str(tmp_path))       # the same tables resume
