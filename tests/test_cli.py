"""Every entry point: bad input is one 'error:' line and exit 2, never a traceback."""
import os
import sys

import pytest

from tests.conftest import BIN, REPO, py, run

HVD = os.path.join(REPO, "horovod_train", "main.py")
PS = os.path.join(REPO, "ps_train", "main.py")
PS_FLAGS = ["--job_name=worker", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"]


@pytest.mark.parametrize("script, args, message", [
    (HVD, ["--model", "alexnet"], "error: unknown model 'alexnet' (valid: mlp, cnn, resnet50)"),
    (HVD, ["--dataset", "cifar"], "error: unknown dataset 'cifar' (valid: digits, mnist, synthetic)"),
    (HVD, ["--batch_size", "-1"], "error: --batch_size must be positive, got -1"),
    (HVD, ["--batch_size", "x"], "error: argument --batch_size: invalid int value: 'x'"),
    (HVD, ["--dataset", "mnist"], "error: --dataset mnist needs --data_dir"),
    (HVD, ["--dataset", "mnist", "--data_dir", "/nope"], "error: --data_dir /nope: no such directory"),
    (HVD, ["--bogus"], "error: unrecognized arguments: --bogus"),
    (HVD, ["--loop", "weird"], "error: argument --loop: invalid choice"),
    (HVD, ["--batch_size", "5000"], "error: batch 5000 x 1 workers exceeds the 1438 training examples"),
    (PS, PS_FLAGS + ["--model", "alexnet"], "error: unknown model 'alexnet'"),
    (PS, PS_FLAGS + ["--optimizer", "lamb"], "error: unknown optimizer 'lamb' (valid: sgd, momentum, adam)"),
    (HVD, ["--threads_per_rank", "-1"], "error: --threads_per_rank must be >= 0, got -1"),
    (HVD, ["--cycle_time_ms", "-2"], "error: --cycle_time_ms must be >= 0"),
    (PS, PS_FLAGS + ["--startup_timeout", "-1"], "error: --startup_timeout must be positive, got -1.0"),
    (PS, PS_FLAGS + ["--sync", "--replicas_to_aggregate", "-1"], "error: --replicas_to_aggregate must be >= 0"),
    (PS, ["--job_name=ps", "--ps_hosts=a:1", "--worker_hosts=b:2", "--sync", "--async", "--sync"], None),
])
def test_bad_input_exit_2(tmp_path, script, args, message):
    r = run([sys.executable, script, *args, "--train_dir", str(tmp_path / "r")], timeout=90)
    if message is None:   # argparse accepts repeated mode flags; just make sure nothing hung
        return
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr


def test_empty_mnist_dir(tmp_path):
    (tmp_path / "d").mkdir()
    r = run([sys.executable, HVD, "--dataset", "mnist", "--data_dir", str(tmp_path / "d"),
             "--train_dir", str(tmp_path / "r")], timeout=90)
    assert r.returncode == 2 and "neither mnist.npz nor train-images-idx3-ubyte" in r.stderr


def test_help_works():
    for script in (HVD, PS):
        r = run([sys.executable, script, "--help"], timeout=60)
        assert r.returncode == 0 and "--batch_size" in r.stdout and "--train_dir" in r.stdout


@pytest.mark.parametrize("text, code, out", [
    ("a slots=2\nb slots=2\n", 0, "horovodrun -np 4 -H a:2,b:2"),
    ("a slots=two\n", 2, "error: {f}:1: slots must be a positive integer, got 'two'"),
])
def test_hosts_command(tmp_path, text, code, out):
    f = tmp_path / "inv"
    f.write_text(text)
    r = run([os.path.join(BIN, "hvdps-hosts"), str(f)], timeout=30)
    assert r.returncode == code, r.stderr
    assert out.format(f=f) in (r.stdout + r.stderr)
