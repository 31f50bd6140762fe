"""Every entry point: bad input is one 'error:' line and exit 2, never a traceback, a hang or a leftover."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from common.data import write_idx
from tests.conftest import BIN, REPO, env, run

HVD = [sys.executable, os.path.join(REPO, "horovod_train", "main.py")]
PS = [sys.executable, os.path.join(REPO, "ps_train", "main.py")]
MPI = [sys.executable, os.path.join(REPO, "mpi_train", "main.py")]
PS_FLAGS = ["--job_name=worker", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"]
LAUNCH = [sys.executable, "-m", "ps_train.launch"]
COMPARE = [os.path.join(BIN, "hvdps-compare")]
PROJECT = [os.path.join(BIN, "hvdps-project")]
HOSTS = [os.path.join(BIN, "hvdps-hosts")]
MPIRUN = ["mpirun", "-np", "2", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo",
          "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL", *HVD]
LIST_TYPE = json.dumps({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                        "task": {"type": ["worker"], "index": 0}})
BW = ["--bandwidth-gbps", "25", "--latency-us", "10", "--step-compute-ms", "100"]

# (entry point, arguments, extra environment, start of the one error line). {tmp}: the test's folder,
# holding the files made by `files` below.
CASES = [
    # ---- bare-MPI trainer (shares the Horovod trainer's flags and checks)
    (MPI, ["--probe_steps", "-1"], {}, "error: --probe_steps must be >= 0, got -1"),
    (MPI, ["--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (MPI, ["--loop", "fit"], {}, "error: unrecognized arguments: --loop fit"),
    (MPI, [], {"HOROVOD_RANK": "0"}, "error: the mpi backend needs mpirun"),   # under horovodrun's Gloo
    # ---- Horovod trainer
    (HVD, ["--model", "alexnet"], {}, "error: unknown model 'alexnet' (valid: mlp, cnn, rec, resnet50, resnet101, "
                                       "inception_v3, vgg16, mobilenet_v2, or module:function"),
    (HVD, ["--dataset", "cifar"], {}, "error: unknown dataset 'cifar' (valid: digits, mnist, synthetic, clicks, or "),
    (HVD, ["--batch_size", "-1"], {}, "error: --batch_size must be positive, got -1"),
    (HVD, ["--batch_size", "x"], {}, "error: argument --batch_size: invalid int value: 'x'"),
    (HVD, ["--dataset", "mnist"], {}, "error: --dataset mnist needs --data_dir"),
    (HVD, ["--dataset", "mnist", "--data_dir", "/nope"], {}, "error: --data_dir /nope: no such directory"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/mnist8"], {}, "error: {tmp}/mnist8: train images are 8x8"),
    (HVD, ["--dataset", "mnist", "--data_dir", "{tmp}/empty"], {}, "error: {tmp}/empty: neither mnist.npz nor"),
    (HVD, ["--bogus"], {}, "error: unrecognized arguments: --bogus"),
    (HVD, ["--loop", "weird"], {}, "error: argument --loop: invalid choice"),
    (HVD, ["--batch_size", "5000"], {}, "error: batch 5000 x 1 workers exceeds the 1438 training examples"),
    (HVD, ["--threads_per_worker", "-1"], {}, "error: --threads_per_worker must be >= 0, got -1"),
    (HVD, ["--cycle_time_ms", "-2"], {}, "error: --cycle_time_ms must be >= 0"),
    (HVD, ["--fusion_threshold_mb", "inf"], {}, "error: --fusion_threshold_mb must be a finite number, got inf"),
    (HVD, ["--learning_rate", "nan"], {}, "error: --learning_rate must be a finite number, got nan"),
    (HVD, ["--lr_warmup_epochs", "nan"], {}, "error: --lr_warmup_epochs must be a finite number, got nan"),
    (HVD, ["--momentum", "inf"], {}, "error: --momentum must be a finite number, got inf"),
    (HVD, ["--target_accuracy", "nan"], {}, "error: --target_accuracy must be a finite number, got nan"),
    (HVD, ["--epochs", "0"], {}, "error: nothing to train"),
    (HVD, ["--image_shape", "1,2", "--dataset", "synthetic"], {}, "error: --image_shape must be H,W,C"),
    (HVD, ["--model", "resnet50"], {}, "error: --model resnet50 needs 3-channel images of at least 32x32"),
    (HVD, ["--model", "inception_v3", "--dataset", "synthetic", "--image_shape", "64,64,3"], {},
     "error: --model inception_v3 needs --image_shape of at least 75,75,3"),
    (HVD, ["--train_dir", "/proc/hvdps-x"], {}, "error: --train_dir /proc/hvdps-x is not writable"),
    (HVD, ["--resume", "--train_dir", "{tmp}/fresh"], {}, "error: --resume: no readable checkpoint directory"),
    # ---- PS trainer, one role
    (PS, [*PS_FLAGS, "--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (PS, [*PS_FLAGS, "--optimizer", "lamb"], {}, "error: unknown optimizer 'lamb' (valid: sgd, momentum, adam)"),
    (PS, [*PS_FLAGS, "--startup_timeout", "-1"], {}, "error: --startup_timeout must be in (0, 604800] seconds"),
    (PS, [*PS_FLAGS, "--step_timeout", "1e17"], {}, "error: --step_timeout must be in (0, 604800] seconds (a week), "
                                                    "got 1e+17"),
    (PS, [*PS_FLAGS, "--replicas_to_aggregate", "2"], {}, "error: --replicas_to_aggregate applies to synchronous"),
    (LAUNCH, ["--replicas_to_aggregate", "2"], {}, "error: --replicas_to_aggregate applies to synchronous"),
    (HVD, ["--seed", "-1"], {}, "error: --seed must be in [0, 2**32), got -1"),
    (COMPARE, ["--seed", "4294967296"], {}, "error: --seed must be in [0, 2**32), got 4294967296"),
    (PS, [*PS_FLAGS, "--startup_timeout", "nan"], {}, "error: --startup_timeout must be a finite number, got nan"),
    (PS, [*PS_FLAGS, "--step_timeout", "inf"], {}, "error: --step_timeout must be a finite number, got inf"),
    (PS, [*PS_FLAGS, "--sync", "--replicas_to_aggregate", "-1"], {}, "error: --replicas_to_aggregate must be >= 0"),
    (PS, [*PS_FLAGS, "--bind", "999.1.1.1"], {}, "error: --bind 999.1.1.1: expected an IP address"),
    (PS, [*PS_FLAGS, "--bind", "10.255.255.254"], {}, "error: --bind 10.255.255.254: not an address of this machine"),
    (PS, ["--job_name=worker", "--task_index=5", "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2"], {},
     "error: --task_index 5 out of range for job 'worker' (0..0)"),
    (PS, [], {"TF_CONFIG": LIST_TYPE}, "error: TF_CONFIG: task type must be a string"),
    (PS, [], {"TF_CONFIG": "[1, 2]"}, "error: TF_CONFIG must have 'cluster' and 'task' keys"),
    (PS, ["--job_name=worker", "--cluster_spec", "{tmp}/binary"], {}, "error: {tmp}/binary: not a text file"),
    # ---- local PS launcher
    (LAUNCH, ["--num_workers", "0"], {}, "error: --num_ps and --num_workers must be at least 1"),
    (LAUNCH, ["--job_name", "ps"], {}, "error: --job_name is chosen by the launcher"),
    (LAUNCH, ["--timeout", "-5"], {}, "error: --timeout must be >= 0, got -5.0"),
    (LAUNCH, ["--timeout", "nan"], {}, "error: --timeout must be a finite number, got nan"),
    (LAUNCH, ["--learning_rate", "nan"], {}, "error: --learning_rate must be a finite number, got nan"),
    (LAUNCH, ["--step_timeout", "inf"], {}, "error: --step_timeout must be a finite number, got inf"),
    (LAUNCH, ["--threads_per_worker", "-1"], {}, "error: --threads_per_worker must be >= 0, got -1"),
    (LAUNCH, ["--num_ps", "many"], {}, "error: argument --num_ps: invalid int value: 'many'"),
    (LAUNCH, ["--rsh", "ssh"], {}, "error: --rsh, --ps_placement and --port apply only with --hosts"),
    (LAUNCH, [], {"TF_CONFIG": LIST_TYPE}, "error: TF_CONFIG is set: the launcher chooses the cluster"),
    # ---- comparison, projection, hosts
    (COMPARE, ["--backends", "mxnet"], {}, "error: unknown backend 'mxnet' (valid: horovod, mpi, ps, ps2)"),
    (COMPARE, ["--backends", "ps:lazy"], {}, "error: backend ps has no mode 'lazy' (valid: async, sync)"),
    (COMPARE, ["--workers", "0"], {}, "error: --workers expects positive numbers"),
    (COMPARE, ["--workers", "a,b"], {}, "error: --workers expects numbers like 1,2,4"),
    (COMPARE, ["--run_timeout", "-5"], {}, "error: --run_timeout must be positive, got -5.0"),
    (COMPARE, ["--num_ps", "0"], {}, "error: --num_ps expects positive numbers, got '0'"),
    (COMPARE, ["--num_ps", "1,x"], {}, "error: --num_ps expects numbers like 1,2,4, got '1,x'"),
    (COMPARE, ["--from", "{tmp}/junkrun"], {}, "error: --from: no runs (metrics.jsonl) found"),
    (COMPARE, ["--learning_rate", "inf"], {}, "error: --learning_rate must be a finite number, got inf"),
    (PROJECT, ["--bandwidth-gbps", "nan", "--latency-us", "10"], {}, "error: --bandwidth-gbps must be a finite"),
    (PROJECT, [*BW, "--model-name", "alexnet"], {}, "error: unknown --model-name 'alexnet'"),
    (PROJECT, [*BW, "--model-name", "vgg16", "--overlap", "0.5"], {}, "error: --overlap is gone: the overlap now"),
    (PROJECT, [*BW, "--model-name", "vgg16", "--cycle-time-ms", "-1"], {}, "error: --cycle-time-ms and"),
    (PROJECT, [*BW, "--from", "{tmp}/junkrun"], {}, "error: --from {tmp}/junkrun: no run has a per-step breakdown"),
    (PROJECT, ["--comm-json", "/nope"], {}, "error: --comm-json /nope: no such file"),
    (COMPARE, ["--project", "--model", "cnn"], {}, "error: unrecognized arguments: --model cnn"),
    (HOSTS, ["{tmp}/binary"], {}, "error: {tmp}/binary: not a text file"),
    (HOSTS, ["{tmp}/inventory", "--port", "65535"], {}, "error: --port 65535: host a needs ports up to 65536"),
    (HOSTS, ["{tmp}/badslots"], {}, "error: {tmp}/badslots:1: slots must be a positive integer, got 'two'"),
    (HOSTS, ["/nope"], {}, "error: /nope: cannot read hostfile"),
    (HOSTS, ["{tmp}/maxslots"], {}, "error: {tmp}/maxslots:1: slots=4 is more than max_slots=1"),
    (HOSTS, ["{tmp}/twoslots"], {}, "error: {tmp}/twoslots:1: slots given twice"),
    (HOSTS, ["{tmp}/hugeslots"], {}, "error: {tmp}/hugeslots:1: slots must be at most 4096, got 1000000000000"),
    (PROJECT, ["--bandwidth-gbps", "1e-320", "--latency-us", "10"], {},
     "error: --bandwidth-gbps must be in [1e-06, 1e+06], got 1e-320"),
    (PROJECT, [*BW, "--model-params", "1e305"], {}, "error: --model-params must be in [1, 1e+13], got 1e+305"),
    (PROJECT, [*BW, "--max-workers", "10000000000000000"], {}, "error: --gpus-per-server must be in [1, 1024] and "
                                                               "--max-workers in [1, 65536]"),
    # ---- under mpirun: one line for the whole job (rank 1 stays quiet), mpirun passes exit 2 on
    (MPIRUN, ["--model", "alexnet"], {}, "error: unknown model 'alexnet'"),
    (MPIRUN, ["--learning_rate", "nan"], {}, "error: --learning_rate must be a finite number, got nan"),
]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty").mkdir()
    mnist8 = tmp_path / "mnist8"
    mnist8.mkdir()
    rng = np.random.RandomState(0)
    for name, arr in (("train-images-idx3-ubyte", rng.randint(0, 255, (20, 8, 8))),
                      ("train-labels-idx1-ubyte", rng.randint(0, 10, 20)),
                      ("t10k-images-idx3-ubyte", rng.randint(0, 255, (5, 8, 8))),
                      ("t10k-labels-idx1-ubyte", rng.randint(0, 10, 5))):
        write_idx(str(mnist8 / name), arr)
    (tmp_path / "binary").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "inventory").write_text("a slots=4\n")
    (tmp_path / "badslots").write_text("a slots=two\n")
    (tmp_path / "maxslots").write_text("a slots=4 max_slots=1\n")
    (tmp_path / "twoslots").write_text("a slots=2 slots=8\n")
    (tmp_path / "hugeslots").write_text("a slots=1000000000000\n")
    junk = tmp_path / "junkrun"
    junk.mkdir()
    (junk / "metrics.jsonl").write_bytes(b"\x00\xff garbage\n[1, 2, 3]\n{\"no\": \"type\"}\n"
                                         b"{\"type\": \"header\"}\n")
    return tmp_path


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("entry, args, extra_env, message", CASES,
                         ids=[f"{i}-{os.path.basename(c[0][-1])}-{' '.join(c[1])[:40]}" for i, c in enumerate(CASES)])
@pytest.mark.process
def test_bad_input(files, entry, args, extra_env, message):
    fill = lambda text: text.replace("{tmp}", str(files))
    argv = [*entry, *[fill(a) for a in args]]
    if entry not in (COMPARE, PROJECT, HOSTS) and "--train_dir" not in args:
        argv += ["--train_dir", str(files / "run")]
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env=env(**extra_env), start_new_session=True)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"no answer within 30 s: {argv}")
    took = time.monotonic() - t0
    deadline = time.monotonic() + 5             # whatever it started must be gone with it
    while _group_alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = _group_alive(p.pid)
    if leftover:
        os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 2, (p.returncode, out[-2000:], err[-2000:])
    errors = [line for line in (out + err).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(fill(message)), err[-3000:]
    assert "Traceback" not in out + err
    assert took < 30 and not leftover


@pytest.mark.process
def test_help_works():
    for entry in (HVD, PS, LAUNCH, COMPARE, PROJECT, HOSTS):
        r = run([*entry, "--help"], timeout=60)
        assert r.returncode == 0 and "usage:" in r.stdout, (entry, r.stderr)
    for entry in (HVD, PS, LAUNCH, COMPARE):
        r = run([*entry, "--help"], timeout=60)
        assert "--batch_size" in r.stdout and "--train_dir" in r.stdout


@pytest.mark.parametrize("text, code, out", [
    ("a slots=2\nb slots=2\n", 0, "horovodrun -np 4 -H a:2,b:2"),
    ("a slots=two\n", 2, "error: {f}:1: slots must be a positive integer, got 'two'"),
])
def test_hosts_command(tmp_path, text, code, out):
    f = tmp_path / "inv"
    f.write_text(text)
    r = run([*HOSTS, str(f)], timeout=30)
    assert r.returncode == code, r.stderr
    assert out.format(f=f) in (r.stdout + r.stderr)
