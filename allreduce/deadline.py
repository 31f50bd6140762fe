"""Every step of an MPI-launched rank is bounded, and a rank that waits past the bound names who it waits for.

A collective (Horovod's ring, an ``MPI_Allreduce``) waits for every rank for as long as it takes: a
rank that is stopped (SIGSTOP, as a preempted or swapping machine stops it) or whose input pipeline
never yields leaves the others blocked for good, and ``mpirun`` prints nothing. So each rank arms a
deadline when a step begins (``--step_timeout``; the first step also gets ``--startup_timeout`` for
tracing and the first negotiation) and disarms it when the step ends. What a rank says when its
deadline passes depends on where it is:

- waiting for its next batch: its own pipeline stalled. It names itself, whichever rank it is, and
  ends the job (it is the only one that knows).
- inside the step (its compute and the exchange): it waits for a peer. After ``GRACE`` (a peer stalled
  in its own pipeline started its step at about the same time, and speaks for itself) it looks at the
  ranks of its host (the roster: each rank's host and pid): a rank the kernel holds stopped is named,
  with its pid; one that is gone was already named by itself or by mpirun. Else every rank of its
  host is here and waiting, so the one it waits for is among the other hosts' ranks: named by rank,
  pid and host when it is the only one (the everyday two-host job), else the line lists them. The
  kernel's state of a process on another host cannot be read from here, so the line says "did not
  arrive", not "stopped". The lowest waiting rank of each host speaks (a host whose only rank
  stopped has no one to speak for it, so the other hosts do); every rank exits, and Open MPI ends
  the rest of the job.

The collectives between steps (the logged loss, an evaluation's sums) are bounded alike, and so is
a rank's own work between them (each batch of its share of an evaluation, rank 0's checkpoint
save): a rank whose own work passes the bound names itself and what it was doing (a test pipeline
that stopped, a checkpoint on a hung file system), before the ranks waiting for it would. The
first time each is done it also gets ``--startup_timeout`` (tracing). Each bound counts only the
time this process ran: while it is stopped its watcher cannot look, and the gap moves the bound on,
so a stall shorter than the timeout is a slow step on the stalled rank as well as on its peers
(``hvdps compare --stall``); a longer one is this line, said by a peer.
"""
import contextlib
import os
import sys
import threading
import time

from allreduce.roster import alive
from common.trainer.watchdog import unseen

GRACE = 2.0            # seconds a rank inside its step waits past the deadline before it speaks
FROZEN = 1.0           # a gap in the watcher's 0.25 s looks that says this process was stopped
LOOK = 0.25            # seconds between the watcher's looks
EXIT_TIMEOUT = 1


