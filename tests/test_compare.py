"""The comparison report: computed values, file agreement, and a real end-to-end run."""
import csv
import glob
import json
import os
import subprocess

import pytest

from common.spec.plan import make_plan
from hvdps.methods import parse_variants
from hvdps.measure.runs import Outcome, PlannedRun, collect, runs_from_dirs
from hvdps.render.report import write_report
from common.spec.config import make_config
from common.base.errors import UsageError
from common.trainer.metrics import MetricsWriter, throughput_stats
from tests.conftest import BIN, REPO, VALID_BACKENDS, check_timeline, run


def fake_run(d, backend, mode, workers, rates, accs, tasks=None):
    w = MetricsWriter(str(d))
    cfg = make_config()
    w.header(cfg, backend, mode, workers, tasks or {}, make_plan(cfg, 1000, workers, workers))
    for i, a in enumerate(accs):
        w.eval(i + 1, 10 * (i + 1), 1.0 - a, a, target=0.9)
    w.summary("ok", 40, 1280, throughput_stats(rates), 1.0 - accs[-1], accs[-1], 1000)
    w.close()
    return PlannedRun(backend, mode, workers, str(d), outcome=Outcome(0))


@pytest.mark.parametrize("launched, order", [
    # launched mwms, horovod, ps: listed so, not by method (the live report's order)
    ({"mwms": 3.0, "horovod": 4.0, "ps": 5.0}, ["mwms", "horovod", "ps"]),
    ({"ps": 1.0, "mwms": 2.0, "horovod": 9.0}, ["ps", "mwms", "horovod"]),
    # a run no comparison launched (no compare_run.json) comes after, by method
    ({"ps": 1.0, "mwms": None, "horovod": None}, ["ps", "horovod", "mwms"]),
])
def test_from_lists_the_runs_in_the_order_they_were_launched(tmp_path, launched, order):
    """A report rebuilt with --from lists its runs as the live comparison did."""
    for backend, at in launched.items():
        fake_run(tmp_path / "runs" / f"{backend}-w2", backend, {"ps": "async"}.get(backend, "sync"), 2,
                 [1000] * 3, [0.95], tasks={"ps": 1} if backend == "ps" else None)
        if at is not None:
            (tmp_path / "runs" / f"{backend}-w2" / "compare_run.json").write_text(
                json.dumps({"seconds": 1.0, "launched_at": 1.7e9 + at, "exit_code": 0}))
    assert [r.backend for r in runs_from_dirs([str(tmp_path / "runs")])] == order


