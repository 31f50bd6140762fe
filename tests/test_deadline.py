"""Each step of an MPI-launched rank is bounded, and what the rank says when the bound passes
(allreduce/deadline.py): the rank whose own pipeline stalled, or whose own work between steps hangs,
names itself; a rank waiting in its exchange names the peer of its host that the kernel holds
stopped, says nothing of a peer that left, and names the other hosts' ranks otherwise. A pipeline
that never yields is also run under MWMS and both PS trainers (a PS chief's evaluation bounded by its
watchdog). Under horovodrun --gloo, Gloo's own bound on each operation is set past the deadline's. The
whole job, a stopped rank under mpirun, is in tests/test_mpi.py."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from unittest import mock

from allreduce.deadline import GRACE, StepDeadline, state_of
from horovod_train.main import make_parser
from horovod_train.backend import tuning_env
from allreduce.roster import Roster
from tests.conftest import REPO, run
from tests.test_roster import dead_pid

HOST = socket.gethostname()


@pytest.fixture(scope="module")
def pids():
    """A running process, a stopped one and a pid that is gone."""
    running = subprocess.Popen(["sleep", "120"])
    stopped = subprocess.Popen(["sleep", "120"])
    os.kill(stopped.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while state_of(stopped.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    yield {"self": os.getpid(), "running": running.pid, "stopped": stopped.pid, "dead": dead_pid()}
    for p in (running, stopped):
        p.kill()
        p.wait()


STOPPED = "(SIGSTOP: a preempted, suspended or swapping process)"


@pytest.mark.unit
@pytest.mark.parametrize("rank, members, phase, first, line, speaks", [
    # its own pipeline: the rank names itself, whichever rank it is
    (1, [(HOST, "running"), (HOST, "self")], "input", False,
     "rank 1: step 7: no batch from the input pipeline for 5s (--step_timeout): its pipeline stalled", True),
    (0, [(HOST, "self")], "input", True,
     "rank 0: step 7: no batch from the input pipeline for 8s (--step_timeout + --startup_timeout): its pipeline "
     "stalled", True),
    # in its exchange: a stopped peer of this host is named by the host's lowest waiting rank
    (0, [(HOST, "self"), (HOST, "stopped")], "step", False,
     "rank 0: step 7 waited 5s (--step_timeout) for rank 1 (pid {stopped} on {host}): stopped " + STOPPED, True),
    (1, [(HOST, "stopped"), (HOST, "self"), (HOST, "running")], "step", False,
     "rank 1: step 7 waited 5s (--step_timeout) for rank 0 (pid {stopped} on {host}): stopped " + STOPPED, True),
    (2, [(HOST, "stopped"), (HOST, "running"), (HOST, "self")], "step", False,
     "rank 2: step 7 waited 5s (--step_timeout) for rank 0 (pid {stopped} on {host}): stopped " + STOPPED, False),
    # a peer that left said why (or mpirun does): nothing more
    (0, [(HOST, "self"), (HOST, "dead")], "step", False, None, False),
    # nobody stopped here: the rank it waits for is on another host, named when it is the only one there,
    # listed when there are several; each host's lowest waiting rank says so
    (0, [(HOST, "self"), ("n2", 4242)], "step", False,
     "rank 0: step 7 waited 5s (--step_timeout) for the exchange: rank 1 (pid 4242 on n2) did not arrive", True),
    (1, [("n1", 4242), (HOST, "self")], "step", False,
     "rank 1: step 7 waited 5s (--step_timeout) for the exchange: rank 0 (pid 4242 on n1) did not arrive", True),
    (2, [("n1", 4242), (HOST, "running"), (HOST, "self")], "step", False,
     "rank 2: step 7 waited 5s (--step_timeout) for the exchange: rank 0 (pid 4242 on n1) did not arrive", False),
    (0, [(HOST, "self"), ("n2", 11), ("n3", 12)], "step", False,
     "rank 0: step 7 waited 5s (--step_timeout) for the exchange: one of rank 1 (pid 11 on n2), "
     "rank 2 (pid 12 on n3) did not arrive", True),
])
def test_who_a_rank_past_its_deadline_names(pids, rank, members, phase, first, line, speaks):
    roster = Roster(rank, [(h, pids.get(p, p)) for h, p in members], host=HOST)
    deadline = StepDeadline(rank, 5.0, 3.0, roster=roster)
    deadline.stop()
    limit = 8.0 if first else 5.0
    got = deadline.verdict(7, phase, limit)
    assert got == ((line.format(stopped=pids["stopped"], host=HOST) if line else None), speaks)


@pytest.mark.unit
def test_a_step_without_a_roster_names_the_step():
    deadline = StepDeadline(0, 5.0, 3.0)
    deadline.stop()
    assert deadline.verdict(3, "step", 5.0) == ("rank 0: step 3 did not finish within 5s (--step_timeout)", True)


@pytest.mark.unit
@pytest.mark.parametrize("gap, shifted", [
    (0.25, 0.0),          # the watcher looked on time: the bound runs on (a hang leaves the watcher running)
    (0.45, 0.0),          # late by less than a look: scheduling noise
    (1.25, 1.0),          # it could not look for a second: this process was stopped or not scheduled
    (30.25, 30.0),
])
def test_time_this_process_was_stopped_is_not_its_own(gap, shifted):
    """A rank stopped (a stall, --stall) while its own work or input is bounded: the bound counts
    only the time it ran, so a stall shorter than the bound is a slow step on the stalled rank too."""
    deadline = StepDeadline(1, 5.0, 3.0)
    deadline.stop()
    deadline.begin(4)
    started = deadline._armed[2]
    deadline._tick = 100.0
    deadline._gap(100.0 + gap)
    assert deadline._armed[2] == pytest.approx(started + shifted) and deadline._tick == 100.0 + gap
    assert (deadline._thawed == 100.0 + gap) == (gap > 1.0)     # a second or more: it was stopped


@pytest.mark.unit
def test_own_work_is_bounded_and_named_by_its_rank():
    """A rank's own work between steps (a checkpoint's save) names the rank, whichever it is; the first
    of each kind also gets --startup_timeout."""
    deadline = StepDeadline(3, 5.0, 3.0)
    deadline.stop()
    deadline.begin(12)
    deadline.end()
    limits = []
    for _ in range(2):
        with deadline.own("its checkpoint's save") as progress:
            limits.append(deadline._armed[3])
            started = deadline._armed[2]
            time.sleep(0.01)
            progress()                           # a batch done: the bound starts again
            assert deadline._armed[2] > started and deadline._armed[3] == limits[-1]
    assert limits == [8.0, 5.0] and deadline._armed is None
    assert deadline.verdict(12, "its checkpoint's save", 5.0) == (
        "rank 3: after step 12: its checkpoint's save did not finish within 5s (--step_timeout)", True)


NEVER_YIELDS = '''
import time
import numpy as np
import tensorflow as tf

NEVER = "{split}"

def load(cfg):
    def never():
        while True:
            time.sleep(3600)
            yield np.zeros((2, 3, 1), np.float32), 0
    def split(name, size):
        if name == NEVER:
            return tf.data.Dataset.from_generator(never, output_signature=(
                tf.TensorSpec((2, 3, 1), tf.float32), tf.TensorSpec((), tf.int64))).batch(4)
        return tf.data.Dataset.from_tensor_slices((np.zeros((size, 2, 3, 1), np.float32),
                                                   np.zeros(size, np.int64))).batch(4)
    return {"train": lambda ctx: split("train", 40), "test": lambda ctx: split("test", 8),
            "train_examples": 40, "input_shape": (2, 3, 1), "classes": 2}
'''


@pytest.mark.process
@pytest.mark.parametrize("method, split, line", [
    ("mpi", "train", "error: rank 0: step 1: no batch from the input pipeline for 12s (--step_timeout + "
                     "--startup_timeout): its pipeline stalled"),
    ("mpi", "test", "error: rank 0: after step 10: its share of the evaluation did not finish within 12s "
                    "(--step_timeout + --startup_timeout)"),
    ("ps", "test", "error: worker:0 (chief): its evaluation after update 10 did not finish (no progress for 12s)"),
    ("ps2", "test", "error: chief: its evaluation after update 10 did not finish (no progress for 12s)"),
])
def test_a_pipeline_that_never_yields_ends_the_run_naming_it(tmp_path, method, split, line):
    """A plug-in's pipeline that never gives a batch, for training or for the process's own share of an
    evaluation: the rank (the chief) names itself and what it was doing within --startup_timeout +
    --step_timeout and the job exits non-zero, instead of hanging. The all-reduces' bound
    (allreduce/deadline.py, one for bare MPI, Horovod, local SGD and MWMS; test_mwms.py holds MWMS's
    wiring of it) under bare MPI's trainer alone; each PS chief's watchdog as ``hvdps launch`` starts
    its tasks, one worker each."""
    plugin = tmp_path / "never.py"
    plugin.write_text(NEVER_YIELDS.replace("{split}", split))
    flags = ["--dataset", f"{plugin}:load", "--batch_size", "4", "--probe_steps", "0", "--step_timeout", "4",
             "--startup_timeout", "8", "--train_dir", str(tmp_path / "run")]
    if method == "mpi":
        argv = [sys.executable, os.path.join(REPO, "mpi_train", "main.py"), *flags]
    else:
        argv = [os.path.join(os.path.dirname(sys.executable), "hvdps"), "launch", method, "--num_workers", "1", *flags]
    started = time.monotonic()
    r = run(argv, timeout=120)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and errors == [line], r.stderr[-3000:]
    assert time.monotonic() - started < 90


WORKS_AND_KICKS = """
import time
from common.trainer.watchdog import Watchdog

