"""Starting a parameter-server job role by role, as a user would (both PS implementations)."""
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from common.base.procs import free_ports
from common.trainer.run_dir import load_weights_npz
from tests.conftest import REPO, env, read_records

MAIN = os.path.join(REPO, "ps_train", "main.py")
FAST = ["--epochs", "4", "--batch_size", "32", "--log_every", "5", "--startup_timeout", "60"]


def _per_role(tmp_path, cluster, mode, extra=(), role_env=None):
    """Start every role by hand, as a user would; returns {name: Popen}. ``role_env``:
    {"chief:0": {VAR: value}} added to that role's environment."""
    procs = {}
    hosts = ["--ps_hosts=" + ",".join(cluster["ps"]), "--worker_hosts=" + ",".join(cluster["worker"])]
    if "chief" in cluster:
        hosts.append("--chief_host=" + cluster["chief"][0])
    for role in ("ps", "worker", "chief"):
        for i in range(len(cluster.get(role, []))):
            argv = [sys.executable, MAIN, f"--job_name={role}", f"--task_index={i}", *hosts,
                    *FAST, mode, "--train_dir", str(tmp_path / "run"), *extra]
            procs[f"{role}:{i}"] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                    env=env(**(role_env or {}).get(f"{role}:{i}", {})),
                                                    start_new_session=True)
    return procs


def _finish(procs, timeout):
    outs, deadline = {}, time.monotonic() + timeout
    try:
        for name, p in procs.items():
            outs[name] = p.communicate(timeout=max(1, deadline - time.monotonic()))[0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return outs


def _wait_for_steps(run_dir, count, timeout=120):
    """Until the chief has logged ``count`` step records (training is really under way)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (not metrics.exists() or metrics.read_text().count('"step"') < count):
        time.sleep(0.5)
    assert metrics.exists(), "training never started"


def _wait_for_every_worker(run_dir, timeout=120):
    """Until the chief has logged a step record in which every worker has made a step of its own
    (``worker_steps`` all above 0): every task is past its start-up and training. The chief's own
    records come first; an asynchronous worker that is still starting when its PS is killed waits
    for the PS as at start-up (``--startup_timeout``), which is not what a test of training checks."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # the project's reader (a torn last line, the one being written, is not a record)
        for record in (read_records(str(metrics)) if metrics.exists() else []):
            if record["type"] == "step" and record.get("worker_steps") and min(record["worker_steps"]) > 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"not every worker stepped within {timeout}s: {metrics}")


def _cluster(num_ps=1, num_workers=2, chief=False):
    ports = free_ports(num_ps + num_workers + int(chief))
    cluster = {"ps": [f"127.0.0.1:{p}" for p in ports[:num_ps]],
               "worker": [f"127.0.0.1:{p}" for p in ports[num_ps:num_ps + num_workers]]}
    if chief:
        cluster["chief"] = [f"127.0.0.1:{ports[-1]}"]
    return cluster


def assert_same_weights(run_a, run_b, rel=1e-5):
    """Two runs' weights.npz agree, tensor by tensor, within ``rel`` of the norm."""
    a = load_weights_npz(os.path.join(str(run_a), "weights.npz"))
    b = load_weights_npz(os.path.join(str(run_b), "weights.npz"))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert np.linalg.norm(x - y) <= rel * np.linalg.norm(y), np.linalg.norm(x - y)


LOCKSTEP_ATTEMPTS = 3


def lockstep(start, run_dir):
    """Run ``start()`` (a sync PS job writing ``run_dir``) until every worker pushed one batch an
    update, at most LOCKSTEP_ATTEMPTS times; returns the last result.

    Only such a run is big-batch SGD, which the callers hold it to: SyncReplicasOptimizer hands an
    update's tokens to whichever worker asks first, and a worker descheduled between its push and its
    next token lets a faster peer push twice into one update (docs/ps.md). The run says so itself,
    in the summary's worker_steps ([16, 14] in one of sixteen fresh-clone suites on this 2-core
    machine), so a run that says so is started again rather than compared."""
    seen = []
    for _ in range(LOCKSTEP_ATTEMPTS):
        shutil.rmtree(run_dir, ignore_errors=True)
        result = start()
        assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-5000:]}\n{result.stderr[-3000:]}"
        counts = [r for r in read_records(os.path.join(run_dir, "metrics.jsonl")) if r["type"] == "summary"][-1]["worker_steps"]
        if len(set(counts)) == 1:
            return result
        seen.append(counts)
    raise AssertionError(f"no run of {LOCKSTEP_ATTEMPTS} pushed one batch per worker an update: worker_steps {seen}")
