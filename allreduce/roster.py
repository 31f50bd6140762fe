"""Who the other ranks of an MPI-launched job are, so that a rank that loses one can name it.

Under a user's own ``mpirun`` (or ``horovodrun``), a rank that dies leaves the others blocked in a
collective or failing in one, and Open MPI then ends them: SIGTERM to every rank left, SIGKILL about
a second later (``odls_base_sigkill_timeout``). Without a word from them, the job's output says only
which rank mpirun saw die, in a frame among the survivors' noise. So every rank records each rank's
host and process id at start (one all-gather), and a survivor names the ranks of its own host that
are gone, in one ``error:`` line: when its collective fails, or when the launcher's SIGTERM comes
while it is blocked in one. The lowest surviving rank of each host speaks, so a job prints the line
once per host that lost a rank. A rank on another host cannot be looked up from here (mpirun's own
message names it).

The SIGTERM is caught by ``signal.set_wakeup_fd`` and a thread reading its pipe: the main thread may
be inside MPI_Allreduce or a TensorFlow op for good, where a Python signal handler never runs.
"""
import os
import signal
import socket
import sys
import threading
import time

from common.base.errors import RunError, describe, say_first

EXIT_SIGTERM = 128 + signal.SIGTERM
# A rank leaving on SIGTERM stays this long, so that a peer checking who is gone as the same SIGTERM
# reaches it (a comparison stopped, a job cancelled) does not take it for a lost rank. Open MPI's
# SIGKILL follows its SIGTERM after odls_base_sigkill_timeout, 1 s by default.
LEAVE_AFTER = 0.3
# How long a rank whose collective failed looks for a lost peer before it gives TensorFlow's words.
SETTLE = 0.5


# linux/sched.h: set on a task as its exit begins, before its files (a peer's sockets) are closed.
PF_EXITING = 0x4


def leaving(stat):
    """From the text of /proc/<pid>/stat: the process is dead or on its way out. A peer's collective
    fails as the lost rank's sockets close, inside its exit and before it is a zombie, so a zombie
    check alone can find it still there; the PF_EXITING flag is set before those sockets close."""
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] in ("Z", "X", "x") or bool(int(fields[6]) & PF_EXITING)


def alive(pid):
    """True while ``pid`` runs (a zombie, dead but not yet reaped by its launcher, or a process in
    its exit counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not leaving(f.read())
    except (OSError, IndexError, ValueError):
        return True          # no /proc: what kill(0) said


class Roster:
    """Every rank's (host, pid), in rank order, as this rank saw them at start."""

    def __init__(self, rank, members, host=None):
        self.rank, self.members = rank, [tuple(m) for m in members]
        self.host = host or socket.gethostname()
        self.terminating = threading.Event()     # the launcher's SIGTERM came: the job is ending anyway
        self.named = threading.Event()           # a failed collective has named the loss already
        # this process was stopped (allreduce/deadline.py): continued by the launcher's SIGCONT before
        # its SIGTERM, it is the rank a peer named as stopped, and says nothing of its own
        self.frozen = lambda: False

    @classmethod
    def gather(cls, rank, allgather):
        """``allgather(obj)`` -> every rank's obj, in rank order (Horovod's allgather_object,
        mpi4py's comm.allgather)."""
        return cls(rank, allgather((socket.gethostname(), os.getpid())))

    def gone(self):
        """The ranks on this host whose process is gone."""
        return [r for r, (host, pid) in enumerate(self.members)
                if r != self.rank and host == self.host and not alive(pid)]

    def settled_gone(self, within=SETTLE):
        """The ranks of this host that are gone, looked for again for up to ``within`` seconds while
        none is: a failed collective is the first sign of a lost peer, and the peer's exit may still
        be under way (see ``leaving``). Open MPI's SIGTERM comes only after it has reaped the lost rank."""
        deadline = time.monotonic() + within
        gone = self.gone()
        while not gone and time.monotonic() < deadline and not self.terminating.is_set():
            time.sleep(0.05)
            gone = self.gone()
        return gone

    def speaks(self, gone):
        """This rank names the loss: the lowest rank left on this host."""
        left = [r for r, (host, _) in enumerate(self.members) if host == self.host and r not in gone]
        return bool(gone) and left and min(left) == self.rank

    def lost(self, gone=None):
        """'rank 1 (pid 4242 on n1)', for each gone rank of this host; None when none is gone."""
        gone = self.gone() if gone is None else gone
        if not gone:
            return None
        return ", ".join(f"rank {r} (pid {self.members[r][1]} on {self.members[r][0]})" for r in gone)

    def watch_sigterm(self, out=None):
        """On SIGTERM: the lowest surviving rank of this host prints which ranks of it are gone, then
        every rank exits 143 (as SIGTERM's default would end it) LEAVE_AFTER seconds later."""
        out = out or sys.stderr
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.signal(signal.SIGTERM, lambda signum, frame: None)   # the C handler writes the pipe
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

        def watch():
            while signal.SIGTERM not in os.read(read_end, 64):
                pass
            self.terminating.set()
            gone = self.gone()                   # at once: peers ending on the same SIGTERM are still here
            if self.speaks(gone) and not self.named.is_set() and not self.frozen():
                out.write(f"error: rank {self.rank}: stopped by SIGTERM from the launcher: lost {self.lost(gone)}\n")
                out.flush()
            sys.stdout.flush()
            time.sleep(LEAVE_AFTER)
            os._exit(EXIT_SIGTERM)
        threading.Thread(target=watch, name="hvdps-sigterm", daemon=True).start()


def step_failure(roster, what, exc):
    """The RunError for a failed collective (``what``: 'rank 1: training step 12 failed'): naming the
    ranks of this host that are gone, printed now by the rank that speaks for the host (even where
    a rank's errors are silenced) and by no other; else TensorFlow's own words."""
    if roster and roster.terminating.is_set():  # a peer left on the launcher's SIGTERM, as this rank will
        error = RunError(f"{what}: {describe(exc)}")
        error.said = True
        return error
    gone = roster.settled_gone() if roster else []
    if not gone:
        return RunError(f"{what}: {describe(exc)}")
    error = RunError(f"{what}: lost {roster.lost(gone)}")
    roster.named.set()                           # the launcher's SIGTERM, if it comes now, adds no line
    if roster.speaks(gone):
        say_first(error, force=True)
    else:
        error.said = True                        # the host's lowest surviving rank says it
    return error
