"""Shared test helpers: run real processes with a bound on time and no leftovers."""
import json
import os
import stat
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Hypothesis (tests/test_fuzz.py): the unit tier's profile is derandomized, so a run of CI sees the
# same examples as the last; ``make fuzz`` (HVDPS_FUZZ=1) draws thousands with a new seed. No example
# database: nothing is written into the checkout.
from hypothesis import HealthCheck, settings  # noqa: E402

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large,
            HealthCheck.filter_too_much]
settings.register_profile("unit", max_examples=50, derandomize=True, deadline=None, database=None,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("fuzz", max_examples=int(os.environ.get("HVDPS_FUZZ_EXAMPLES", "1000")), deadline=None,
                          database=None, suppress_health_check=_SLOW_OK, print_blob=True)
settings.load_profile("fuzz" if os.environ.get("HVDPS_FUZZ") == "1" else "unit")
BIN = os.path.dirname(sys.executable)


def registry_names():
    """Every name ``--backends``, ``hvdps train`` and ``hvdps launch`` take, as an error line lists them:
    the tests' expectations come from the registry, so a method added as a package is expected everywhere."""
    from hvdps.methods import METHODS
    return ", ".join(sorted(METHODS))


VALID_BACKENDS = registry_names()


def env(**extra):
    """The project's child environment (common.base.procs), with Open MPI kept on loopback."""
    from common.base.procs import child_env
    return child_env(OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                     OMPI_MCA_oob_tcp_if_include="lo", **extra)


def run(argv, timeout=300, **kw):
    """Run a command in its own process group; on timeout kill the whole group and fail."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=kw.pop("env", env()), cwd=kw.pop("cwd", REPO), **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(argv)}\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)   # anything the command left behind
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def process_state(pid):
    """The state letter /proc/<pid>/stat gives (R, S, T, Z, ...), None for a process that is gone."""
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return text[text.rindex(")") + 2]


def living(pids):
    """Those of ``pids`` that still run or are stopped (not gone, not a zombie waiting for its reaper)."""
    return [pid for pid in pids if process_state(pid) not in (None, "Z", "X")]


def stopped(pids):
    return [pid for pid in pids if process_state(pid) in ("T", "t")]


def descendants(root):
    """PIDs of every process below ``root`` (launchers put workers in groups of their own)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def rank_pid(root, rank, script):
    """PID of the process running ``script`` whose launcher-given rank is ``rank`` (below root)."""
    for pid in descendants(root):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if script.encode() not in cmd:
            continue
        for var in (b"HOROVOD_RANK=", b"OMPI_COMM_WORLD_RANK="):
            if any(e == var + str(rank).encode() for e in environ):
                return pid
        for e in environ:                              # a task told its index by TF_CONFIG
            if e.startswith(b"TF_CONFIG=") and json.loads(e[len(b"TF_CONFIG="):])["task"]["index"] == rank:
                return pid
    return None


# Plain SGD, no lr scaling or warm-up: the flags under which sync data parallelism is exactly big-batch SGD.
SYNC_EQUIV = ["--optimizer", "sgd", "--scale_lr", "false", "--lr_warmup_epochs", "0", "--learning_rate", "0.1",
              "--train_steps", "15", "--eval_every_epoch", "false", "--log_every", "5"]


def read_records(path):
    """A metrics file's complete records as plain dicts, each held to its schema (the product reads
    them typed, common.trainer.metrics.read_metrics): for tests that assert on what the file holds,
    field by field as written."""
    from common.trainer.metrics import read_metrics
    return [r.model_dump(exclude_unset=True) for r in read_metrics(path)]


def row_and_records(run_dir):
    """A run's typed row (hvdps.measure.rows.load_run) and its records as written, as plain dicts
    (``read_records``), for tests that assert on what the file holds."""
    from hvdps.measure.rows import load_run
    recs = read_records(os.path.join(run_dir, "metrics.jsonl"))
    curves = {"header": next((r for r in recs if r["type"] == "header"), {}),
              "summary": next((r for r in reversed(recs) if r["type"] == "summary"), {}),
              "evals": [r for r in recs if r["type"] == "eval"], "steps": [r for r in recs if r["type"] == "step"]}
    return load_run(run_dir), curves


def assert_big_batch_equal(two_dir, one_dir, **config):
    """weights.npz of np=2 x b equals np=1 x 2b (relative 1e-5), and training moved them from the
    start of the model ``config`` builds (the MLP unless told)."""
    import numpy as np
    from common.spec.config import make_config
    from common.model.models import build_model
    from common.trainer.run_dir import load_weights_npz
    two = load_weights_npz(os.path.join(two_dir, "weights.npz"))
    one = load_weights_npz(os.path.join(one_dir, "weights.npz"))
    init = build_model(make_config(seed=42, **config)).get_weights()
    assert len(two) == len(one) == len(init)
    assert max(np.max(np.abs(a - b)) for a, b in zip(one, init)) > 1e-3   # training moved the weights
    # A weight whose gradient is zero in exact arithmetic (attention's key bias: the softmax ignores a
    # shift common to every key) holds rounding noise alone: each weight is held to 1e-5 of its own
    # norm, but never of less than a millionth of the whole model's.
    floor = 1e-6 * float(np.sqrt(sum(np.sum(np.square(b, dtype=np.float64)) for b in one)))
    for a, b in zip(two, one):
        assert np.linalg.norm(a - b) <= 1e-5 * max(np.linalg.norm(b), floor, 1e-12), np.linalg.norm(a - b)


def py(*args, **kw):
    return run([sys.executable, *args], **kw)


# Tests that read one shared job (a fixture launched once per session or module) run on one pytest-xdist
# worker, so the job is launched once, not once per worker.
SHARED_JOBS = {"jobs": "jobs", "runs": "resume-runs", "one_epoch": "one-epoch"}
# The root tier runs one test after another on one worker, except the README's and the docs' walk-throughs,
# each a group of its own that runs beside it on the other: each emulated cluster is namespaces of its own (named by its pid, on a bridge
# of its own), each SLURM of them daemons in those namespaces with their own state folder and socket.
ROOT_GROUPS = {"test_readme": "readme", "test_docs": "docs"}
# The groups are the suite's longest units of work (the walk-throughs and the root tier several minutes each,
# the shared jobs 4), so they are handed out first and the single tests fill in around them: a group
# handed out last would run on alone while the other worker idles.
FIRST = ("readme", "docs", "root", "jobs", "resume-runs")


def _group(item):
    """The pytest-xdist group ``item`` belongs to, or None."""
    if item.get_closest_marker("root"):
        return ROOT_GROUPS.get(item.module.__name__.rsplit(".", 1)[-1], "root")
    return next((SHARED_JOBS[f] for f in getattr(item, "fixturenames", ()) if f in SHARED_JOBS), None)


# tryfirst: pytest-xdist reads the xdist_group marks in its own pytest_collection_modifyitems (it
# appends "@group" to each node id there); marks added after it are not seen, and every group falls apart.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Tiers: a test that spawns processes is marked ``process`` (or ``root`` where it needs root:
    namespaces, mounts); every other test is ``unit``, so ``pytest -m unit`` is the in-process tier.

    Under pytest-xdist (``make test`` runs two at a time, ``--dist loadgroup``), the root tier runs on one
    worker, one test after another, and the README's and the docs' walk-throughs (which bring up clusters of their own)
    on the other; the groups come first in the order the tests are handed out (FIRST)."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("process", "root")):
            item.add_marker(pytest.mark.unit)
        group = _group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    rank = {g: i for i, g in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(_group(item), len(FIRST)))     # stable: each group keeps its order


