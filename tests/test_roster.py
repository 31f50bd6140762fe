"""A rank that loses a peer under an MPI launcher names it (allreduce/roster.py): which ranks of this
host are gone, who speaks for the host, the failed step's line, and the SIGTERM mpirun sends."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from allreduce.roster import Roster, alive, leaving, step_failure
from tests.conftest import REPO

HOST = socket.gethostname()


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def zombie():
    """A child that has exited and is not reaped yet (as a killed rank is until mpirun reaps it)."""
    p = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    return p


def sigterm_a_rank(setup):
    """Run ``setup`` (Python) in a process that then blocks in a read (as a rank inside MPI_Allreduce),
    SIGTERM it as mpirun would: (its exit code, its stderr)."""
    code = f"import os; {setup}; print('ready', flush=True); r, w = os.pipe(); os.read(r, 1)"
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.poll() is not None else ""
        p.send_signal(signal.SIGTERM)
        return p.wait(timeout=10), p.communicate(timeout=10)[1]
    finally:
        p.kill()


@pytest.mark.unit
def test_a_dead_or_unreaped_process_is_gone_and_a_running_one_is_not():
    z = zombie()
    try:
        assert not alive(z.pid) and not alive(dead_pid()) and alive(os.getpid())
    finally:
        z.wait()


@pytest.mark.unit
@pytest.mark.parametrize("stat, gone", [
    ("42 (python) S 1 42 42 0 -1 4194560 99 0 0 0", False),            # asleep in a collective
    ("42 (python) R 1 42 42 0 -1 4194304 99 0 0 0", False),
    ("42 (py) thon) R 1 42 42 0 -1 4194308 99 0 0 0", True),          # PF_EXITING (0x4): in its exit
    ("42 (python) D 1 42 42 0 -1 4194372 99 0 0 0", True),             # freeing its memory, sockets still open
    ("42 (python) Z 1 42 42 0 -1 4227084 99 0 0 0", True),             # a zombie
    ("42 (python) X 1 42 42 0 -1 0 99 0 0 0", True),
])
def test_a_process_in_its_exit_is_leaving(stat, gone):
    assert leaving(stat) == gone


@pytest.mark.process
def test_a_killed_rank_is_gone_before_its_sockets_close():
    """A peer's collective fails as the killed rank's sockets close, and it looks for the rank at
    once: the rank must read as gone by then. Its exit frees its memory first (tens of ms for 1 GiB),
    its sockets after, and only then is it a zombie: seen as gone while its socket is still open."""
    import select
    import socket as sockets
    code = "import os, sys; held = b'x' * (1 << 30); print('ready', flush=True); os.read(0, 1)"
    seen = False
    for attempt in range(3):                 # a sample can miss the window only if this test is descheduled
        ours, theirs = sockets.socketpair()
        p = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
        theirs.close()                       # the child's copy is the only one left
        try:
            assert p.stdout.readline().strip() == b"ready"
            os.kill(p.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                still_open = not select.select([ours], [], [], 0)[0]    # first the socket, then the process
                if not alive(p.pid):
                    seen = still_open
                    break
        finally:
            p.kill()
            p.wait()
            ours.close()
        if seen:
            break
    assert seen, "the killed process read as running until its sockets had closed"


@pytest.mark.unit
@pytest.mark.parametrize("rank, members, gone, speaks, lost", [
    # rank 1 of this host gone: rank 0 speaks for the host; a rank on another host is not looked up
    (0, [(HOST, "self"), (HOST, "dead"), ("n2", "dead")], [1], True, "rank 1 (pid {dead} on {host})"),
    (2, [(HOST, "dead"), (HOST, "live"), (HOST, "self")], [0], False, "rank 0 (pid {dead} on {host})"),
    (1, [(HOST, "dead"), (HOST, "self"), (HOST, "live")], [0], True, "rank 0 (pid {dead} on {host})"),
    (0, [(HOST, "self"), ("n2", "dead")], [], False, None),
])
def test_the_lowest_survivor_of_a_host_names_its_lost_ranks(rank, members, gone, speaks, lost):
    dead = dead_pid()
    pids = {"self": os.getpid(), "dead": dead, "live": os.getppid()}
    roster = Roster(rank, [(h, pids[p]) for h, p in members])
    assert roster.gone() == gone
    assert bool(roster.speaks(roster.gone())) == speaks
    assert roster.lost() == (lost.format(dead=dead, host=HOST) if lost else None)


@pytest.mark.unit
@pytest.mark.parametrize("rank, members, printed", [(1, [(HOST, "dead"), (HOST, "self")], True),
                                                    (2, [(HOST, "dead"), (HOST, "live"), (HOST, "self")], False),
                                                    (1, [("n2", "dead"), (HOST, "self")], False)])
def test_a_failed_step_names_the_lost_rank_once_per_host(monkeypatch, capsys, rank, members, printed):
    """The speaker prints the line at once, also where a rank's errors are silenced; another survivor
    raises it already said; with no rank of this host gone, TensorFlow's own words (cli prints them)."""
    monkeypatch.setenv("HVDPS_QUIET_ERRORS", "1")
    dead = dead_pid()
    roster = Roster(rank, [(h, {"self": os.getpid(), "dead": dead, "live": os.getppid()}[p]) for h, p in members])
    error = step_failure(roster, f"rank {rank}: training step 12 failed", RuntimeError("Connection reset by peer"))
    err = capsys.readouterr().err
    if roster.gone():
        assert str(error) == f"rank {rank}: training step 12 failed: lost rank 0 (pid {dead} on {HOST})"
        assert err == (f"error: {error}\n" if printed else "") and getattr(error, "said", False)
    else:
        assert str(error) == f"rank {rank}: training step 12 failed: Connection reset by peer" and err == ""
        assert not getattr(error, "said", False)


