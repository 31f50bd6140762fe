"""Liveness: a loop that stops making progress, or a loss that is no longer a number, ends the run.

The last line of defence against gRPC and MPI calls that TensorFlow or Horovod would wait on forever,
and against a diverged loss trained on for the rest of the run.
"""
import contextlib
import faulthandler
import os
import select
import signal
import sys
import threading
import time

import numpy as np

from common.base.errors import RunError


def unseen(now, looked, look):
    """Seconds a watcher that looks every ``look`` s could not look between ``looked`` and ``now``:
    its process was stopped (SIGSTOP, ``--stall``) or not scheduled, so that time is not the
    process's own and a liveness bound moves on by it. A hang inside TensorFlow or MPI leaves the
    watcher looking: its bound runs on. Late by less than a look is scheduling noise: 0."""
    gap = now - looked - look
    return gap if gap > look else 0.0


class Watchdog:
    """Ends the process with a one-line error if the training loop stops making progress.

    The last line of defence against gRPC/MPI calls that TensorFlow or Horovod
    would otherwise wait on forever (a dead peer during session creation, say).
    Time the process spent stopped (SIGSTOP, ``--stall``) is not counted: the
    watcher could not look then, and the gap moves the bound on.
    """

    LOOK = 0.5             # seconds between the watcher's looks

    def __init__(self, timeout, message, code=1):
        self.timeout, self.message, self.code = timeout, message, code
        self._last = time.monotonic()
        self._paused = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdps-watchdog")
        self._thread.start()

    def kick(self, message=None):
        self._last = time.monotonic()
        if message:
            self.message = message

    @contextlib.contextmanager
    def doing(self, message):
        """A block of the process's own work between steps (an evaluation, kicked per batch, a
        checkpoint's save), bounded as a step and named by ``message`` should it hang; the loop's
        line after it."""
        before, paused = self.message, self._paused
        self.kick(message)
        self._paused = False
        try:
            yield
        finally:
            self._paused = paused
            self.kick(before)

    def pause(self):
        """Unbounded from here (work whose length is not a step's: the probe's timing), but for
        blocks in ``doing``."""
        self._paused = True

    def _run(self):
        looked = time.monotonic()
        while not self._stop.wait(self.LOOK):
            now = time.monotonic()
            self._last += unseen(now, looked, self.LOOK)
            looked = now
            if not self._paused and time.monotonic() - self._last > self.timeout:
                print(f"error: {self.message} (no progress for {self.timeout:g}s)",
                      file=sys.stderr, flush=True)
                os._exit(self.code)

    def stop(self):
        self._stop.set()


class OutsideDeadline:
    """Ends this process with one ``error:`` line and exit status 1 if a block has not finished within
    ``seconds``: for waits inside TensorFlow that hold the GIL (a MultiWorkerMirroredStrategy joining
    a peer that never starts), where no thread or signal handler of this process can run.

    A forked watcher process writes the line: it only waits on a pipe this process closes when the
    block ends (or when it exits), so it calls nothing TensorFlow's threads may hold. The exit is
    faulthandler's: its watchdog is a C thread that needs no GIL, and ``exit=True`` ends the process
    with ``_exit(1)`` once it has dumped the stacks (to nowhere: the line is the message), shortly
    after the watcher's line. SIGKILL from the watcher is the backstop, should the process still
    be there. ``message``: called in the watcher, when the time is up, for the line's text."""

    EXIT_AFTER = 0.5       # seconds after the line that faulthandler ends the process
    BACKSTOP = 10.0        # seconds after that the watcher kills it

    def __init__(self, seconds, message):
        self.seconds, self.message = seconds, message
        self._w, self._pid, self._sink = None, None, None

    def __enter__(self):
        if not self.seconds or self.seconds <= 0:
            return self
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the watcher
            code = 0
            try:
                os.close(w)
                parent = os.getppid()
                if not select.select([r], [], [], self.seconds)[0]:
                    os.write(2, f"error: {self.message()}\n".encode(errors="replace"))
                    code = 1
                    if not select.select([r], [], [], self.EXIT_AFTER + self.BACKSTOP)[0]:
                        os.kill(parent, signal.SIGKILL)
            finally:
                os._exit(code)
        os.close(r)
        self._w, self._pid = w, pid
        self._sink = open(os.devnull, "w")
        faulthandler.dump_traceback_later(self.seconds + self.EXIT_AFTER, exit=True, file=self._sink)
        return self

    def __exit__(self, *exc):
        if self._w is not None:
            faulthandler.cancel_dump_traceback_later()
            self._sink.close()
            os.close(self._w)                          # in time: the watcher sees the pipe close and ends
            os.waitpid(self._pid, 0)
            self._w = None


def check_alive(value):
    if not np.all(np.isfinite(value)):
        raise RunError("loss became NaN/inf: lower --learning_rate")
