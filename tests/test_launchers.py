"""The application tier's launchers: the registry's name -> launcher lookup, and what a local job exposes."""
import os
import re
import signal
import subprocess
import time

import pytest

from common.base.errors import UsageError
from common.base.procs import child_env
from hvdps.methods import METHODS, get_launcher
from tests.conftest import REPO, VALID_BACKENDS, descendants

LONG = ["--epochs", "300", "--batch_size", "8", "--log_every", "5"]


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(UsageError, match=re.escape(f"unknown backend 'mxnet' (valid: {VALID_BACKENDS})")):
        get_launcher("mxnet")
    assert {"horovod", "mpi", "mwms", "ps", "ps2"} <= set(METHODS)


@pytest.mark.parametrize("name, mode, pinned, expect", [
    ("horovod", "sync", False, ["-bind-to", "none", "--mca", "btl", "self,vader"]),
    ("horovod", "sync", True, ["-bind-to", "core", "--threads_per_worker", "1"]),
    ("mpi", "sync", False, ["-np", "3", "-bind-to", "none", "-map-by", "slot"]),
    ("ps", "sync", False, ["-m", "ps_train.launch", "--num_workers", "3", "--sync"]),
    ("ps", "async", True, ["--async", "--pin_workers", "--threads_per_worker", "1"]),
])
def test_commands(name, mode, pinned, expect, tmp_path):
    argv = get_launcher(name).command(3, ["--train_dir", str(tmp_path)], mode=mode, pin_cores=pinned)
    text = " ".join(argv)
    assert " ".join(expect) in text or all(e in argv for e in expect), argv
    assert argv[-2:] == ["--train_dir", str(tmp_path)]
    main = {"horovod": "horovod_train/main.py", "mpi": "mpi_train/main.py"}.get(name, "ps_train.launch")
    assert any(a.endswith(main) for a in argv), argv


def _listening(pids):
    text = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[3] for line in text.splitlines() if any(f"pid={pid}," in line for pid in pids)]


@pytest.mark.parametrize("name", ["horovod", "mpi", "mwms"])
@pytest.mark.process
def test_local_job_listens_on_loopback_only(tmp_path, name):
    """Everything a local comparison run starts (mpirun and its PMIx listener included) is
    reachable from this machine only. The PS launcher's tasks, both APIs, with every task's
    listeners named: test_launch.py."""
    launcher = get_launcher(name)
    argv = launcher.command(2, [*LONG, "--train_dir", str(tmp_path / "run")], mode="async")
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                         env=child_env(**launcher.env()), start_new_session=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and '"step"' in metrics.read_text()):
            assert p.poll() is None, f"{name} job ended early ({p.returncode})"
            time.sleep(0.5)
        assert metrics.exists(), "training never started"
        addresses = _listening([p.pid, *descendants(p.pid)])
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert addresses, "found no listening sockets at all (is ss working?)"
    for addr in addresses:
        assert addr.rsplit(":", 1)[0] in ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]"), addresses