@pytest.mark.process
@pytest.mark.parametrize("speaker", [True, False])
def test_the_launchers_sigterm_ends_a_rank_blocked_in_native_code_naming_its_lost_peer(speaker):
    """mpirun's SIGTERM reaches a survivor whose main thread never returns to Python (here: a
    blocking read, as inside MPI_Allreduce): the host's speaker prints one line naming the lost rank,
    and every rank exits 143 at once."""
    dead = dead_pid()
    # rank 0 the process itself and rank 2 alive (init); or rank 0 alive (init) and rank 2 the process
    members = f"[({HOST!r}, os.getpid()), ({HOST!r}, {dead}), ({HOST!r}, 1)]" if speaker else \
        f"[({HOST!r}, 1), ({HOST!r}, {dead}), ({HOST!r}, os.getpid())]"
    rank = 0 if speaker else 2
    code, err = sigterm_a_rank(f"from allreduce.roster import Roster; Roster({rank}, {members}).watch_sigterm()")
    assert code == 143, err
    said = f"error: rank {rank}: stopped by SIGTERM from the launcher: lost rank 1 (pid {dead} on {HOST})\n"
    assert err == (said if speaker else ""), err


@pytest.mark.unit
def test_a_rank_ending_on_the_launchers_sigterm_does_not_name_a_peer_that_left_on_it_too(monkeypatch, capsys):
    """A comparison stopped, a job cancelled: every rank gets the SIGTERM, and a collective that fails
    because a peer left on it is no lost rank (the rank's own SIGTERM watcher ends it)."""
    monkeypatch.setenv("HVDPS_QUIET_ERRORS", "0")
    roster = Roster(0, [(HOST, os.getpid()), (HOST, dead_pid())])
    roster.terminating.set()
    error = step_failure(roster, "rank 0: training step 3 failed", RuntimeError("Connection reset by peer"))
    assert getattr(error, "said", False) and capsys.readouterr().err == ""


@pytest.mark.process
def test_a_loss_named_by_the_failed_step_is_not_named_again_by_the_sigterm_after_it():
    """horovodrun's SIGTERM can reach a rank that has just named the lost rank from its failed
    collective and is still exiting: one line, not two."""
    dead = dead_pid()
    code, err = sigterm_a_rank(f"from allreduce.roster import Roster, step_failure; "
                               f"r = Roster(0, [({HOST!r}, os.getpid()), ({HOST!r}, {dead})]); r.watch_sigterm(); "
                               f"step_failure(r, 'rank 0: training step 3 failed', RuntimeError('reset'))")
    assert code == 143, err
    assert err == f"error: rank 0: training step 3 failed: lost rank 1 (pid {dead} on {HOST})\n", err


@pytest.mark.process
@pytest.mark.parametrize("dies_after, named", [(0.2, True), (None, False)])
def test_a_failed_step_waits_briefly_for_a_peer_still_leaving(monkeypatch, capsys, dies_after, named):
    """The collective can fail before the lost peer's process reads as gone: the rank looks again
    for up to SETTLE seconds, and with no peer gone gives TensorFlow's words after that bound."""
    import threading
    from allreduce.roster import SETTLE
    monkeypatch.setenv("HVDPS_QUIET_ERRORS", "0")
    peer = subprocess.Popen(["sleep", "30"])
    timer = threading.Timer(dies_after, peer.kill) if dies_after else None
    try:
        roster = Roster(0, [(HOST, os.getpid()), (HOST, peer.pid)])
        t0 = time.monotonic()
        if timer:
            timer.start()
        error = step_failure(roster, "rank 0: training step 3 failed", RuntimeError("Connection reset by peer"))
        took = time.monotonic() - t0
    finally:
        peer.kill()
        peer.wait()
    if named:
        assert str(error) == f"rank 0: training step 3 failed: lost rank 1 (pid {peer.pid} on {HOST})"
        assert capsys.readouterr().err == f"error: {error}\n"
    else:
        assert "lost" not in str(error) and SETTLE <= took < SETTLE + 5