CRASH_MARKS = ("Fatal Python error", "Segmentation fault", "Aborted")


def crash_stacks(root, limit=6000):
    """The tails of the logs under ``root`` that hold a native crash's stacks (every entry point
    enables faulthandler, common/base/errors.py: cli): a failed test says where a rare crash was,
    which the launcher's one line ("chief:0 killed by SIGSEGV") cannot."""
    found = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith((".log", ".txt", ".err")):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            at = min((text.find(m) for m in CRASH_MARKS if m in text), default=-1)
            if at >= 0:
                found.append(f"--- {path}\n{text[max(0, at - 1500):at + limit]}")
    return "\n".join(found)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the stacks of any process that crashed in native code beneath
    its tmp_path (the run folders' logs)."""
    outcome = yield
    report = outcome.get_result()
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and tmp is not None:
        stacks = crash_stacks(str(tmp))
        if stacks:
            report.sections.append(("native crash in the run's logs", stacks))


@pytest.fixture(scope="session")
def jobs(tmp_path_factory):
    """Each backend's run of the one small job (tests/jobs.py), launched once and shared."""
    from tests.jobs import Jobs
    return Jobs(str(tmp_path_factory.mktemp("jobs")))


@pytest.fixture
def digits_cfg():
    from common.spec.config import make_config
    return make_config(dataset="digits", model="mlp")


def kill_rank_mid_run(argv, out, script, rank=1, sig=signal.SIGKILL):
    """Start a job, kill -9 its rank ``rank`` (or send it ``sig``: SIGSTOP) once a checkpoint exists,
    and return (seconds the job took to end after that, its exit code, its output, the killed pid).
    The whole process group is killed afterwards; the checkpoints in ``out`` must still be readable
    (checked here)."""
    import time
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env())
    try:
        victim, deadline = None, time.monotonic() + 120
        while victim is None and time.monotonic() < deadline:   # wait until training is under way
            time.sleep(1)
            if (out / "checkpoints" / "checkpoint").exists():
                victim = rank_pid(p.pid, rank, script)
        assert victim, "training never started"
        os.kill(victim, sig)
        t0 = time.monotonic()
        p.wait(timeout=90)
        took = time.monotonic() - t0
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        output = p.communicate()[0]
    import tensorflow as tf
    latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
    assert latest, "no checkpoint survived"
    assert tf.train.load_checkpoint(latest).get_variable_to_shape_map()   # readable, not half-written
    return took, p.returncode, output, victim


