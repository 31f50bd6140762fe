"""A comparison killed by SIGKILL takes what it started with it (hvdps/measure/reaper.py): its jobs'
processes, whatever group or session they made, none left stopped; its CPU groups; its slowed links."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import BIN, REPO, env, living as _living, process_state as _state
from hvdps.measure import cgroups, reaper

V1 = "/sys/fs/cgroup/cpu"
SLEEP = "import os, sys, time\nif sys.argv[1] == 'setsid':\n    os.setsid()\ntime.sleep(120)"


def _carrying(prefix):
    """Pids whose environment holds a job token starting with ``prefix``: a comparison's processes."""
    want = f"{reaper.TOKEN}={prefix}".encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                entries = open(f"/proc/{name}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(want) for e in entries) and _state(int(name)) not in (None, "Z", "X"):
                out.append(int(name))
    return out


@pytest.mark.unit
def test_what_is_still_open_when_the_pipe_closes_is_undone(monkeypatch):
    """A job's process in its group, one that left it for a session of its own, and one stopped are
    all killed; a job that ended, and a link set back, are left alone; a link still slow is set back."""
    token, other = "t-open", "t-ended"
    # the one that escapes makes its own session (it must not lead one already: setsid would fail), and
    # the reaper is served once it has, whatever the machine's load
    start = lambda how, t: subprocess.Popen([sys.executable, "-c", SLEEP, how], env={**os.environ, reaper.TOKEN: t},
                                            start_new_session=how == "stay")
    leader, escaped, stopped, kept = start("stay", token), start("setsid", token), start("stay", token), start("stay", other)
    deadline = time.monotonic() + 30
    while os.getsid(escaped.pid) != escaped.pid and escaped.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert os.getsid(escaped.pid) == escaped.pid, "the escaping process never made its own session"
    os.kill(stopped.pid, signal.SIGSTOP)
    restored = []
    monkeypatch.setattr("hvdps.measure.cluster.shape_link", lambda *args: restored.append(list(args)))
    try:
        lines = [json.dumps(m) for m in (
            {"job": token}, {"job": token, "group": leader.pid}, {"job": other, "group": kept.pid}, {"job_ended": other},
            {"link": "h2", "normal": ["hvdps-h2", "sw", "h2", "100000000bit", 5, "change"]},
            {"link": "h3", "normal": ["hvdps-h3", "sw", "h3", "100000000bit", 5, "change"]}, {"link_restored": "h3"})]
        reaper.serve(lines + ["not json"])
        for p in (leader, escaped, stopped):
            p.wait(timeout=10)
        assert [p.returncode for p in (leader, escaped, stopped)] == [-signal.SIGKILL] * 3
        assert kept.poll() is None                                  # a job that ended is not the reaper's
        assert restored == [["hvdps-h2", "sw", "h2", "100000000bit", 5, "change"]]
    finally:
        for p in (leader, escaped, stopped, kept):
            p.kill()
            p.wait()


# (what each case asks of hvdps compare, what shows the job is in the state the kill must end): a healthy, a
# slow and a stalled run under each launcher family (mpirun, horovodrun, TensorFlow's task launchers; the
# PS launcher's slow run has a backup worker). A slow or stalled worker's run follows its healthy twin,
# which is kept short (the slowed run lasts far longer). A slow worker's group needs root.
ROOT = pytest.mark.root
KILLED = [
    pytest.param(["--backends", "mpi"], "training", id="healthy, mpirun"),
    pytest.param(["--backends", "mpi", "--straggler", "1:8", "--train_steps", "400"], "group", marks=ROOT,
                 id="slow worker, mpirun"),
    pytest.param(["--backends", "mpi", "--stall", "1:2000:1500", "--train_steps", "400"], "stopped",
                 id="stalled worker, mpirun"),
    pytest.param(["--backends", "horovod"], "training", id="healthy, horovodrun"),
    pytest.param(["--backends", "horovod", "--straggler", "1:8", "--train_steps", "400"], "group", marks=ROOT,
                 id="slow worker, horovodrun"),
    pytest.param(["--backends", "horovod", "--stall", "1:2000:1500", "--train_steps", "400"], "stopped",
                 id="stalled worker, horovodrun"),
    pytest.param(["--backends", "mwms"], "training", id="healthy, MWMS launcher"),
    pytest.param(["--backends", "ps:backup1", "--straggler", "1:8", "--train_steps", "200"], "group", marks=ROOT,
                 id="slow worker and a backup, PS launcher"),
    pytest.param(["--backends", "mwms", "--stall", "1:2000:1500", "--train_steps", "200"], "stopped",
                 id="stalled worker, MWMS launcher"),
]
GONE_WITHIN_S = 10         # the bound: no process of the job left, none stopped, no group


@pytest.mark.process
@pytest.mark.parametrize("flags, state", KILLED)
def test_a_comparison_killed_by_sigkill_takes_its_job_and_groups_with_it(tmp_path, flags, state):
    """SIGKILL to hvdps compare alone (not its group) while its job trains: within 10 s no process it
    started is left, running or stopped, and no CPU group of its own."""
    out = str(tmp_path / "cmp")
    steps = [] if "--train_steps" in flags else ["--train_steps", "100000"]
    argv = [os.path.join(BIN, "hvdps"), "compare", "--workers", "2", *flags, *steps, "--no_progress", "--out", out]
    p = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    prefix = f"{p.pid}-"
    try:
        deadline, ready = time.monotonic() + 240, False
        while time.monotonic() < deadline and p.poll() is None and not ready:
            job = _carrying(prefix)
            if state == "group":
                ready = any(n.startswith(f"{cgroups.GROUP_PREFIX}{p.pid}-") and
                            open(os.path.join(V1, n, "cgroup.procs")).read().split() for n in os.listdir(V1))
            elif state == "stopped":
                ready = any(_state(pid) in ("T", "t") for pid in job)
            else:
                ready = any(os.path.exists(os.path.join(out, "runs", d, "metrics.jsonl"))
                            for d in (os.listdir(os.path.join(out, "runs")) if os.path.isdir(os.path.join(out, "runs"))
                                      else []))
            time.sleep(0.05)
        assert ready and p.poll() is None, f"the job never reached '{state}'"
        job = _carrying(prefix)
        assert len(job) >= 2, job
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        groups = lambda: [n for n in (os.listdir(V1) if os.path.isdir(V1) else [])
                          if n.startswith(f"{cgroups.GROUP_PREFIX}{p.pid}-")]
        deadline = time.monotonic() + GONE_WITHIN_S    # the supervisor kills the job, then removes its group
        while time.monotonic() < deadline and (_carrying(prefix) or _living(job) or groups()):
            time.sleep(0.1)
        assert not _carrying(prefix) and not _living(job), "the job outlived the comparison"
        assert groups() == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in _carrying(prefix):
            os.kill(pid, signal.SIGKILL)
