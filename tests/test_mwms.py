"""TensorFlow's MultiWorkerMirroredStrategy trainer (mwms_train), launched per task as TFJob does."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from common.base.procs import free_ports
from common.trainer.run_dir import load_weights_npz
from tests.conftest import REPO, SYNC_EQUIV, assert_big_batch_equal, env, kill_rank_mid_run, py, run, row_and_records

pytestmark = pytest.mark.process

MAIN = os.path.join(REPO, "mwms_train", "main.py")
FAST = ["--epochs", "4", "--batch_size", "32", "--log_every", "5"]


def launch(workers, *args, timeout=240):
    return py("-m", "mwms_train.launch", "--num_workers", str(workers), *args, timeout=timeout)


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def test_two_workers_reach_accuracy_with_identical_weights(jobs):
    """The shared job (tests/jobs.py: 4 epochs at batch 32) under the local launcher."""
    out = jobs("mwms")
    row, curves = row_and_records(out)
    assert row.status == "ok" and row.backend == "mwms" and row.mode == "sync" and row.workers == 2
    assert row.global_batch == 64 and row.final_test_accuracy >= 0.90, row
    summary = curves["summary"]
    assert summary["max_weight_divergence"] == 0.0               # the all-reduce kept every copy equal
    assert summary["mwms_implementation"] == "ring"
    assert len(curves["evals"]) == 4 and os.path.exists(os.path.join(out, "checkpoints", "checkpoint"))
    split = summary["breakdown"]
    assert split["compute_s"] > 0 and split["bytes_per_step_per_worker"] == row.grad_bytes_per_step  # n=2: 1x M


def test_two_workers_equal_one_process_with_double_batch(tmp_path):
    """The strategy's sum of gradients the tape divided by n is an average: np=2 x b == np=1 x 2b."""
    ok(launch(2, *SYNC_EQUIV, "--batch_size", "16", "--train_dir", str(tmp_path / "two")))
    ok(run([sys.executable, MAIN, *SYNC_EQUIV, "--batch_size", "32", "--train_dir", str(tmp_path / "one")]))
    assert_big_batch_equal(tmp_path / "two", tmp_path / "one")


def test_resume_is_exact(tmp_path):
    """2 epochs, then resumed to 4 == 4 epochs straight, bit for bit (slots, step, data order):
    rank 0 restores and the state reaches worker 1 through the strategy's collective."""
    args = ["--batch_size", "32", "--log_every", "5", "--optimizer", "momentum", "--eval_every_epoch", "false"]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    ok(launch(2, *args, "--epochs", "4", "--train_dir", straight))
    ok(launch(2, *args, "--epochs", "2", "--train_dir", split))
    ok(launch(2, *args, "--epochs", "4", "--train_dir", split, "--resume"))
    a = load_weights_npz(os.path.join(straight, "weights.npz"))
    b = load_weights_npz(os.path.join(split, "weights.npz"))
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) == 0.0


def _tf_config(cluster, i):
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})


def _start_tasks(cluster, args, out):
    procs = []
    for i in range(len(cluster["worker"])):
        procs.append(subprocess.Popen([sys.executable, MAIN, *args, "--train_dir", out], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=REPO,
                                      env=env(TF_CONFIG=_tf_config(cluster, i))))
    return procs