def snapshot(root):
    """Every path below ``root`` (links not followed) with the bytes of each regular file: what a
    refused command must leave exactly as it was, creating nothing outside its own run folder."""
    out = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            if os.path.relpath(path, root).split(os.sep)[0] == "run":
                continue
            st = os.lstat(path)
            out[path] = open(path, "rb").read() if stat.S_ISREG(st.st_mode) else stat.S_IFMT(st.st_mode)
    return out


def check_timeline(run_dir, tasks, idle=()):
    """The run's timeline.json read as the Chrome trace event format defines it (an object with
    ``traceEvents``; complete events "X" with ts and dur in microseconds; thread names as "M"
    metadata): a track for each of ``tasks``, and each logged step's parts laid end to end and
    adding up to that step as its rank timed it (ranks/<task>.json). ``idle``: tasks that may have
    logged no step (an async PS worker that came late)."""
    doc = json.load(open(os.path.join(run_dir, "timeline.json")))
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"].split(" ")[0] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == sorted(tasks), names
    t0 = doc["otherData"]["t0_unix_s"]
    for tid, task in names.items():
        spans = json.load(open(os.path.join(run_dir, "ranks", task.replace(":", "-") + ".json")))["spans"]
        assert spans or task in idle, task
        for step, start, end, *_ in spans:
            parts = sorted((e for e in events if e["ph"] == "X" and e["tid"] == tid and e["args"]["step"] == step),
                           key=lambda e: e["ts"])
            assert [e["name"] for e in parts] == ["input", "compute", "exchange + waiting"]
            assert all(e["dur"] >= 0 for e in parts)
            for a, b in zip(parts, parts[1:]):
                assert a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=0.002)    # end to end
            assert parts[0]["ts"] == pytest.approx((start - t0) * 1e6, abs=1)
            assert sum(e["dur"] for e in parts) == pytest.approx((end - start) * 1e6, abs=1)