def work(n):                                     # CPU work, not a sleep: it resumes where it stopped
    x = 0
    for i in range(n):
        x += i * i
    return x

t0, n = time.monotonic(), 200000
work(n)
per_second = int(n / max(time.monotonic() - t0, 1e-3))
dog = Watchdog(5.0, "no progress")
for _ in range(4):
    dog.kick()
    print("kicked", flush=True)
    work(per_second)                             # about a second between two kicks: well within the 5 s
"""


@pytest.mark.process
def test_a_watchdog_does_not_count_the_time_its_process_was_stopped(tmp_path):
    """A PS task stopped for longer than its bound (a stall) and continued goes on: the bound is on
    what it does, not on the time the kernel held it (common/trainer/watchdog.py)."""
    p = subprocess.Popen([sys.executable, "-c", WORKS_AND_KICKS], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "kicked"
        os.kill(p.pid, signal.SIGSTOP)               # just after a kick: a second of work still to do
        time.sleep(8.0)                              # longer than the watchdog's 5 s
        os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0 and "error:" not in err and out.count("kicked") == 3, (out, err)


@pytest.mark.unit
@pytest.mark.parametrize("flags, env, gloo", [
    ([], {}, str(60 + 60 + int(GRACE) + 10)),                            # Gloo's 30 s would end the job first
    (["--step_timeout", "4", "--startup_timeout", "1.5"], {}, str(4 + 2 + int(GRACE) + 10)),   # whole seconds, up
    ([], {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"}, None),                   # horovodrun --gloo-timeout-seconds: kept
    (["--elastic"], {}, None),                          # no step deadline: Gloo's bound finds a hung peer
])
def test_gloo_waits_past_the_step_deadline_unless_told(flags, env, gloo):
    """Under horovodrun --gloo a stopped rank must be named by the deadline, not by Gloo's receive timeout."""
    with mock.patch.dict(os.environ, env, clear=False):
        if not env:
            os.environ.pop("HOROVOD_GLOO_TIMEOUT_SECONDS", None)
        assert tuning_env(make_parser().parse_args(flags)).get("HOROVOD_GLOO_TIMEOUT_SECONDS") == gloo
