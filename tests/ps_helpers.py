"""Starting a parameter-server job role by role, as a user would (both PS implementations)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np

from common.base.procs import free_ports
from common.trainer.run_dir import load_weights_npz
from tests.conftest import REPO, env

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
