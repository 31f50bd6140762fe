"""Local SGD (Lin, Stich, Patel and Jaggi, "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020):
each rank applies its own gradient to its own copy of the model, and every ``k`` steps the ranks
average their weights with one ``MPI_Allreduce`` of one fused buffer (allreduce/mpi.py).

It trades how often the ranks exchange against how far their models drift apart between two
exchanges: k = 1 is the synchronous ring (with plain or momentum SGD the averaged weights are the
ones the averaged gradient gives), larger k sends 1/k of the ring's bytes per step. The loop, the
books and the metrics are the other all-reduce trainers' (allreduce/sync_loop.py); this backend
only says where the exchange happens: after the step (``after_step``), not inside it.
"""
import contextlib

import numpy as np

from allreduce.backend import ring_wire
from allreduce.mpi import MPIJob


class LocalSGDBackend(MPIJob):
    name = "localsgd"

    def __init__(self, local_steps):
        super().__init__()
        self.local_steps = local_steps
        self.mode = str(local_steps)       # the run's mode is its k: 'localsgd:8' in --backends
        self.in_step = True                # the ranks hold the same weights (after the start's broadcast)
        self._averagings = {}              # traced weight averagings, by the reduction they call

    def wrap_tape(self, tape):
        return tape                        # local SGD: each rank steps on its own gradient

    def wire_bytes(self, sizes, plan):
        """The weights (as many bytes as the dense gradient, embedding tables whole) all-reduced on a
        ring once every k steps."""
        wire = ring_wire(sizes, self.world_size, sparse="dense", scale=1.0 / self.local_steps)
        wire["wire_rule"] = (f"local SGD: the weights all-reduced every k = {self.local_steps} steps: "
                             "2(n-1)/n x weight bytes / k per step per worker")
        return wire

    def after_step(self, model, step, last):
        """Every k-th step, and the run's last (so the model it ends with is the ranks' average), the
        weights are averaged; in between each rank keeps its own."""
        if self.world_size > 1 and (step % self.local_steps == 0 or last):
            self._averaging(model, self.sum_buffer)()
            self.in_step = True
        else:
            self.in_step = self.world_size == 1

    @contextlib.contextmanager
    def consensus(self, model):
        """An evaluation between two averagings evaluates the average, as the paper does, and the
        ranks then go on from their own weights: the training is not changed by being looked at."""
        if self.in_step:
            yield
            return
        own = [w.numpy() for w in model.trainable_weights]
        self._averaging(model, self._sum_untimed)()
        try:
            yield
        finally:
            for w, value in zip(model.trainable_weights, own):
                w.assign(value)

    def _sum_untimed(self, flat):
        """An evaluation's averaging: not the run's exchange, so not in ``exchange_times``."""
        out = np.empty_like(flat)
        self.comm.Allreduce(flat, out, op=self.MPI.SUM)
        return out

    def _averaging(self, model, reduce):
        """A traced function that replaces ``model``'s trainable weights by the ranks' average: one fused
        float32 buffer, summed by ``reduce`` (one MPI_Allreduce), divided, split back and assigned in
        the graph, as the bare-MPI trainer averages its gradients (one traced call, not a Python
        round trip per variable)."""
        key = reduce.__name__
        if key not in self._averagings:
            import tensorflow as tf
            weights = list(model.trainable_weights)
            sizes = [int(np.prod(w.shape)) for w in weights]

            def average():
                flat = tf.concat([tf.reshape(tf.cast(w, tf.float32), [-1]) for w in weights], 0)
                summed = tf.numpy_function(reduce, [flat], tf.float32, stateful=True, name="localsgd_allreduce")
                mean = tf.ensure_shape(summed, flat.shape) / float(self.world_size)
                for w, part in zip(weights, tf.split(mean, sizes)):
                    w.assign(tf.cast(tf.reshape(part, w.shape), w.dtype))
            self._averagings[key] = tf.function(average, autograph=False)
        return self._averagings[key]

    def summary_extra(self):
        """The measured exchange per step: the median averaging after the warm-up's, over the k steps
        it serves."""
        times = self.exchange_times[-(-self.warmup_steps // self.local_steps):] or self.exchange_times
        seconds = float(np.median(times)) / self.local_steps if times else None
        return {"exchange_s_per_step": seconds, "exchange_s": seconds, "averagings": len(self.exchange_times)}
