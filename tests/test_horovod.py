"""The Horovod trainer, launched the ways users launch it (real ranks, real launchers)."""
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from common.trainer.run_dir import load_weights_npz
from tests.conftest import (BIN, REPO, SYNC_EQUIV, assert_big_batch_equal, kill_rank_mid_run, read_records, run,
                             row_and_records)

pytestmark = pytest.mark.process

MAIN = os.path.join(REPO, "horovod_train", "main.py")
FAST = ["--epochs", "4", "--batch_size", "32", "--log_every", "5"]


def horovodrun(np_, *args, controller=None, timeout=240):
    ctrl = [f"--{controller}"] if controller else []
    return run([os.path.join(BIN, "horovodrun"), "-np", str(np_), "-H", f"localhost:{np_}", *ctrl,
                sys.executable, MAIN, *args], timeout=timeout)


def mpirun(np_, *args, timeout=240):
    return run(["mpirun", "--allow-run-as-root", "-np", str(np_), "-bind-to", "none", "-map-by", "slot",
                "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
                "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
                "--mca", "oob_tcp_if_include", "lo", sys.executable, MAIN, *args], timeout=timeout)


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def accurate(out, np_):
    """What a Horovod run that trained 4 epochs at batch 32 must show."""
    row, curves = row_and_records(out)
    assert row.status == "ok" and row.backend == "horovod" and row.workers == np_
    assert row.global_batch == 32 * np_
    assert row.final_test_accuracy >= 0.90, row
    assert curves["summary"]["max_weight_divergence"] == 0.0     # all ranks hold the same weights
    assert row.samples_per_sec_median > 0
    assert os.path.exists(os.path.join(out, "weights.npz"))
    assert os.listdir(os.path.join(out, "tensorboard"))
    assert os.path.exists(os.path.join(out, "checkpoints", "checkpoint"))
    assert len(curves["evals"]) == 4                               # one eval per epoch
    return row, curves


def accuracy_run(tmp_path, launch, np_, *extra, **kw):
    out = str(tmp_path / "run")
    ok(launch(np_, *FAST, "--train_dir", out, *extra, **kw))
    return accurate(out, np_)


@pytest.mark.parametrize("backend, np_", [("horovod", 2), ("one process", 1)])
def test_shared_job_reaches_accuracy(jobs, backend, np_):
    """horovodrun's Gloo controller with the custom loop, and one process, on the shared job
    (tests/jobs.py: 4 epochs at batch 32, a model with BatchNorm statistics)."""
    r, out = jobs.launched(backend)
    row, curves = accurate(out, np_)
    assert curves["header"]["loop"] == "custom"
    assert "samples/sec:" in r.stdout


def test_two_ranks_under_plain_mpirun_reach_accuracy_with_fit(tmp_path):
    """The user's own mpirun line with Keras' fit. horovodrun's controllers: Gloo on the shared job
    above, MPI (its default, as Horovod is built with it) in the big-batch test below."""
    row, curves = accuracy_run(tmp_path, mpirun, 2, "--loop", "fit")
    assert curves["header"]["loop"] == "fit"


def test_two_ranks_equal_one_process_with_double_batch(tmp_path):
    """Synchronous all-reduce is exactly big-batch SGD: np=2 x b == np=1 x 2b, whether the
    gradients go out one tensor at a time or as one explicit group (one reference run for both)."""
    ok(run([sys.executable, MAIN, *SYNC_EQUIV, "--batch_size", "32", "--train_dir", str(tmp_path / "one")]))
    for name, grouping in (("tensors", []), ("group", ["--num_groups", "1"])):
        ok(horovodrun(2, *SYNC_EQUIV, *grouping, "--batch_size", "16", "--train_dir", str(tmp_path / name)))
        assert_big_batch_equal(tmp_path / name, tmp_path / "one")


@pytest.mark.parametrize("args, message", [
    (["--model", "vgg"], "error: unknown model 'vgg' (valid: mlp, cnn, rec, transformer, resnet50, resnet101, inception_v3"),
    (["--batch_size", "-4"], "error: --batch_size must be positive"),
    (["--num_groups", "-1"], "error: --num_groups must be >= 0, got -1"),
    (["--dataset", "mnist", "--data_dir", "/nonexistent"], "error: --data_dir /nonexistent: no such directory"),
])
def test_bad_input_under_horovodrun(tmp_path, args, message):
    t0 = time.monotonic()
    r = horovodrun(2, *args, "--train_dir", str(tmp_path / "bad"), controller="gloo", timeout=90)
    assert time.monotonic() - t0 < 60
    combined = r.stdout + r.stderr
    assert combined.count(message) == 1, combined[-3000:]      # printed once, by rank 0
    # Neither a rank nor horovodrun prints a traceback: horovodrun exits with the failed rank's own
    # code (patches/horovod-0.28.1-runner.patch), 2 for a usage error.
    assert r.returncode == 2 and "Traceback" not in combined, combined[-3000:]


def test_unreadable_checkpoint_dir(tmp_path):
    out = tmp_path / "run"
    r = run([sys.executable, MAIN, "--resume", "--train_dir", str(out)], timeout=60)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --resume: no readable checkpoint")


def test_existing_run_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("precious\n")
    r = run([sys.executable, MAIN, "--train_dir", str(out)], timeout=60)
    assert r.returncode == 2 and "already holds a run" in r.stderr
    assert (out / "metrics.jsonl").read_text() == "precious\n"


