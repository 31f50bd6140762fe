"""A worker's view of the tasks it depends on: the PS tasks and the chief.

A lost PS shows in a worker as a failed step whose message names no task, or,
in TensorFlow's monitored sessions, as a silent wait for a new session; and an
async worker that loses its chief would happily train on alone, unsaved. So
each worker probes its peers' ports itself:

- a PS whose port stays closed ends the worker at once with one line;
- a chief that is gone pauses the worker until it is back (a restarted chief
  restores the latest checkpoint and the survivors carry on with it), or ends
  it after --startup_timeout.
"""
import os
import sys
import threading
import time

from common.base.errors import InputError, RunError
from common.base.procs import port_open

PROBE_SECONDS = 0.5
PS_LOST_PROBES = 3        # consecutive failed probes (about 1.5 s) before a PS counts as gone


def blamed_ps(exc, ps_addresses):
    """(index, address) of the PS to blame for a failed call, or None.

    A call that fails while a PS's port is closed failed because that PS is gone, whatever
    TensorFlow raised: a step can fail in graph registration as an UnknownError ("connection
    reset"), which names no task. A damaged record (InputError) keeps its own line: the worker
    that read it is the one that can name the file."""
    if isinstance(exc, InputError):
        return None
    return next(((i, addr) for i, addr in enumerate(ps_addresses) if not port_open(addr)), None)


class PSWatch:
    """Background probe of every PS port; exits the process when one is gone."""

    def __init__(self, backend):
        self.backend = backend
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdps-ps-watch")
        self._thread.start()

    def _run(self):
        failures = {addr: 0 for addr in self.backend.cluster["ps"]}
        while not self._stop.wait(PROBE_SECONDS):
            for i, addr in enumerate(self.backend.cluster["ps"]):
                failures[addr] = 0 if port_open(addr) else failures[addr] + 1
                if failures[addr] >= PS_LOST_PROBES and not self._stop.is_set():
                    self._leave(i, addr)

    def exit_if_lost(self, exc=None):
        """After a failed call: if a PS's port is closed now, that is the cause; say so and leave."""
        lost = blamed_ps(exc, self.backend.cluster["ps"])
        if lost:
            self._leave(*lost)

    def _leave(self, i, addr):
        print(f"error: {self.backend.job}:{self.backend.index}: parameter server ps:{i} ({addr}) "
              f"is gone: stopping", file=sys.stderr, flush=True)
        os._exit(1)

    def stop(self):
        """Training is over: the PS tasks may now leave without that being an error."""
        self._stop.set()


class ChiefWatch:
    """Non-chief workers: pause while the chief is down, at most --startup_timeout."""

    def __init__(self, backend, on_wait=None):
        self.backend = backend
        self.on_wait = on_wait or (lambda: None)
        self._next_probe = 0.0

    def check(self):
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_SECONDS
        if port_open(self.backend.chief_address):
            return
        who = f"{self.backend.job}:{self.backend.index}"
        print(f"{who}: chief {self.backend.chief_address} is gone; pausing until it is back "
              f"(at most {self.backend.startup_timeout:g}s)", flush=True)
        deadline = now + self.backend.startup_timeout
        while not port_open(self.backend.chief_address):
            self.on_wait()
            if time.monotonic() > deadline:
                raise RunError(f"{who}: chief {self.backend.chief_address} did not come back within "
                               f"{self.backend.startup_timeout:g}s (--startup_timeout)")
            time.sleep(PROBE_SECONDS)
        print(f"{who}: chief is back; continuing", flush=True)
