"""Elastic Horovod under the real horovodrun driver: a rank dies, training goes on; a slot comes back, it grows.

Two host names that both mean this machine (localhost and 127.0.0.1) let
Horovod's driver see two hosts: the rank on 127.0.0.1 is the one killed, so
its host is blacklisted while localhost carries on.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from hvdps.measure.timeline import write_timeline

from tests.conftest import read_records
from tests.conftest import BIN, REPO, check_timeline, env

pytestmark = pytest.mark.process

MAIN = os.path.join(REPO, "horovod_train", "main.py")


def _discovery(tmp_path, hosts):
    (tmp_path / "hosts").write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    script.chmod(0o755)
    return str(script)


def _horovodrun(tmp_path, np_, min_np, max_np, *args):
    return [os.path.join(BIN, "horovodrun"), "-np", str(np_), "--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", str(tmp_path / "discover.sh"), "--network-interface", "lo",
            "--gloo-timeout-seconds", "30", sys.executable, MAIN, "--elastic", "--batch_size", "16",
            "--log_every", "5", "--commit_steps", "5", "--train_dir", str(tmp_path / "run"), *args]


def _records(tmp_path, kind):
    path = tmp_path / "run" / "metrics.jsonl"
    return [r for r in read_records(str(path)) if r["type"] == kind] if path.exists() else []


def _tail(log, lines=40):
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _wait_for(predicate, timeout, what, proc, log):
    """Waits for ``predicate``; a failure carries the tail of horovodrun's output, which names the rank that ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, \
            f"horovodrun ended early ({proc.returncode}) while waiting for {what}:\n{_tail(log)}"
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout}s waiting for {what}:\n{_tail(log)}")


def _ranks_on(host, train_dir):
    """PIDs of this job's training processes (by their --train_dir) that Horovod placed on ``host``.

    Horovod starts each worker in a process group of its own, so the group of
    horovodrun does not find them."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"HOROVOD_HOSTNAME={host}".encode() in environ and str(train_dir).encode() in cmdline \
                and any(a.endswith(b"horovod_train/main.py") for a in cmdline):
            pids.append(int(pid))
    return pids


def _all_ranks(tmp_path):
    return _ranks_on("localhost", tmp_path / "run") + _ranks_on("127.0.0.1", tmp_path / "run")


def test_static_elastic_run_trains(jobs):
    """The shared job (tests/jobs.py) under horovodrun --host-discovery-script with a fixed 2 slots."""
    import pathlib
    summary = _records(pathlib.Path(jobs("elastic")).parent, "summary")[-1]
    assert summary["status"] == "ok" and summary["final_test_accuracy"] >= 0.9
    assert summary["max_weight_divergence"] == 0.0
    # each process timed its own steps under the rank it ended with: a timeline track each
    run_dir = str(jobs("elastic"))
    assert write_timeline(run_dir)
    check_timeline(run_dir, ["rank:0", "rank:1"])


def test_lost_rank_then_regrow(tmp_path):
    _discovery(tmp_path, "localhost:2\n127.0.0.1:1\n")
    # horovodrun's output goes to a file: a pipe nobody reads would block its forwarding once full.
    log = tmp_path / "horovodrun.log"
    with open(log, "w") as out:
        p = subprocess.Popen(_horovodrun(tmp_path, 3, 2, 3, "--epochs", "2000"), stdout=out,
                             stderr=subprocess.STDOUT, env=env(), cwd=REPO, start_new_session=True)
    world = lambda kind, n: [r for r in _records(tmp_path, kind) if r.get("world_size") == n]
    try:
        _wait_for(lambda: world("step", 3), 120, "training at 3 ranks", p, log)
        victims = _ranks_on("127.0.0.1", tmp_path / "run")
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        # Training goes on with the 2 ranks on localhost and stays good.
        _wait_for(lambda: [e for e in world("eval", 2) if e["accuracy"] >= 0.9], 120,
                  "an evaluation at 2 ranks", p, log)
        shrunk_at = world("step", 2)[0]["global_step"]
        # A third slot appears in discovery: the job grows back to 3 ranks.
        (tmp_path / "hosts").write_text("localhost:3\n")
        _wait_for(lambda: [s for s in world("step", 3) if s["global_step"] > shrunk_at], 180,
                  "training at 3 ranks again", p, log)
        _wait_for(lambda: [e for e in world("eval", 3) if e["global_step"] > shrunk_at], 120,
                  "an evaluation after growing", p, log)
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=20)
        deadline = time.monotonic() + 15       # horovodrun ends its workers (each in a group of its own)
        while time.monotonic() < deadline and _all_ranks(tmp_path):
            time.sleep(0.5)
        leftovers = _all_ranks(tmp_path)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
    assert not leftovers, leftovers
    out = log.read_text(errors="replace")
    assert "elastic: the world is now 2 rank(s)" in out and "elastic: the world is now 3 rank(s)" in out, out[-3000:]
    after = [e for e in world("eval", 3) if e["global_step"] > shrunk_at]
    assert after[-1]["accuracy"] >= 0.9
