"""The local PS cluster launcher: prefixes, exit codes, and teardown with no orphans."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, env, py

LONG = ["--epochs", "200", "--batch_size", "8", "--log_every", "5"]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is dead for our purposes
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(tmp_path, *args):
    p = subprocess.Popen([sys.executable, "-m", "ps_train.launch", *args, "--train_dir", str(tmp_path / "r")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(), cwd=REPO,
                         start_new_session=True)
    lines, pids, ports = [], {}, []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "[launch] started" in line:
            pids = {n: int(pid) for n, pid in re.findall(r"(\w+:\d) \(pid (\d+)\)", line)}
        if "[worker:0] [ps] step" in line or "[worker:0] epoch 1" in line:
            break
    return p, lines, pids


def _finish(p, timeout=60):
    try:
        out = p.communicate(timeout=timeout)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    return out


@pytest.mark.parametrize("how", ["sigint", "sigterm"])
def test_interrupt_tears_everything_down(tmp_path, how):
    p, lines, pids = _start(tmp_path, "--num_ps", "1", "--num_workers", "2", *LONG)
    assert len(pids) == 3, "".join(lines)
    assert all(_alive(pid) for pid in pids.values())
    p.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
    out = _finish(p)
    assert p.returncode == 130, out
    assert "[launch] interrupted: stopping the cluster" in out
    time.sleep(0.5)
    assert not [n for n, pid in pids.items() if _alive(pid)]


def test_killed_ps_stops_cluster_with_failure(tmp_path):
    p, lines, pids = _start(tmp_path, "--num_ps", "1", "--num_workers", "2", *LONG)
    assert "ps:0" in pids, "".join(lines)
    os.kill(pids["ps:0"], signal.SIGKILL)
    out = _finish(p, 90)
    assert p.returncode != 0
    assert "[launch] ps:0 exited with code -9; a PS is gone: stopping the cluster" in out
    time.sleep(0.5)
    assert not [n for n, pid in pids.items() if _alive(pid)]


def test_launcher_killed_hard_leaves_no_orphans(tmp_path):
    p, lines, pids = _start(tmp_path, "--num_ps", "1", "--num_workers", "1", *LONG)
    assert len(pids) == 2, "".join(lines)
    os.kill(p.pid, signal.SIGKILL)
    _finish(p, 30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.2)
    assert not [n for n, pid in pids.items() if _alive(pid)]


def test_prefixes_and_chief_exit_code(tmp_path):
    r = py("-m", "ps_train.launch", "--num_ps", "1", "--num_workers", "1", "--train_steps", "20",
           "--train_dir", str(tmp_path / "r"), timeout=180)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "[ps:0] ps:0 serving on 127.0.0.1:" in r.stdout
    assert "[worker:0] samples/sec:" in r.stdout
    assert "[launch] chief exit code 0" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--num_workers", "0"], "error: --num_ps and --num_workers must be at least 1"),
    (["--job_name", "ps"], "error: --job_name is chosen by the launcher"),
    (["--model", "nope"], "error: unknown model 'nope'"),
    (["--num_ps", "many"], "error: argument --num_ps: invalid int value: 'many'"),
])
def test_launcher_bad_input(args, message):
    r = py("-m", "ps_train.launch", *args, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().startswith(message), r.stderr
