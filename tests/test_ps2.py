"""TensorFlow 2's ParameterServerStrategy (--ps_api v2): every role a real process on loopback."""
import os
import signal
import sys
import time

import pytest

from tests.conftest import read_records
from common.trainer.run_dir import load_weights_npz
from tests.conftest import REPO, check_timeline, py, run, row_and_records
from hvdps.measure.timeline import rank_files, write_timeline
from tests.ps_helpers import FAST, _cluster, _finish, _per_role, _wait_for_steps, assert_same_weights

pytestmark = pytest.mark.process

V2 = ["--ps_api", "v2"]


def launch(num_ps, num_workers, *args, timeout=300):
    return py("-m", "ps_train.launch", "--num_ps", str(num_ps), "--num_workers", str(num_workers), *V2,
              *args, timeout=timeout)


def ok(result):
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-5000:]}\n{result.stderr[-3000:]}"
    return result


# (1 PS, 2 workers: the shared job below; 1 PS, 1 worker: test_one_worker_is_the_single_process_run,
# weight for weight.)
def test_two_ps_reach_accuracy_and_every_role_exits(tmp_path):
    out = str(tmp_path / "run")
    reaches_accuracy(ok(launch(2, 2, *FAST, "--train_dir", out)), out, 2, 2)


def test_shared_job_reaches_accuracy_and_every_role_exits(jobs):
    """1 PS, 2 workers: the shared job (tests/jobs.py, 4 epochs at batch 32)."""
    reaches_accuracy(*jobs.launched("ps2"), 1, 2)


