"""One small job, launched the way each backend launches it, at most once per test session.

test_bookkeeping.py reads a run's books (where it logged, evaluated and checkpointed),
test_model_state.py its BatchNorm statistics and final accuracy against one process, and each
method's own test file (test_horovod.py, test_mpi.py, test_mwms.py, test_ps.py, test_ps2.py,
test_elastic.py) that its launcher trains it to the target accuracy with what the method promises
(identical weights, the sample budget, where the variables live): different checks of the same run. On this 2-core machine a two-worker run is 10-30 s of start-up, import and
teardown whatever a test reads from it, so each backend's run is shared (the ``jobs`` fixture in
tests/conftest.py), and the job has what both read: a model with state of its own (examples/bn_mlp.py),
an evaluation every epoch, and checkpoints and logs on their own step counts.
"""
import os
import sys

from tests.conftest import BIN, REPO, py, run

HVD = os.path.join(REPO, "horovod_train", "main.py")
MPI = os.path.join(REPO, "mpi_train", "main.py")
MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL",
          "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
MODEL = os.path.join(REPO, "examples", "bn_mlp.py") + ":build"
LOG_EVERY, CKPT_STEPS, EPOCHS = 7, 10, 4
FLAGS = ["--model", MODEL, "--epochs", str(EPOCHS), "--log_every", str(LOG_EVERY),
         "--checkpoint_steps", str(CKPT_STEPS), "--warmup_steps", "2"]


def _elastic(folder, out):
    script = os.path.join(folder, "discover.sh")
    with open(script, "w") as f:
        f.write("#!/bin/sh\necho localhost:2\n")
    os.chmod(script, 0o755)
    return run([os.path.join(BIN, "horovodrun"), "-np", "2", "--min-np", "2", "--max-np", "2",
                "--host-discovery-script", script, "--network-interface", "lo", "--gloo-timeout-seconds", "30",
                sys.executable, HVD, "--elastic", "--commit_steps", "5", *FLAGS, "--train_dir", out], timeout=300)


LAUNCH = {
    "one process": lambda folder, out: run([sys.executable, HVD, *FLAGS, "--train_dir", out], timeout=300),
    "horovod": lambda folder, out: run([os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                                        sys.executable, HVD, *FLAGS, "--train_dir", out], timeout=300),
    "mpi": lambda folder, out: run([*MPIRUN, sys.executable, MPI, *FLAGS, "--train_dir", out], timeout=300),
    "elastic": _elastic,
    "ps sync": lambda folder, out: py("-m", "ps_train.launch", "--num_workers", "2", "--sync", *FLAGS,
                                      "--train_dir", out, timeout=300),
    "ps async": lambda folder, out: py("-m", "ps_train.launch", "--num_workers", "2", "--async", *FLAGS,
                                       "--train_dir", out, timeout=300),
    "ps2": lambda folder, out: py("-m", "ps_train.launch", "--ps_api", "v2", "--num_workers", "2", *FLAGS,
                                  "--train_dir", out, timeout=300),
    "mwms": lambda folder, out: py("-m", "mwms_train.launch", "--num_workers", "2", *FLAGS, "--train_dir", out,
                                   timeout=300),
}


class Jobs:
    """``jobs(backend)`` -> the run directory of that backend's job, launched on first use; a failed
    launch fails every test that asks for it, each with the job's own output."""

    def __init__(self, root):
        self.root, self.done = root, {}

    def __call__(self, backend):
        return self.launched(backend)[1]

    def launched(self, backend):
        """(the launch's CompletedProcess, its run directory): for a test that reads what the
        launcher printed as well as what the run wrote."""
        if backend not in self.done:
            folder = os.path.join(self.root, backend.replace(" ", "_"))
            os.makedirs(folder)
            out = os.path.join(folder, "run")
            self.done[backend] = (LAUNCH[backend](folder, out), out)
        r, out = self.done[backend]
        assert r.returncode == 0, f"{backend}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r, out
