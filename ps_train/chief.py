"""The chief's bookkeeping: which workers are alive, evaluation, and the orderly finish.

The chief sees every worker only through the step counters on the PS
(ps_train.graph): a worker whose counter has not moved for a while is lost.
Async training goes on without it and reports it; sync training cannot
(SyncReplicasOptimizer would either stall or let a survivor fill the dead
worker's slots, depending on timing), so there a lost worker is an error
after --step_timeout, whichever of the two happens.
"""
import statistics
import time

from common.base.errors import RunError
from common.base.procs import port_open
from common.model.evaluation import finish_eval

ASYNC_LOST_AFTER = 10.0   # seconds without a step before an async worker is reported lost


class WorkerTracker:
    def __init__(self, names, sync, step_timeout):
        self.names = names
        self.sync = sync
        self.lost_after = step_timeout if sync else ASYNC_LOST_AFTER
        self._last_change = {}    # rank -> (count, monotonic time it last changed)

    def update(self, counts, done=None):
        """Names of the workers whose counter has been still for too long (finished ones excluded)."""
        now = time.monotonic()
        lost = []
        for rank, count in enumerate(counts):
            previous = self._last_change.get(rank)
            if previous is None or previous[0] != count:
                self._last_change[rank] = (count, now)
            elif now - previous[1] > self.lost_after and not (done is not None and done[rank]):
                lost.append(self.names[rank])
        if lost and self.sync:
            raise RunError(self._sync_lost(lost))
        return lost

    def gone(self, others):
        """[(name, address)] of the other workers -> a sync-lost message for those not listening."""
        lost = [name for name, address in others if not port_open(address)]
        return self._sync_lost(lost) if lost else None

    def _sync_lost(self, lost):
        return (f"{', '.join(lost)} made no step for {self.lost_after:g}s (sync mode needs every worker; "
                f"--step_timeout): stopping")

    def wait_for_finish(self, read, graph, kick, grace=60.0):
        """Before the PS tasks go away, let every live worker finish its last step.

        Returns the workers that were lost (never marked done and stopped moving).
        """
        deadline = time.monotonic() + grace
        self.sync = False        # training is over: a worker that stopped is reported, not fatal
        while True:
            kick()
            done = read(graph.worker_done)
            lost = self.update(read(graph.worker_steps), done)
            pending = [n for rank, n in enumerate(self.names) if not done[rank] and n not in lost]
            if not pending or time.monotonic() > deadline:
                return lost
            time.sleep(0.2)


class WaitMeter:
    """Seconds a sync worker step waited for its token, per logging interval (ps_train.graph).

    Fed the PS's cumulative per-worker wait and step counters at every log; as
    the throughput meter, it skips the warm-up and keeps one mean per interval,
    so the breakdown's wait is a median over the same intervals as its step.
    """

    def __init__(self, warmup_steps):
        self.warmup_steps = warmup_steps
        self.means = []
        self._mark = None            # (total wait, total steps) at the start of the interval

    def update(self, update, waits, counts):
        """The mean wait per worker step over the interval just closed, or None."""
        if update < self.warmup_steps:
            return None
        mark, self._mark = self._mark, (float(sum(waits)), int(sum(counts)))
        if mark is None:
            return None
        waited, steps = self._mark[0] - mark[0], self._mark[1] - mark[1]
        if steps <= 0 or waited < 0:  # nothing ran, or a restarted chief zeroed the sums
            return None
        self.means.append(waited / steps)
        return self.means[-1]

    def median(self):
        return statistics.median(self.means) if self.means else None


def evaluate(read, graph, progress=None):
    """(test loss, test accuracy) of the current PS variables over the whole test set; ``progress``
    called after each batch."""
    import tensorflow as tf
    read(graph.eval_init)
    total = [0.0, 0.0, 0.0]
    while True:
        try:
            part = read(graph.eval_sums)
        except tf.errors.OutOfRangeError:
            break
        total = [a + b for a, b in zip(total, part)]
        if progress:
            progress()
    return finish_eval(total)
