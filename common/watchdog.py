"""Liveness: a loop that stops making progress, or a loss that is no longer a number, ends the run.

The last line of defence against gRPC and MPI calls that TensorFlow or Horovod would wait on forever,
and against a diverged loss trained on for the rest of the run.
"""
import os
import sys
import time

import numpy as np

from common.errors import RunError


class Watchdog:
    """Ends the process with a one-line error if the training loop stops making progress.

    The last line of defence against gRPC/MPI calls that TensorFlow or Horovod
    would otherwise wait on forever (a dead peer during session creation, say).
    """

    def __init__(self, timeout, message, code=1):
        import threading
        self.timeout, self.message, self.code = timeout, message, code
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdps-watchdog")
        self._thread.start()

    def kick(self, message=None):
        self._last = time.monotonic()
        if message:
            self.message = message

    def _run(self):
        while not self._stop.wait(0.5):
            if time.monotonic() - self._last > self.timeout:
                print(f"error: {self.message} (no progress for {self.timeout:.0f}s)",
                      file=sys.stderr, flush=True)
                os._exit(self.code)

    def stop(self):
        self._stop.set()


def check_alive(value):
    if not np.all(np.isfinite(value)):
        raise RunError("loss became NaN/inf: lower --learning_rate")
