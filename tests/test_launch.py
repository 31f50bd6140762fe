"""The local PS cluster launcher: prefixes, exit codes, and teardown with no orphans."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from common.spec.config import Config
from tests.conftest import REPO, env, py, read_records

pytestmark = pytest.mark.process

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
    lines, pids = [], {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "[launch] started" in line:
            pids = {n: int(pid) for n, pid in re.findall(r"(\w+:\d) \(pid (\d+)\)", line)}
        if any(mark in line for mark in ("[worker:0] [ps] step", "[worker:0] epoch 1",     # v1
                                         "[chief:0] [ps2] step", "[chief:0] epoch 1")):    # v2
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


def test_killed_ps_stops_cluster_with_failure(tmp_path):
    p, lines, pids = _start(tmp_path, "--num_ps", "1", "--num_workers", "2", *LONG)
    assert "ps:0" in pids, "".join(lines)
    os.kill(pids["ps:0"], signal.SIGKILL)
    out = _finish(p, 90)
    assert p.returncode != 0
    assert "[launch] ps:0 was killed by SIGKILL; a PS is gone: stopping the cluster" in out
    assert "[launch] exit code 1 (ps:0 was killed by SIGKILL)" in out
    time.sleep(0.5)
    assert not [n for n, pid in pids.items() if _alive(pid)]


def test_killed_sync_worker_is_named(tmp_path):
    p, lines, pids = _start(tmp_path, "--num_ps", "1", "--num_workers", "2", "--sync", *LONG)
    assert "worker:1" in pids, "".join(lines)
    os.kill(pids["worker:1"], signal.SIGKILL)
    out = _finish(p, 90)
    assert p.returncode == 1, out
    assert "[launch] worker:1 was killed by SIGKILL; sync training needs every worker" in out
    assert "[launch] exit code 1 (worker:1 was killed by SIGKILL)" in out
    time.sleep(0.5)
    assert not [n for n, pid in pids.items() if _alive(pid)]


def _listeners(pids):
    """{pid: [local address:port, ...]} of the TCP listening sockets these processes own."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
    found = {}
    for line in out.splitlines():
        for pid in pids:
            if f"pid={pid}," in line:
                found.setdefault(pid, []).append(line.split()[3])
    return found


@pytest.mark.parametrize("api, tasks, how", [("v1", 4, "sigint"), ("v2", 5, "sigterm")])  # v2: and the chief
def test_every_task_listens_on_loopback_only_and_an_interrupt_tears_everything_down(tmp_path, api, tasks, how):
    """TensorFlow's gRPC server binds every interface by itself; hvdps' tasks must not. Then Ctrl-C (or
    SIGTERM) of the launcher stops every task and exits 130."""
    p, lines, pids = _start(tmp_path, "--num_ps", "2", "--num_workers", "2", "--ps_api", api, *LONG)
    try:
        assert len(pids) == tasks, "".join(lines)
        assert all(_alive(pid) for pid in pids.values())
        found = _listeners(pids.values())
    finally:
        p.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        out = _finish(p)
    assert set(found) == set(pids.values()), (found, pids)       # every task's server was seen
    for pid, addrs in found.items():
        for addr in addrs:
            host = addr.rsplit(":", 1)[0]
            assert host in ("127.0.0.1", "[::ffff:127.0.0.1]"), (pid, addrs)
    assert p.returncode == 130, out
    assert "[launch] interrupted: stopping the cluster" in out
    time.sleep(0.5)
    assert not [n for n, pid in pids.items() if _alive(pid)]


