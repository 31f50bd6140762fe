"""--resume continues exactly the job that wrote the checkpoint, or is refused (exit 2, one line)
before a byte of the run directory changes: checked on real runs, file by file."""
import os
import sys

import pytest

from tests.conftest import REPO, run, snapshot

pytestmark = pytest.mark.process
HVD = [sys.executable, os.path.join(REPO, "horovod_train", "main.py")]
LAUNCH = [sys.executable, "-m", "ps_train.launch"]
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo",
          "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL"]
SMALL = ["--train_steps", "12", "--probe_steps", "0", "--checkpoint_steps", "6"]


def refused(argv, root, message):
    before = snapshot(root)
    r = run(argv, timeout=120)
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and errors[0].startswith(message), (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stdout + r.stderr
    assert snapshot(root) == before, "a refused resume changed the run directory"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    hvd, ps = root / "hvd1", root / "ps1"
    r = run([*HVD, *SMALL, "--train_dir", str(hvd)], timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run([*LAUNCH, "--num_workers", "1", *SMALL, "--train_dir", str(ps)], timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return root, hvd, ps


@pytest.mark.parametrize("argv, run_name, message", [
    (MPIRUN + HVD + ["--epochs", "3"], "hvd1", "error: --resume: {dir} was trained with workers 1, this job has 2"),
    (LAUNCH + ["--num_workers", "1"], "hvd1", "error: --resume: {dir} was trained with backend horovod, this job "
                                              "has ps"),
    (LAUNCH + ["--num_workers", "2"], "ps1", "error: --resume: {dir} was trained with workers 1, this job has 2"),
    (LAUNCH + ["--num_workers", "1", "--sync"], "ps1", "error: --resume: {dir} was trained with mode async, this job "
                                                       "has sync"),
    (HVD, "ps1", "error: --resume: {dir} was trained with backend ps, this job has horovod"),
    (HVD + ["--dataset", "synthetic"], "hvd1", "error: --resume: dataset was 'digits'"),
], ids=["hvd-np2", "hvd-under-ps", "ps-more-workers", "ps-sync", "ps-under-hvd", "other-data"])
def test_resume_into_another_job_is_refused_and_changes_nothing(runs, argv, run_name, message):
    root, *_ = runs
    run_dir = root / run_name
    refused([*argv, "--resume", "--train_steps", "24", "--train_dir", str(run_dir)], root,
            message.format(dir=run_dir))


def test_resume_into_the_same_job_continues(runs):
    """The control: the same job resumes from its checkpoint and trains on."""
    root, hvd, _ = runs
    r = run([*HVD, "--resume", "--train_steps", "18", "--probe_steps", "0", "--checkpoint_steps", "6",
             "--train_dir", str(hvd)], timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