def state_of(pid):
    """The kernel's one-letter state of ``pid`` ('R', 'S', 'T' stopped, 't' traced ...), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class StepDeadline:
    """One rank's bound on each step (``begin`` ... ``batch`` ... ``end``), watched by a thread that
    ends the process with one line (``os._exit``: the main thread may be inside MPI or TensorFlow for
    good, where nothing else runs)."""

    def __init__(self, rank, step_timeout, startup_timeout, roster=None, out=None):
        self.rank, self.step_timeout, self.startup_timeout = rank, step_timeout, startup_timeout
        self.roster, self.out = roster, out
        self._lock = threading.Lock()
        self._armed = None              # (step, phase, started, limit)
        self._first, self._step = True, 0
        self._done = set()              # the kinds of own work done once (the first also traces)
        self._stop = threading.Event()
        self._tick, self._thawed = time.monotonic(), -1e9
        if roster is not None:
            roster.frozen = self.frozen
        threading.Thread(target=self._watch, name="hvdps-step-deadline", daemon=True).start()

    def begin(self, step):
        """Step ``step`` begins: its batch is asked for."""
        limit = self.step_timeout + (self.startup_timeout if self._first else 0)
        with self._lock:
            self._armed, self._step = (step, "input", time.monotonic(), limit), step

    def batch(self):
        """The batch came: the rank is in its compute and the exchange."""
        with self._lock:
            if self._armed:
                step, _, started, limit = self._armed
                self._armed = (step, "step", started, limit)

    def end(self):
        with self._lock:
            self._armed, self._first = None, False

    @contextlib.contextmanager
    def exchange(self):
        """A collective after the step last begun (the logged loss, an evaluation's sums), bounded as a step."""
        with self._lock:
            self._armed = (self._step, "step", time.monotonic(), self.step_timeout)
        try:
            yield
        finally:
            with self._lock:
                self._armed = None

    @contextlib.contextmanager
    def own(self, what):
        """This rank's own work between steps (``what``: "its share of the evaluation", "its checkpoint's
        save"), bounded as a step; the first of each kind gets --startup_timeout on top. Yields a
        function that starts the bound again: an evaluation calls it after each batch, so its bound
        is a batch's, however large the test set."""
        limit = self.step_timeout + (0 if what in self._done else self.startup_timeout)

        def progress():
            with self._lock:
                self._armed = (self._step, what, time.monotonic(), limit)
        progress()
        try:
            yield progress
        finally:
            self._done.add(what)
            with self._lock:
                self._armed = None

    def stop(self):
        self._stop.set()

    def frozen(self):
        """This process was stopped (its watcher, which looks every 0.25 s, saw a gap of a second or more,
        or has not looked for that long): once continued, it is the rank a peer named, and says nothing."""
        now = time.monotonic()
        return now - self._tick > FROZEN or now - self._thawed < 2 * FROZEN

    def _gap(self, now):
        """The watcher looks again at ``now``: the armed bound starts later by the time it could not
        look (``unseen``: this process stopped, or not scheduled)."""
        gap = unseen(now, self._tick, LOOK)
        if gap:
            with self._lock:
                if self._armed:
                    step, phase, started, limit = self._armed
                    self._armed = (step, phase, started + gap, limit)
        if now - self._tick > FROZEN:
            self._thawed = now
        self._tick = now

    def _watch(self):
        while not self._stop.wait(LOOK):
            now = time.monotonic()
            self._gap(now)
            with self._lock:
                armed = self._armed
            if armed is None:
                continue
            step, phase, started, limit = armed
            waited = time.monotonic() - started
            if waited <= limit + (GRACE if phase == "step" else 0):
                continue
            with self._lock:
                if self._armed != armed:        # the step ended as we looked
                    continue
            line, speaks = self.verdict(step, phase, limit)
            if speaks and line and not self.frozen():
                (self.out or sys.stderr).write(f"error: {line}\n")
                (self.out or sys.stderr).flush()
            sys.stdout.flush()
            os._exit(EXIT_TIMEOUT)

    def verdict(self, step, phase, limit):
        """(the line, whether this rank prints it)."""
        bound = f"{limit:g}s (--step_timeout{' + --startup_timeout' if limit > self.step_timeout else ''})"
        if phase == "input":
            return (f"rank {self.rank}: step {step}: no batch from the input pipeline for {bound}: its pipeline "
                    f"stalled", True)
        if phase != "step":                     # its own work: it names itself, whichever rank it is
            return f"rank {self.rank}: after step {step}: {phase} did not finish within {bound}", True
        roster = self.roster
        if roster is None:                      # no roster (one process, or MWMS's workers): rank 0 says it
            return f"rank {self.rank}: step {step} did not finish within {bound}", self.rank == 0
        here = [r for r, (host, _) in enumerate(roster.members) if host == roster.host and r != self.rank]
        if any(not alive(roster.members[r][1]) for r in here):
            return None, False          # a peer left: it said why, or mpirun names it
        stopped = [r for r in here if state_of(roster.members[r][1]) in ("T", "t")]
        waiting = [r for r in range(len(roster.members)) if roster.members[r][0] == roster.host and r not in stopped]
        speaks = min(waiting) == self.rank
        if stopped:
            who = ", ".join(f"rank {r} (pid {roster.members[r][1]} on {roster.host})" for r in stopped)
            return (f"rank {self.rank}: step {step} waited {bound} for {who}: stopped (SIGSTOP: a preempted, "
                    f"suspended or swapping process)", speaks)
        elsewhere = [f"rank {r} (pid {pid} on {host})" for r, (host, pid) in enumerate(roster.members)
                     if host != roster.host]
        if not elsewhere:
            where = "a rank that is running but did not arrive"
        elif len(elsewhere) == 1:
            where = f"{elsewhere[0]} did not arrive"
        else:
            where = f"one of {', '.join(elsewhere)} did not arrive"
        return (f"rank {self.rank}: step {step} waited {bound} for the exchange: {where}",
                speaks)                  # each host's lowest waiting rank: a host with no other rank is never silent