@pytest.mark.process
def test_report_values(tmp_path):
    runs = [fake_run(tmp_path / "a", "horovod", "sync", 1, [1000, 1000, 1000], [0.5, 0.95]),
            fake_run(tmp_path / "b", "horovod", "sync", 2, [1800, 1800, 1800], [0.6, 0.96]),
            fake_run(tmp_path / "c", "ps", "async", 1, [900, 900], [0.4, 0.92], tasks={"ps": 1}),
            fake_run(tmp_path / "d", "ps", "async", 2, [900, 900], [0.4, 0.92], tasks={"ps": 1}),
            PlannedRun("ps", "sync", 2, str(tmp_path / "missing"), outcome=Outcome(1, error="error: boom"))]
    rows = collect(runs)
    by = {(r.backend, r.mode, r.workers): r for r in rows}
    assert by[("horovod", "sync", 2)].scaling_efficiency == pytest.approx(0.9)
    assert by[("ps", "async", 2)].scaling_efficiency == pytest.approx(0.5)
    assert by[("horovod", "sync", 1)].scaling_efficiency == pytest.approx(1.0)
    assert by[("ps", "sync", 2)].status == "failed" and by[("ps", "sync", 2)].scaling_efficiency is None
    assert by[("horovod", "sync", 2)].time_to_target is not None
    out = tmp_path / "report"
    write_report(rows, str(out), {"mlp": {"x": 1}}, {"host": "h"})
    data = json.load(open(out / "results.json"))["rows"]
    with open(out / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(data) == len(csv_rows) == 5
    for j, c in zip(data, csv_rows):
        assert str(j["samples_per_sec_median"] if j["samples_per_sec_median"] is not None else "") == \
            c["samples_per_sec_median"]
        assert c["backend"] == j["backend"] and c["status"] == j["status"]
    report = (out / "report.md").read_text()
    assert report.startswith("# hvdps comparison\n\n## Verdict\n\n- **mlp**, 2 worker(s), one run each:")   # the answer first
    assert report.index("## Verdict") < report.index("## Runs") < report.index("| workload |")
    assert "| mlp | horovod | sync | 2 | - | 1,800 | 1,800 ± 0 | 90% |" in report   # one format for every figure
    # both did, at their second evaluation: too few to time the crossing, so throughput ranks (rows.unresolved)
    assert "within a few evaluations, too far apart to time the crossing" in report
    assert "ranked by throughput instead, Horovod first" in report
    assert "Throughput: Horovod 1,800 samples/s: 2.00x PS async (900)." in report
    assert "Verdicts rank the runs at each workload's largest worker count by time to the target" in report
    assert "error: boom" in report
    for png in ("throughput.png", "accuracy_vs_time.png"):
        assert (out / png).stat().st_size > 5000
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("text, expected", [
    ("horovod,ps", [("horovod", "sync"), ("ps", "async"), ("ps", "sync")]),
    ("ps:sync", [("ps", "sync")]),
    ("horovod,mpi", [("horovod", "sync"), ("mpi", "sync")]),
])
def test_variants(text, expected):
    assert [v.pair for v in parse_variants(text)] == expected


@pytest.mark.parametrize("text, message", [
    ("nccl", f"unknown backend 'nccl' (valid: {VALID_BACKENDS})"),
    ("ps:lazy", "backend ps has no mode 'lazy' (valid: async, sync)"),
])
def test_bad_variants(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_variants(text)


def test_dry_run_prints_real_commands(tmp_path):
    r = run([os.path.join(BIN, "hvdps"), "compare", "--dry-run", "--workers", "1,2", "--batch_size", "16",
             "--step_timeout", "30", "--out", str(tmp_path / "c")], timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.strip().splitlines()
    assert out[:2] == ["# every line below runs in the repository with this environment:", f"cd {REPO}"]
    assert out[2].startswith("export ") and "PYTHONPATH=" in out[2]
    lines = out[3:]
    assert len(lines) == 6
    assert sum("mpirun -np 2 -bind-to none -map-by slot --mca btl self,vader --mca oob_tcp_if_include lo"
               in l for l in lines) == 1
    assert sum("ps_train.launch --num_ps 1 --num_workers 2 --sync" in l for l in lines) == 1
    assert all("--batch_size 16" in l and "--step_timeout 30.0" in l for l in lines)   # every method's bound


@pytest.mark.process
def test_dry_run_pasted_into_a_shell_trains(tmp_path):
    """What --dry-run prints is the whole recipe: run from another folder with a bare
    environment, the lines train the same runs the comparison would."""
    out = tmp_path / "c"
    r = run([os.path.join(BIN, "hvdps"), "compare", "--dry-run", "--workers", "2", "--backends", "horovod,ps:sync",
             "--train_steps", "6", "--batch_size", "16", "--log_every", "2", "--probe_steps", "0",
             "--no-progress", "--out", str(out)], timeout=60)
    assert r.returncode == 0, r.stderr
    bare = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR")}
    bare["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    p = subprocess.run(["bash", "-euc", r.stdout], cwd=tmp_path, env=bare, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    for name in ("horovod-sync-w2", "ps-sync-w2-ps1"):
        lines = (out / "runs" / name / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[-1])["type"] == "summary", name


@pytest.mark.process
def test_end_to_end_both_backends(tmp_path):
    out = tmp_path / "cmp"
    r = run([os.path.join(BIN, "hvdps"), "compare", "--workers", "1,2", "--backends", "horovod,mpi,ps:async",
             "--train_steps", "30", "--batch_size", "16", "--log_every", "5", "--no-progress",
             "--out", str(out)], timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.load(open(out / "results.json"))["rows"]
    assert {(x["backend"], x["mode"], x["workers"]) for x in rows} == \
        {("horovod", "sync", 1), ("horovod", "sync", 2), ("mpi", "sync", 1), ("mpi", "sync", 2),
         ("ps", "async", 1), ("ps", "async", 2)}
    for x in rows:
        assert x["status"] == "ok"
        assert x["samples_per_sec_median"] > 0 and 0 <= x["final_test_accuracy"] <= 1
        assert x["grad_bytes_per_step"] == rows[0]["grad_bytes_per_step"]   # same model everywhere
        assert 0 < x["warmup_s"] < x["startup_s"] and 0 < x["warmup_share"] < 1      # measured, per run
        # launch -> trainer start -> trainer end -> exit: start-up, trainer, teardown add up to the run
        seconds = json.load(open(os.path.join(x["run_dir"], "compare_run.json")))["seconds"]
        assert x["teardown_s"] >= 0
        assert x["startup_s"] - x["warmup_s"] + x["wall_time"] + x["teardown_s"] == pytest.approx(seconds, abs=0.5)
        # one update averages every rank's batch (all-reduce) or is one worker's batch (async PS)
        assert x["global_batch"] == 16 * (x["workers"] if x["backend"] in ("horovod", "mpi") else 1)
        assert x["compute_s"] > 0 and x["compute_s"] + x["overhead_s"] == pytest.approx(x["step_s"])
        # every rank or task timed its own steps: a timeline with a track each, and each one's distribution
        # (async PS: each worker at its own pace; one that came late may have logged no step of its own,
        # the chief too: it writes the first checkpoint before its first step, so in a run this short a
        # peer may take nearly every update; some worker always trains)
        tasks = [f"{'worker' if x['backend'] == 'ps' else 'rank'}:{i}" for i in range(x["workers"])]
        steps = _rank_steps(x["run_dir"])
        idle = [t for t in tasks if not steps[t]["spans"]] if x["mode"] == "async" else []
        assert len(idle) < len(tasks), idle
        check_timeline(x["run_dir"], tasks, idle)
        # the distribution is over the steps after the warm-up; an async worker's steps are global steps,
        # and one that came late may have taken only warm-up steps (its spans logged, no distribution)
        timed = [t for t in tasks if steps[t]["step_s"] is not None]
        assert (timed == tasks) if x["mode"] != "async" else timed, (tasks, timed)
        assert all(0 < q["p50"] <= q["p95"] <= q["max"] for q in (steps[t]["step_s"] for t in timed))
        # and its process's CPU a step, every thread counted: some, and at most both cores for the whole step
        assert all(0 < steps[t]["cpu_s_per_step"] <= 2 * steps[t]["step_s"]["max"] + 0.01 for t in timed)
    report = (out / "report.md").read_text()
    assert "Where each step's time goes" in report and "![breakdown.png](breakdown.png)" in report
    assert report.count(" worker(s): ") >= 6 and "2 worker(s), one run each" in report   # a sentence per run, and the verdict
    # --from rebuilds the same table without training
    r2 = run([os.path.join(BIN, "hvdps"), "compare", "--from", str(out / "runs"), "--out", str(tmp_path / "again")],
             timeout=120)
    assert r2.returncode == 0, r2.stderr
    again = json.load(open(tmp_path / "again" / "results.json"))["rows"]
    key = lambda x: (x["backend"], x["mode"], x["workers"])
    assert sorted(map(key, again)) == sorted(map(key, rows))
    assert {key(x): x["samples_per_sec_median"] for x in again} == {key(x): x["samples_per_sec_median"] for x in rows}


def _rank_steps(run_dir):
    """{task: what it wrote of its own steps} (ranks/<task>.json)."""
    return {d["task"]: d for d in (json.load(open(p)) for p in glob.glob(os.path.join(run_dir, "ranks", "*.json")))}


def _processes_mentioning(text):
    """PIDs whose command line mentions ``text`` (a run directory): what a stopped job left."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.process
@pytest.mark.parametrize("backend, signame, timeout, workers", [("horovod", "SIGTERM", 30, "1,2"),
                                                                ("ps:sync", "SIGTERM", 240, "2"),
                                                                ("mpi", "SIGINT", 240, "2")])
def test_signal_mid_run_stops_every_job_and_reports_what_finished(tmp_path, backend, signame, timeout, workers):
    """The signal lands while the 2-worker run trains: compare stops that job's whole process tree
    (horovodrun's, the PS launcher's, mpirun's), writes the report with what ran, the stopped run
    marked interrupted, and exits 128 + the signal with one error line. Under Horovod a 1-worker run
    ends first, stopped by --run_timeout, and the report holds it; the 2-worker job must log a step
    within that same --run_timeout (30 s: two Horovod ranks beside another test on two cores)."""
    import signal as sig
    import time
    out = tmp_path / "cmp"
    p = subprocess.Popen([os.path.join(BIN, "hvdps"), "compare", "--workers", workers, "--backends", backend,
                          "--train_steps", "100000", "--batch_size", "16", "--log_every", "5", "--probe_steps", "0",
                          "--no-progress", "--run_timeout", str(timeout), "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env=__import__("tests.conftest", fromlist=["env"]).env(), start_new_session=True)
    try:
        runs = out / "runs"
        deadline = time.monotonic() + 240
        second = None
        while time.monotonic() < deadline and second is None:
            time.sleep(0.5)
            logs = sorted(runs.glob("*-w2*/metrics.jsonl")) if runs.exists() else []
            second = next((l for l in logs if '"step"' in l.read_text()), None)
        assert second is not None, "the 2-worker run never logged a step"
        p.send_signal(getattr(sig, signame))
        stdout, stderr = p.communicate(timeout=60)
    finally:
        try:
            os.killpg(p.pid, sig.SIGKILL)
        except ProcessLookupError:
            pass
    signum = getattr(sig, signame)
    assert p.returncode == 128 + signum, stderr[-2000:]
    errors = [l for l in stderr.splitlines() if l.startswith("error:")]
    finished = 1 if workers == "1,2" else 0
    assert errors == [f"error: {signame}: stopped {second.parent.name}; the report holds the {finished} run(s) that "
                      f"finished"], stderr[-2000:]
    assert "Traceback" not in stderr
    report = (out / "report.md").read_text()
    assert "interrupted" in report
    if finished:         # the 1-worker run, with what it was doing when it was stopped
        assert f"failed: error: stopped by --run_timeout after {timeout} s; its last line: " in report
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_mentioning(str(out)) == []


@pytest.mark.parametrize("configs, keys", [
    ([("a", "mlp", {"batch_size": 32, "train_dir": "a"}), ("b", "mlp", {"batch_size": 32, "train_dir": "b"})], ["mlp"]),
    ([("a", "mlp", {"batch_size": 32}), ("b", "mlp", {"batch_size": 64})], ["mlp (a)", "mlp (b)"]),
    ([("a", "mlp", {"batch_size": 32}), ("b", "cnn", {"batch_size": 64})], ["mlp", "cnn"]),
])
def test_rebuilt_report_shows_every_distinct_config(configs, keys):
    """--from runs of one model with different settings: one config per run, never one for all."""
    from hvdps.measure.runs import runs_configs
    from hvdps.measure.rows import Curves, RunRow
    from common.formats.schemas import Header, RunConfig
    rows = [RunRow(run_dir=d, model=m, curves=Curves(header=Header(type="header", backend="ps", mode="sync",
                                                                    world_size=2, config=RunConfig(**c))))
            for d, m, c in configs]
    assert sorted(runs_configs(rows)) == sorted(keys)


MPI_SLOTS = """--------------------------------------------------------------------------
There are not enough slots available in the system to satisfy the 4
slots that were requested by the application:

  /usr/bin/python3

Either request fewer slots for your application, or make more slots
--------------------------------------------------------------------------
"""


@pytest.mark.parametrize("log, expected", [
    ("step 1\nerror: --batch_size 0 must be positive\nmpirun noticed ...\n", "error: --batch_size 0 must be positive"),
    (MPI_SLOTS, "There are not enough slots available in the system to satisfy the 4 slots that were requested "
                "by the application:"),
    ("step 1\nSegmentation fault\n", "Segmentation fault"),
    ("Traceback (most recent call last):\n  File \"main.py\"\nImportError: Keras cannot be imported.\n"
     + "-" * 74 + "\nmpirun detected that one or more processes exited with non-zero status, thus causing\n"
     "the job to be terminated. The first process to do so was:\n\n  Exit code: 1\n" + "-" * 74 + "\n",
     "ImportError: Keras cannot be imported."),
    ("[horovod] step 5/100\nerror: lost a peer\n" + "-" * 74 + "\nmpirun noticed that process rank 1 with PID 0 on node "
     "n2 exited on signal 9 (Killed).\n" + "-" * 74 + "\n", "rank 1 killed by SIGKILL on n2"),
    ("[chief:0] error: chief: reading the training data: f: record 100\nerror: chief: reading the training data: "
     "f: record 100\n[worker:1] E0000 00:00:1.2 3 rpc_util.cc:9] UNAVAILABLE: {grpc_message:\"failed to connect to "
     "all addresses; last error: UNKNOWN: ipv4:127.0.0.1:5: Connection refused\", grpc_status:14}\n",
     "error: chief: reading the training data: f: record 100"),
    ("[1,1]<stderr>:error: rank 1: lost a peer\n[1,0]<stderr>:W0 x.cc:1] last error: UNKNOWN: reset\n",
     "error: rank 1: lost a peer"),
    ("1: error: rank 1: lost a peer\n0: E0 x.cc:1] last error: UNKNOWN: reset\n", "error: rank 1: lost a peer"),
    # a rank failed on its data and exited; mpirun's SIGTERM made the other name it: the data is the cause
    ("error: rank 0: reading the training data: f: record 100: a label outside 0..9\n" + "-" * 74 + "\nPrimary job "
     "terminated normally, but 1 process returned\n" + "-" * 74 + "\nerror: rank 1: stopped by SIGTERM from the "
     "launcher: lost rank 0 (pid 7 on n1)\n", "error: rank 0: reading the training data: f: record 100: a label "
                                               "outside 0..9"),
    ("[1,0]<stderr>:error: rank 0: stopped by SIGTERM from the launcher: lost rank 1 (pid 7 on n1)\n",
     "error: rank 0: stopped by SIGTERM from the launcher: lost rank 1 (pid 7 on n1)"),
    ("W0 x.cc:1] last error: UNKNOWN: reset\n", "error: UNKNOWN: reset"),
    ("[ps:0] E0 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit\n"
     "[launch] worker:0 still running after the chief finished: stopping it\n"
     "[launch] exit code 1 (chief:0 was killed by SIGSEGV)\n", "chief:0 killed by SIGSEGV"),
    ("[chief:0] error: chief: reading the training data: f: record 2\n[launch] exit code 1 (chief:0 was killed by "
     "SIGSEGV)\nerror: chief: reading the training data: f: record 2\n", "error: chief: reading the training data: "
                                                                         "f: record 2"),
    ("", None),
])
def test_a_failed_run_is_named_by_its_cause_not_a_frame(tmp_path, log, expected):
    from hvdps.measure.jobs import _last_error
    (tmp_path / "run.log").write_text(log)
    assert _last_error(str(tmp_path / "run.log")) == expected


@pytest.mark.process
def test_local_mpi_runs_more_ranks_than_cores(tmp_path):
    """Open MPI refuses more ranks than physical cores unless told: a local comparison at more workers
    than cores still runs them (and marks the run oversubscribed in the report)."""
    workers = (os.cpu_count() or 1) + 1
    r = run([os.path.join(BIN, "hvdps"), "compare", "--workers", str(workers), "--backends", "horovod",
             "--train_steps", "3", "--eval_every_epoch", "false", "--checkpoint_every_epoch", "false",
             "--no-progress", "--out", str(tmp_path / "out")], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.load(open(tmp_path / "out" / "results.json"))["rows"]
    assert [(row["workers"], row["status"], row["oversubscribed"]) for row in rows] == [(workers, "ok", True)]


@pytest.mark.process
def test_a_rank_killed_under_mpirun_is_named_by_rank_and_signal(tmp_path):
    """kill -9 of one Horovod rank mid-run: the comparison names the rank and the signal (Open MPI's own
    notice), not mpirun's banner or a line of TensorFlow's start-up chatter."""
    import signal as sig
    import time
    from tests.conftest import env, rank_pid
    out = tmp_path / "cmp"
    p = subprocess.Popen([os.path.join(BIN, "hvdps"), "compare", "--workers", "2", "--backends", "horovod",
                          "--train_steps", "100000", "--batch_size", "16", "--log_every", "5", "--probe_steps", "0",
                          "--no-progress", "--run_timeout", "240", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env(),
                         start_new_session=True)
    try:
        victim, deadline = None, time.monotonic() + 180
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.5)
            logs = list((out / "runs").glob("*/metrics.jsonl")) if (out / "runs").exists() else []
            if any('"step"' in log.read_text() for log in logs):
                victim = rank_pid(p.pid, 1, "horovod_train/main.py")
        assert victim, "training never started"
        os.kill(victim, sig.SIGKILL)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        try:
            os.killpg(p.pid, sig.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode == 1, stderr[-2000:]
    assert "horovod-sync-w2: FAILED (rank 1 killed by SIGKILL" in stdout + stderr, (stdout + stderr)[-2000:]
    assert "failed: rank 1 killed by SIGKILL" in (out / "report.md").read_text()