@pytest.mark.parametrize("mode", ["--async", "--sync"])
def test_max_restarts_recovers_from_a_killed_ps(tmp_path, mode):
    """kill -9 the PS mid-run: the launcher restarts every role from the latest checkpoint,
    the run finishes, and what the restart lost is at most one checkpoint interval."""
    interval = 20
    p, lines, pids = _start(tmp_path, "--num_ps", "1", "--num_workers", "2", mode, "--max_restarts", "2",
                            "--checkpoint_steps", str(interval), "--epochs", "4", "--batch_size", "8",
                            "--log_every", "5")
    ckpt = tmp_path / "r" / "checkpoints" / "checkpoint"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (ckpt.exists() and "ckpt-0" not in ckpt.read_text()):
            time.sleep(0.2)
        assert ckpt.exists(), "".join(lines)
        os.kill(pids["ps:0"], signal.SIGKILL)
        out = _finish(p, 300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, out[-4000:]
    info = json.load(open(tmp_path / "r" / "launch.json"))
    assert len(info["restarts"]) == 1, info
    restart = info["restarts"][0]
    assert restart["after"] == "ps:0 was killed by SIGKILL" and restart["resumed_from"] > 0
    # async: a step already under way on each worker may land after the last save
    assert 0 <= restart["lost_updates"] <= interval + (2 if mode == "--async" else 0), restart
    assert "restart 1/2 after ps:0 was killed by SIGKILL" in out
    from hvdps.measure.rows import load_run
    row = load_run(str(tmp_path / "r"))
    assert row.status == "ok" and row.final_test_accuracy >= 0.9, row
    headers = [r for r in read_records(
        str(tmp_path / "r" / "metrics.jsonl")) if r["type"] == "header"]
    assert [h["start_step"] for h in headers] == [0, restart["resumed_from"]]
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
    assert "[launch] exit code 0 (worker:0 (chief) exited with code 0)" in r.stdout


def test_closing_line_says_why(tmp_path):
    """The last line names what ended the job and repeats the failing role's own error: here the
    chief's, on a run whose checkpoint is damaged (the launcher's own checks, on the index, the config
    and the job, pass; only restoring it tells). The chief's line comes through whole, not wrapped."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10"\n')
    (run_dir / "checkpoints" / "model.ckpt-10.index").write_bytes(b"not a checkpoint")
    (run_dir / "checkpoints" / "model.ckpt-10.data-00000-of-00001").write_bytes(b"\0" * 64)
    (run_dir / "config.json").write_text(Config(train_dir=str(run_dir)).to_json())
    (run_dir / "metrics.jsonl").write_text(json.dumps({"type": "header", "backend": "ps", "mode": "async",
                                                       "world_size": 2, "tasks": {"ps": 1}}) + "\n")
    r = py("-m", "ps_train.launch", "--num_ps", "1", "--num_workers", "2", "--resume",
           "--train_dir", str(run_dir), timeout=180)
    assert r.returncode == 2
    assert r.stdout.strip().splitlines()[-1] == "[launch] exit code 2 (worker:0 (chief) exited with code 2)"
    last = r.stderr.strip().splitlines()[-1]       # the task's own line, passed through whole
    assert last.startswith("error: --resume: cannot restore "), last
    assert sum(line.startswith("error:") for line in r.stderr.splitlines()) == 1, r.stderr[-2000:]


@pytest.mark.parametrize("args, message", [
    (["--num_workers", "0"], "error: --num_ps and --num_workers must be at least 1"),
    (["--job_name", "ps"], "error: --job_name is chosen by the launcher"),
    (["--model", "nope"], "error: unknown model 'nope'"),
    (["--num_ps", "many"], "error: argument --num_ps: invalid int value: 'many'"),
    (["--run_timeout", "-5"], "error: --run_timeout must be >= 0, got -5.0"),
    (["--run_timeout", "nan"], "error: --run_timeout must be a finite number, got nan"),
    (["--learning_rate", "nan"], "error: --learning_rate must be a finite number, got nan"),
    (["--step_timeout", "inf"], "error: --step_timeout must be a finite number, got inf"),
    (["--startup_timeout", "nan"], "error: --startup_timeout must be a finite number, got nan"),
    (["--threads_per_worker", "-1"], "error: --threads_per_worker must be >= 0, got -1"),
])
def test_launcher_bad_input(args, message):
    r = py("-m", "ps_train.launch", *args, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().startswith(message), r.stderr