def _end(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [p.communicate()[0] for p in procs]


def test_tasks_started_per_role_with_tf_config(tmp_path):
    """As a TFJob starts them: one process per worker, each told the cluster by TF_CONFIG; worker 0
    alone writes the run."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    out = str(tmp_path / "run")
    procs = _start_tasks(cluster, ["--epochs", "2", "--batch_size", "32"], out)
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        logs = _end(procs)
    assert codes == [0, 0], logs
    row, _ = row_and_records(out)
    assert row.workers == 2 and row.final_test_accuracy >= 0.85
    assert "samples/sec:" in logs[0] and "samples/sec:" not in logs[1]    # worker 0 reports, worker 1 does not


def test_killed_worker_ends_the_launched_job_promptly(tmp_path):
    """kill -9 on worker 1 mid-run: the launcher ends the job non-zero at once, naming the worker."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "mwms_train.launch", "--num_workers", "2", "--epochs", "400", "--batch_size", "8",
            "--train_dir", str(out)]
    took, code, _, _ = kill_rank_mid_run(argv, out, "mwms_train.main")
    assert took < 30 and code != 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_lost_peer_without_a_launcher_ends_the_survivor_in_bounded_time(tmp_path, sig):
    """What TensorFlow itself gives when nobody supervises the tasks (a TFJob's pods): the strategy
    does not recover a lost worker. A killed peer closes its sockets and the survivor's collective
    fails at once; a hung one (SIGSTOP) keeps them open, and the collective fails after
    --step_timeout. Either way the survivor says so in one error line instead of waiting for ever."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    out = tmp_path / "run"
    procs = _start_tasks(cluster, ["--epochs", "400", "--batch_size", "8", "--step_timeout", "10"], str(out))
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "checkpoint").exists() and time.monotonic() < deadline:
            assert procs[0].poll() is None and procs[1].poll() is None, "a task ended early"
            time.sleep(0.5)
        assert (out / "checkpoints" / "checkpoint").exists(), "training never started"
        os.kill(procs[1].pid, sig)
        t0 = time.monotonic()
        code = procs[0].wait(timeout=120)
        took = time.monotonic() - t0
    finally:
        logs = _end(procs)
    assert code == 1 and took < 60, (code, took, logs[0][-3000:])
    errors = [line for line in logs[0].splitlines() if line.startswith("error:")]
    # the step's collective or the logged loss's, whichever meets the loss first
    assert len(errors) == 1 and errors[0].startswith(("error: rank 0: training step",
                                                      "error: worker 0: a collective")), logs[0][-3000:]
    assert "Traceback" not in logs[0], logs[0][-3000:]


def test_a_peer_that_never_starts_ends_the_worker_at_its_startup_timeout(tmp_path):
    """Worker 1 of 2 is never started: worker 0's strategy would wait for it without limit, inside
    TensorFlow; --startup_timeout ends it with one line naming the missing peer."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    p = subprocess.Popen([sys.executable, MAIN, "--startup_timeout", "8", "--train_dir", str(tmp_path / "run")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         cwd=REPO, env=env(TF_CONFIG=_tf_config(cluster, 0)))
    t0 = time.monotonic()
    try:
        code = p.wait(timeout=90)
        took = time.monotonic() - t0
    finally:
        (log,) = _end([p])
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert code == 1 and took < 45, (code, took, log[-3000:])      # its own exit, not a signal after the line
    assert errors == [f"error: worker 0: the cluster did not come up within --startup_timeout 8 s: worker:1 "
                      f"({cluster['worker'][1]}) never joined"], log[-3000:]
    assert "Traceback" not in log


@pytest.mark.parametrize("argv, extra_env, message", [
    ([MAIN, "--implementation", "nccl"], {}, "error: --implementation nccl needs GPUs"),
    ([MAIN, "--worker_hosts", "127.0.0.1:5000,127.0.0.1:5001", "--task_index", "2"], {},
     "error: --task_index 2 out of range (0..1)"),
    ([MAIN], {"TF_CONFIG": '{"cluster":{"ps":["a:1"],"worker":["b:2"]},"task":{"type":"worker","index":0}}'},
     "error: TF_CONFIG: MultiWorkerMirroredStrategy takes worker tasks only, got ps, worker"),
    ([MAIN, "--step_timeout", "nan"], {}, "error: --step_timeout"),
    (["-m", "mwms_train.launch", "--num_workers", "0"], {}, "error: --num_workers must be in [1, 1024], got 0"),
    (["-m", "mwms_train.launch", "--task_index", "1"], {}, "error: --task_index is chosen by the launcher"),
])
def test_bad_input_is_one_line(tmp_path, argv, extra_env, message):
    r = run([sys.executable, *argv, "--train_dir", str(tmp_path / "bad")], env=env(**extra_env), timeout=120)
    combined = r.stdout + r.stderr
    assert r.returncode != 0 and combined.count(message) == 1 and "Traceback" not in combined, combined[-3000:]
    assert not os.path.exists(tmp_path / "bad" / "metrics.jsonl")
