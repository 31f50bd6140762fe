"""Each rank's or task's own steps, one way for every training loop: what a per-rank timeline and a
slow worker's picture need, which the chief's metrics (one writer) cannot show.

Every rank times each of its steps on the wall clock (the hosts of one machine or an emulated
cluster share it): the wait for its batch at the iterator, the step call, and the exchange inside
it where the method times that itself (``Backend.exchange_times``: bare MPI's MPI_Allreduce, local
SGD's averaging). At the end each writes ``ranks/<task>.json``: its step-time distribution (p50,
p95, max over every step after the warm-up), the spans of its logged steps (every
``--log_every``-th) and its process's CPU seconds per step over the same steps, every thread
counted (TensorFlow's gRPC and collective threads too): what a CPU quota of q cores stretches to
at least that / q, whether the rank spins or blocks while it waits. hvdps/measure/timeline.py turns
a run's files into one Chrome trace.
"""
import json
import os
import socket
import time

import numpy as np

from common.base.files import make_dirs, write_atomic

RANKS_DIR = "ranks"


def quantiles(durations):
    """{n, p50, p95, max} of step durations in seconds (None for none)."""
    if not durations:
        return None
    d = np.asarray(durations, dtype=np.float64)
    return {"n": int(d.size), "p50": float(np.percentile(d, 50)), "p95": float(np.percentile(d, 95)),
            "max": float(d.max())}


class StepTimes:
    """One rank's steps: ``begin()`` before it asks for its batch, ``end(step, input_s)`` after the step
    call. ``exchange_times``: the backend's own list of timed exchanges (or None), read by its growth."""

    def __init__(self, task, log_every, warmup_steps=0, exchange_times=None):
        self.task, self.log_every, self.warmup = task, max(1, int(log_every or 1)), warmup_steps
        self.exchanges = exchange_times
        self.durations, self.spans = [], []
        self.started = self.seen = None
        self.cpu_started = self.cpu_first = self.cpu_last = None

    def begin(self):
        self.started = time.time()
        self.cpu_started = time.process_time()
        self.seen = len(self.exchanges) if self.exchanges is not None else None

    def end(self, step, input_s=None):
        if self.started is None:
            return
        ended = time.time()
        exchange = sum(self.exchanges[self.seen:]) if self.seen is not None else None
        if step > self.warmup:
            self.durations.append(ended - self.started)
            if self.cpu_first is None:
                self.cpu_first = self.cpu_started
            self.cpu_last = time.process_time()
        if step % self.log_every == 0:
            self.spans.append([step, self.started, ended, input_s, exchange])
        self.started = None

    def cpu_per_step(self):
        """This process's CPU seconds (every thread) from the start of its first step after the
        warm-up to the end of its last, over those steps; None where it timed none itself."""
        if self.cpu_first is None or not self.durations:
            return None
        return max(0.0, self.cpu_last - self.cpu_first) / len(self.durations)

    def add(self, step, started, ended, input_s=None):
        """A step timed where it ran and reported here (TF2's PS: the worker's own clock, read back by
        the coordinator with the step's result). Its CPU is the worker's, not this process's: none
        is counted."""
        if step > self.warmup:
            self.durations.append(ended - started)
        self.spans.append([step, started, ended, input_s, None])

    def record(self):
        return {"task": self.task, "pid": os.getpid(), "host": socket.gethostname(),
                "step_s": quantiles(self.durations), "spans": self.spans, "cpu_s_per_step": self.cpu_per_step()}

    def save(self, train_dir):
        """Write ``ranks/<task>.json`` (``task``'s ':' made '-' for the file's name)."""
        if not train_dir:
            return
        folder = os.path.join(train_dir, RANKS_DIR)
        make_dirs(folder)
        write_atomic(os.path.join(folder, self.task.replace(":", "-") + ".json"), json.dumps(self.record()))
