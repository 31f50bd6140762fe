"""Bare MPI: the reference the Horovod trainer is measured against.

The same gradients, averaged by one ``MPI_Allreduce`` (mpi4py) on one fused
buffer per step: the MPI library does the reduction, nothing is hand-written,
and there is no negotiation, no fusion buffer, no background thread, no cycle
time. Whatever Horovod's machinery costs or saves in a real training loop is
the difference between this backend and ``horovod_train`` at the same flags.

The exchange runs inside the traced step as a ``tf.numpy_function`` (where
Horovod inserts its own op), so the loop, the step and the metrics are the very
ones the Horovod trainer uses (allreduce/sync_loop.py). The seconds spent inside
``Allreduce`` are counted, so the report can show the exchange it measured.
"""
import numpy as np

from allreduce.backend import ring_wire
from allreduce.mpi import MPIJob


# Why the step cannot be XLA-compiled: its exchange is a Python callback inside it.
JIT_REFUSAL = ("bare MPI all-reduces inside the training step through tf.numpy_function (mpi4py's "
               "Allreduce), a Python callback that XLA cannot compile; Horovod's XLA ops (a GPU build) "
               "are the all-reduce that runs inside a compiled step")


class MPIBackend(MPIJob):
    name = "mpi"
    mode = "sync"

    def jit_refusal(self):
        return JIT_REFUSAL

    def wire_bytes(self, sizes, plan):
        """Open MPI picks its own algorithm per size; the ring's volume is the lower bound shown.
        Embedding gradients are made dense before the fused buffer (the whole table is reduced)."""
        return ring_wire(sizes, self.world_size, sparse="dense")

    def average_gradients(self, grads):
        """Fuse every gradient into one buffer, all-reduce it once, split it back."""
        import tensorflow as tf
        if self.world_size == 1:
            return grads
        dense = [tf.convert_to_tensor(g) for g in grads]
        flat = tf.concat([tf.reshape(g, [-1]) for g in dense], 0)
        summed = tf.numpy_function(self.sum_buffer, [flat], flat.dtype, stateful=True, name="mpi_allreduce")
        summed = tf.ensure_shape(summed, flat.shape) / tf.cast(self.world_size, flat.dtype)
        parts = tf.split(summed, [int(np.prod(g.shape)) for g in dense])
        return [tf.reshape(p, g.shape) for p, g in zip(parts, dense)]

    def wrap_tape(self, tape):
        return _AveragingTape(tape, self)


class _AveragingTape:
    """A GradientTape whose ``gradient`` returns the all-ranks average (what Horovod's
    DistributedGradientTape does, with one MPI_Allreduce instead of Horovod's ops)."""

    def __init__(self, tape, backend):
        self._tape, self._backend = tape, backend

    def gradient(self, target, sources):
        return self._backend.average_gradients(self._tape.gradient(target, sources))