RESUME = ["--batch_size", "32", "--log_every", "5", "--optimizer", "momentum", "--eval_every_epoch", "false"]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """One process, one epoch (44 steps) with its checkpoint: each test below resumes a copy of it."""
    out = str(tmp_path_factory.mktemp("one_epoch") / "run")
    ok(run([sys.executable, MAIN, *RESUME, "--epochs", "1", "--train_dir", out]))
    return out


def copy_of(run_dir, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    return out


def test_resume_continues_from_checkpoint(tmp_path, one_epoch):
    out = str(copy_of(one_epoch, tmp_path))
    ok(run([sys.executable, MAIN, *RESUME, "--epochs", "2", "--train_dir", out, "--resume"]))
    row, curves = row_and_records(out)
    headers = [r for r in read_records(out + "/metrics.jsonl")
               if r["type"] == "header"]
    assert [h["start_step"] for h in headers] == [0, 44]
    assert curves["steps"][-1]["global_step"] == 88


@pytest.mark.parametrize("loop", ["custom", "fit"])
def test_resume_is_exact(tmp_path, loop):
    """Stopped after epoch 2 and resumed to 4 == 4 epochs straight: bit for bit.

    Momentum slots, the optimizer's iteration count (the lr warm-up position), the
    data order and the global step all have to survive the checkpoint. With 2 ranks
    this also hangs (caught by the timeout) if only rank 0 has the slots it restores.
    One process is the same loop and checkpoint without the broadcast (resumed in the test above).
    """
    launch = lambda *a: horovodrun(2, *a, controller="gloo", timeout=240)
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    ok(launch(*RESUME, "--loop", loop, "--epochs", "4", "--train_dir", straight))
    ok(launch(*RESUME, "--loop", loop, "--epochs", "2", "--train_dir", split))
    ok(launch(*RESUME, "--loop", loop, "--epochs", "4", "--train_dir", split, "--resume"))
    a = load_weights_npz(os.path.join(straight, "weights.npz"))
    b = load_weights_npz(os.path.join(split, "weights.npz"))
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(a, b)) == 0.0
    assert row_and_records(split)[1]["summary"]["steps"] == row_and_records(straight)[1]["summary"]["steps"]


def test_resume_past_the_end_is_a_usage_error(tmp_path, one_epoch):
    out = str(copy_of(one_epoch, tmp_path))
    before = open(os.path.join(out, "metrics.jsonl")).read()
    r = run([sys.executable, MAIN, *RESUME, "--train_steps", "20", "--train_dir", out, "--resume"], timeout=120)
    assert r.returncode == 2 and "is already at step 44 of 20" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert open(os.path.join(out, "metrics.jsonl")).read() == before     # nothing appended


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_resume_from_damaged_checkpoint(tmp_path, one_epoch, damage):
    out = copy_of(one_epoch, tmp_path)
    data = sorted((out / "checkpoints").glob("*.data-*"))[-1]
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    else:
        data.unlink()
    r = run([sys.executable, MAIN, *RESUME, "--epochs", "2", "--train_dir", str(out), "--resume"], timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: --resume: cannot restore"), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_killed_rank_fails_job_promptly(tmp_path, controller):
    """kill -9 on one rank: the job must end non-zero within 60 s, checkpoints intact, and the
    survivor names the lost rank in one line (allreduce/roster.py)."""
    out = tmp_path / "run"
    argv = [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", f"--{controller}",
            sys.executable, MAIN, "--epochs", "400", "--batch_size", "8", "--train_dir", str(out)]
    took, code, output, victim = kill_rank_mid_run(argv, out, "horovod_train/main.py")
    assert took < 60 and code != 0
    named = [line for line in output.splitlines() if "error: rank 0: " in line]
    assert len(named) == 1 and f"lost rank 1 (pid {victim} on {socket.gethostname()})" in named[0], output[-3000:]


@contextlib.contextmanager
def small_disk(tmp_path, size):
    """A tmpfs of ``size`` at tmp_path/disk, unmounted afterwards (also on failure)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs to mount a small tmpfs (root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.root
def test_full_disk_without_checkpoints_is_one_line(tmp_path):
    """ENOSPC met by the events, metrics or final weights (no checkpoint to fail first): one line naming
    what could not be written, exit 1, no traceback (TensorBoard's writer raises from its own thread)."""
    with small_disk(tmp_path, "64k") as disk:
        r = run([sys.executable, MAIN, "--epochs", "30", "--batch_size", "32", "--log_every", "1",
                 "--checkpoint_every_epoch", "false", "--hidden_units", "300", "--train_dir", str(disk / "run")],
                timeout=240)
        assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
        errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith("error: cannot write") and \
            errors[0].endswith("No space left on device"), r.stderr[-2000:]
        assert "Traceback" not in r.stderr


@pytest.mark.root
def test_full_disk_is_one_line_and_keeps_earlier_checkpoints(tmp_path):
    """ENOSPC in the middle of a run: one error line, exit 1, the checkpoints already there readable."""
    with small_disk(tmp_path, "400k") as disk:
        out = disk / "run"
        r = run([sys.executable, MAIN, "--epochs", "200", "--batch_size", "32", "--checkpoint_steps", "10",
                 "--hidden_units", "300", "--train_dir", str(out)], timeout=240)
        assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
        errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert errors == [f"error: cannot write a checkpoint to {out / 'checkpoints'}: No space left on device"], \
            r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        import tensorflow as tf
        latest = tf.train.latest_checkpoint(str(out / "checkpoints"))
        assert latest and tf.train.load_checkpoint(latest).get_variable_to_shape_map()
        assert read_records(str(out / "metrics.jsonl"))[0]["type"] == "header"