def reaches_accuracy(r, out, num_ps, num_workers):
    row, curves = row_and_records(out)
    header, summary = curves["header"], curves["summary"]
    assert (row.backend, row.mode, row.workers, row.tasks) == ("ps2", "async", num_workers, (("ps", num_ps),))
    assert row.final_test_accuracy >= 0.90, row
    assert header["ps_api"] == "v2" and header["global_batch_size"] == 32
    # the same sample budget as every other backend: 4 epochs of the 1438 training digits
    assert summary["steps"] == summary["updates_applied"] == 4 * ((1438 // num_workers) // 32) * num_workers
    # variables live on the PS tasks; with two, both hold some (round-robin and the partitioner)
    devices = {d for shards in header["placement"].values() for d in shards}
    assert {d.split("/replica")[0] + "/task:" + d.split("/task:")[1].split("/")[0] for d in devices} == \
        {f"/job:ps/task:{i}" for i in range(num_ps)}
    for role in [f"ps:{i}" for i in range(num_ps)] + [f"worker:{i}" for i in range(num_workers)]:
        assert f"[{role}] {role} done" in r.stdout, r.stdout[-4000:]   # released by the chief, exit 0
    assert "still running after the chief finished" not in r.stdout
    # each worker's logged steps, timed on the worker that ran them and written by the chief: a
    # track each in the timeline (a worker may have run no logged step: the coordinator picks)
    ranks = rank_files(out)
    assert ranks and set(ranks) <= {f"worker:{i}" for i in range(num_workers)}, ranks
    logged = sorted(span[0] for f in ranks.values() for span in f.spans)
    # every logged step once (--log_every 5 or 7, and the steps an evaluation or checkpoint logs)
    assert len(logged) == len(set(logged)) >= summary["steps"] // 7 - 1, logged
    assert write_timeline(out, row.compute_s)
    check_timeline(out, list(ranks))


def test_large_variables_are_split_over_the_ps_tasks(tmp_path):
    """The MLP's kernels on 28x28 input (784 x 100 and 100 x 10 floats) are partitioned, each listed
    under its own name (not the ShardedVariable class name both would share); the 400-byte and
    40-byte biases stay whole."""
    out = str(tmp_path / "run")
    ok(launch(2, 1, "--dataset", "synthetic", "--image_shape", "28,28,1", "--synthetic_samples", "256",
              "--train_steps", "4", "--batch_size", "32", "--train_dir", out))
    placement = row_and_records(out)[1]["header"]["placement"]
    split = sorted(name for name, shards in placement.items() if len(shards) == 2)
    assert split == ["dense/kernel", "dense_1/kernel"], placement
    assert sorted(placement) == ["dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"], placement
    assert all(len({s.split("/device")[0] for s in placement[name]}) == 2 for name in split)
    weights = load_weights_npz(os.path.join(out, "weights.npz"))
    assert weights[0].shape == (784, 100)                      # saved whole again


def test_one_worker_is_the_single_process_run(tmp_path):
    """Worker 0 of 1 reads exactly the batches a single process reads, in order; plain SGD
    on the PS then gives the same weights (the sharding and the step are the same)."""
    equiv = ["--optimizer", "sgd", "--scale_lr", "false", "--lr_warmup_epochs", "0", "--learning_rate", "0.1",
             "--train_steps", "12", "--eval_every_epoch", "false", "--log_every", "4", "--batch_size", "32"]
    ok(launch(1, 1, *equiv, "--train_dir", str(tmp_path / "v2")))
    ok(run([sys.executable, os.path.join(REPO, "horovod_train", "main.py"), *equiv,
            "--train_dir", str(tmp_path / "one")]))
    assert_same_weights(tmp_path / "v2", tmp_path / "one")


def test_per_role_launch_every_process_exits_zero(tmp_path):
    """Each role a process of its own, given the cluster by flags. By TF_CONFIG: the TF2 PS JobSet's
    pods (tests/test_k8s_pods.py)."""
    procs = _per_role(tmp_path, _cluster(1, 2, chief=True), "--async", extra=V2)
    outs = _finish(procs, 240)
    codes = {n: p.returncode for n, p in procs.items()}
    assert codes == {"ps:0": 0, "worker:0": 0, "worker:1": 0, "chief:0": 0}, outs
    assert row_and_records(str(tmp_path / "run"))[0].final_test_accuracy >= 0.9


# The chief's sitecustomize: ``after_import(name, patch)`` runs ``patch(module)`` once the module
# ``name`` is imported, before anything else can take names from it.
AFTER_IMPORT = """
import importlib.abc, importlib.machinery, sys

def after_import(name, patch):
    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                patch(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Hook())
"""

# The coordinator's first worker failure is reported as not one, as TF does with some of the errors a
# dying worker leaves: the coordinator then raises it instead of retrying the step elsewhere.
UNCLASSIFIED = """
def first_one_unclassified(module):
    real, seen = module._is_worker_failure, []

    def classify(error):
        if real(error) and not seen:
            seen.append(error)
            print("test: one worker failure left unclassified", flush=True)
            return False
        return real(error)
    module._is_worker_failure = classify

after_import("tensorflow.python.distribute.coordinator.cluster_coordinator", first_one_unclassified)
"""

# Each training batch the chief's datasets give is 40 ms late (tf.data's own sleep transformation, run
# on the worker that reads), so a step the coordinator cancels is most likely waiting for its batch,
# as on a busy host.
SLOW_INPUT = """
def slow_batches(module):
    real = module.make_dataset

    def slow(*args, **kwargs):
        from tensorflow.python.data.experimental.ops import testing
        ds = real(*args, **kwargs)
        return ds if kwargs.get("split", "train") != "train" else ds.apply(testing.sleep(40000))
    module.make_dataset = slow

after_import("common.inputs.data", slow_batches)
"""


@pytest.mark.parametrize("classified", [True, False])
def test_killed_worker_steps_run_elsewhere(tmp_path, classified):
    """kill -9 of a worker mid-run: the coordinator retries its steps on the other one; or, when
    TF raises the lost worker's error instead, the chief carries on from what the PS applied.

    The input is slow (SLOW_INPUT), so the steps the coordinator cancels in the second case were
    waiting for a batch: tf.data then ends the surviving worker's iterator, and the chief has to
    read anew (at 40 ms a batch, 3 runs in 7 ended "End of sequence" when it did not)."""
    (tmp_path / "inject").mkdir()
    injected = AFTER_IMPORT + SLOW_INPUT + ("" if classified else UNCLASSIFIED)
    (tmp_path / "inject" / "sitecustomize.py").write_text(injected)
    role_env = {"chief:0": {"PYTHONPATH": f"{tmp_path / 'inject'}{os.pathsep}{REPO}"}}
    cluster = _cluster(1, 2, chief=True)
    procs = _per_role(tmp_path, cluster, "--async", extra=[*V2, "--epochs", "6", "--log_every", "20"],
                      role_env=role_env)
    try:
        _wait_for_steps(tmp_path / "run", 3)
        os.killpg(procs["worker:1"].pid, signal.SIGKILL)
        outs = _finish(procs, 240)
    finally:
        _finish(procs, 1)
    assert procs["chief:0"].returncode == 0, outs["chief:0"][-3000:]
    assert procs["ps:0"].returncode == 0 and procs["worker:0"].returncode == 0
    assert "chief: worker:1 (" in outs["chief:0"] and "finished without worker(s) worker:1" in outs["chief:0"]
    assert ("test: one worker failure left unclassified" in outs["chief:0"]) == (not classified)
    summary = row_and_records(str(tmp_path / "run"))[1]["summary"]
    assert summary["status"] == "ok" and summary["lost_workers"][0].startswith("worker:1")
    # Every scheduled step ran; the one the killed worker was running may have reached the PS before
    # it died and then run again elsewhere (TF: "function execution is not atomic"), at most one per
    # lost worker since a worker runs one closure at a time.
    assert summary["steps"] <= summary["updates_applied"] <= summary["steps"] + len(summary["lost_workers"])


def test_killed_ps_ends_the_job_with_one_line(tmp_path):
    procs = _per_role(tmp_path, _cluster(1, 2, chief=True), "--async",
                      extra=[*V2, "--epochs", "200", "--log_every", "20"])
    try:
        _wait_for_steps(tmp_path / "run", 3)
        os.killpg(procs["ps:0"].pid, signal.SIGKILL)
        t0 = time.monotonic()
        outs = _finish(procs, 60)
        took = time.monotonic() - t0
    finally:
        _finish(procs, 1)
    assert procs["chief:0"].returncode == 1, outs["chief:0"][-3000:]
    errors = [line for line in outs["chief:0"].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "parameter server ps:0 (127.0.0.1:" in errors[0] and "is gone" in errors[0], \
        outs["chief:0"][-3000:]
    assert "Traceback" not in outs["chief:0"]
    assert procs["worker:0"].returncode == 0 and "done (the chief failed with code 1)" in outs["worker:0"]
    assert took < 30


def test_launcher_resume_continues_from_the_checkpoint(tmp_path):
    out = str(tmp_path / "run")
    ok(launch(1, 2, *FAST, "--epochs", "2", "--train_dir", out))
    ok(launch(1, 2, *FAST, "--epochs", "4", "--resume", "--train_dir", out))
    records = read_records(os.path.join(out, "metrics.jsonl"))
    headers = [rec for rec in records if rec["type"] == "header"]
    first = 2 * ((1438 // 2) // 32) * 2          # updates in 2 epochs at 2 workers
    assert [h["start_step"] for h in headers] == [0, first]
    row, curves = row_and_records(out)
    assert curves["summary"]["steps"] == 2 * first and row.final_test_accuracy >= 0.9


@pytest.mark.parametrize("extra, message", [
    (["--sync"], "--sync needs --ps_api v1: TensorFlow 2's ParameterServerStrategy is asynchronous only"),
    (["--replicas_to_aggregate", "2"], "--replicas_to_aggregate needs --ps_api v1"),
    (["--backup_workers", "1"], "--backup_workers needs --ps_api v1"),
    (["--ps_api", "v3"], "invalid choice: 'v3'"),
])
def test_v1_only_flags_are_usage_errors(tmp_path, extra, message):
    r = launch(1, 2, *extra, "--train_dir", str(tmp_path / "run"), timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_per_role_without_a_chief_is_a_usage_error(tmp_path):
    cluster = _cluster(1, 1)
    r = run([sys.executable, os.path.join(REPO, "ps_train", "main.py"), *V2, "--job_name=worker", "--task_index=0",
             "--ps_hosts=" + cluster["ps"][0], "--worker_hosts=" + cluster["worker"][0]], timeout=60)
    assert r.returncode == 2 and "needs a chief task" in r.stderr, r.stderr


def test_lost_peer_hook_drops_tensorflow_errors_in_del_only(capsys):
    """The coordinator's executors fail in ``__del__`` after a PS dies; only those are silenced."""
    import gc
    import tensorflow as tf
    from ps_train.v2 import _quiet_lost_peer

    class Dies:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = _quiet_lost_peer(lambda u: seen.append(type(u.exc_value)))
    try:
        for exc in (tf.errors.UnavailableError(None, None, "Connection reset by peer"), ValueError("a bug")):
            obj = Dies(exc)
            del obj
            gc.collect()
    finally:
        sys.unraisablehook = old
    assert seen == [ValueError]
