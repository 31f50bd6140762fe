"""--resume continues exactly the job that wrote the checkpoint, or is refused (exit 2, one line)
before a byte of the run directory changes: checked on real runs, file by file."""
import os
import shutil
import sys

import pytest

from common.inputs.data import load_arrays
from common.inputs.records import write
from common.spec.config import make_config
from tests.conftest import REPO, run, snapshot
from tests.test_records import example, record_start, replace_record

pytestmark = pytest.mark.process
HVD = [sys.executable, os.path.join(REPO, "horovod_train", "main.py")]
LAUNCH = [sys.executable, "-m", "ps_train.launch"]
MPIRUN = ["mpirun", "-np", "2", "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo",
          "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL"]
SMALL = ["--train_steps", "12", "--probe_steps", "0", "--checkpoint_steps", "6"]
SHARDS = ["--dataset", "tfrecord", "--data_dir"]


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
    write(str(root / "shards"), load_arrays(make_config()), 10, shards=2)
    r = run([*HVD, *SMALL, *SHARDS, str(root / "shards"), "--train_dir", str(root / "hvd-shards")], timeout=180)
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


def flip_a_byte(path):
    """One byte of record 5's data changed in place: the file's size and its framing's CRCs kept."""
    with open(path, "r+b") as f:
        f.seek(record_start(path, 5) + 12 + 20)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))


def rewrite_a_label(path):
    """Record 5 rewritten with another label, as a tool would write it: valid framing and CRCs."""
    import tensorflow as tf
    record = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(path).skip(5))).numpy())
    label = record.features.feature["y"].int64_list.value[0]
    replace_record(path, 5, example(x=record.features.feature["x"].bytes_list.value[0], y=(label + 1) % 10))


@pytest.mark.parametrize("change, message", [
    (flip_a_byte, "error: --resume: {file}: record 5: its bytes no longer match their CRC"),
    (rewrite_a_label, "error: --resume: {file} changed since {dir} was trained on it"),
    (None, None),                        # the control: the same bytes, copied elsewhere, resume
], ids=["byte-in-place", "record-rewritten", "unchanged-copy"])
def test_resume_on_changed_shards_is_refused_naming_the_file(runs, change, message):
    """The run records each shard's content digest; --resume reads every record and refuses data whose
    bytes differ from those it trained on, naming the file, before a byte of the run changes."""
    root, *_ = runs
    run_dir, data = root / "hvd-shards", root / f"shards-{change.__name__ if change else 'copy'}"
    shutil.copytree(root / "shards", data)
    file = data / "train-00000-of-00002.tfrecord"
    argv = [*HVD, *SHARDS, str(data), "--resume", "--train_steps", "18", "--probe_steps", "0", "--train_dir",
            str(run_dir)]
    if change is None:
        r = run(argv, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
        return
    change(str(file))
    refused(argv, root, message.format(file=file, dir=run_dir))


# A checkpoint that lacks one of the graph's variables, written the way TensorFlow writes one: every
# tensor of the run's latest checkpoint but one, saved under the same prefix.
DROP_ONE = """
import sys
import tensorflow as tf
v1 = tf.compat.v1
ckpt_dir, drop = sys.argv[1], sys.argv[2]
path = tf.train.latest_checkpoint(ckpt_dir)
reader = tf.train.load_checkpoint(path)
names = sorted(reader.get_variable_to_shape_map())
assert drop in names, names
with tf.Graph().as_default():
    kept = [v1.Variable(reader.get_tensor(n), name=n) for n in names if n != drop]
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        v1.train.Saver(kept, save_relative_paths=True).save(sess, path, write_meta_graph=False)
"""


def test_resume_from_a_checkpoint_without_one_of_the_graphs_variables_is_refused(runs, tmp_path):
    """Same model, mode and PS count, another graph (a checkpoint of another ps_train version, or
    edited by hand): one line naming the missing tensor, not the Saver's page of stack trace, and
    the run directory as it was."""
    import shutil
    _, _, ps = runs
    damaged = tmp_path / "ps1"
    shutil.copytree(ps, damaged)
    r = run([sys.executable, "-c", DROP_ONE, str(damaged / "checkpoints"), "dense/bias"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    refused([*LAUNCH, "--num_workers", "1", "--resume", "--train_steps", "24", "--train_dir", str(damaged)], tmp_path,
            f"error: --resume: {damaged}/checkpoints/model.ckpt-12 holds no dense/bias, which this job's graph "
            f"restores")
