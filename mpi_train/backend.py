"""Bare MPI: the reference the Horovod trainer is measured against.

The same gradients, averaged by one ``MPI_Allreduce`` (mpi4py) on one fused
buffer per step: the MPI library does the reduction, nothing is hand-written,
and there is no negotiation, no fusion buffer, no background thread, no cycle
time. Whatever Horovod's machinery costs or saves in a real training loop is
the difference between this backend and ``horovod_train`` at the same flags.

The exchange runs inside the traced step as a ``tf.numpy_function`` (where
Horovod inserts its own op), so the loop, the step and the metrics are the very
ones the Horovod trainer uses (common/sync_loop.py). The seconds spent inside
``Allreduce`` are counted, so the report can show the exchange it measured.
"""
import os
import sys
import time

import numpy as np

from common.backend import AllreduceBackend, place_rank, ring_wire, yield_when_idle
from common.errors import UsageError
from common.plan import make_plan


def abort_on_exception(comm):
    """An exception nothing caught ends the whole job (MPI_Abort), as ``python -m mpi4py`` does: at a
    plain exit mpi4py's MPI_Finalize would wait for ranks blocked in a collective with this one."""
    previous = sys.excepthook

    def hook(*exc_info):
        previous(*exc_info)
        sys.stderr.flush()
        comm.Abort(1)
    sys.excepthook = hook


class MPIBackend(AllreduceBackend):
    name = "mpi"
    mode = "sync"

    def __init__(self):
        super().__init__()
        self.comm = self.MPI = None
        self.threads = None
        self.exchange_times = []           # wall time inside each gradient Allreduce, this rank
        self.warmup_steps = 0

    def setup(self, cfg):
        yield_when_idle()                    # MPI: as the Horovod trainer, before MPI_Init
        self.warmup_steps = cfg.warmup_steps
        from mpi4py import MPI               # MPI: MPI_Init_thread happens here
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        abort_on_exception(self.comm)
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self.is_chief = self.rank == 0
        self.threads = place_rank(cfg, self.local_rank, self.local_size)   # the Horovod trainer's rule
        return self

    def roster(self):
        from common.roster import Roster
        return Roster.gather(self.rank, self.comm.allgather)          # MPI: each rank's host and pid

    def plan(self, cfg, num_examples):
        """One step = one update averaging one batch from every rank (as Horovod)."""
        return make_plan(cfg, num_examples, self.world_size, batches_per_update=self.world_size)

    def wrap_optimizer(self, optimizer):
        raise UsageError("the mpi backend runs the custom loop only (Keras fit needs Horovod's "
                         "DistributedOptimizer)")

    def wire_bytes(self, sizes, plan):
        """Open MPI picks its own algorithm per size; the ring's volume is the lower bound shown.
        Embedding gradients are made dense before the fused buffer (the whole table is reduced)."""
        return ring_wire(sizes, self.world_size, sparse="dense")

    def shutdown(self, code=0):
        """MPI_Finalize runs at interpreter exit (mpi4py); nothing to leave before that."""

    def _sum_in_place(self, flat):
        """One MPI_Allreduce(SUM) on the fused gradient buffer (float32), timed."""
        out = np.empty_like(flat)
        t0 = time.perf_counter()
        self.comm.Allreduce(flat, out, op=self.MPI.SUM)
        self.exchange_times.append(time.perf_counter() - t0)
        return out

    def average_gradients(self, grads):
        """Fuse every gradient into one buffer, all-reduce it once, split it back."""
        import tensorflow as tf
        if self.world_size == 1:
            return grads
        dense = [tf.convert_to_tensor(g) for g in grads]
        flat = tf.concat([tf.reshape(g, [-1]) for g in dense], 0)
        summed = tf.numpy_function(self._sum_in_place, [flat], flat.dtype, stateful=True, name="mpi_allreduce")
        summed = tf.ensure_shape(summed, flat.shape) / tf.cast(self.world_size, flat.dtype)
        parts = tf.split(summed, [int(np.prod(g.shape)) for g in dense])
        return [tf.reshape(p, g.shape) for p, g in zip(parts, dense)]

    def wrap_tape(self, tape):
        return _AveragingTape(tape, self)

    def broadcast_state(self, model, optimizer):
        """Rank 0's weights and optimizer state everywhere (MPI_Bcast per variable)."""
        for v in list(model.variables) + list(optimizer.variables()):
            value = np.array(v.numpy(), order="C", ndmin=1)   # MPI buffers are at least 1-d
            self.comm.Bcast(value, root=0)
            v.assign(value.reshape(v.shape))

    def broadcast_object(self, obj):
        return self.comm.bcast(obj, root=0)

    def allreduce(self, value, name="metric", op="mean"):
        MPI = self.MPI
        arr = np.array(value, dtype=np.float64, order="C", ndmin=1)
        out = np.empty_like(arr)
        self.comm.Allreduce(arr, out, op={"mean": MPI.SUM, "sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op])
        out = out.reshape(np.shape(value))
        return out / self.world_size if op == "mean" else out

    def max_divergence(self, model):
        """Largest |w_rank - w_rank0| over the trainable weights and ranks: 0 when the ranks agree.

        Only what the all-reduce keeps equal: non-trainable state (BatchNormalization's
        moving statistics) is each rank's own, from its own batches, as under Horovod's
        DistributedOptimizer; rank 0's is what checkpoints and weights.npz hold."""
        worst = 0.0
        for w in model.trainable_weights:
            mine = np.array(w.numpy(), order="C", ndmin=1)
            ref = mine.copy()
            self.comm.Bcast(ref, root=0)
            if mine.size:
                worst = max(worst, float(np.max(np.abs(mine - ref))))
        return float(self.allreduce(worst, op="max"))

    def summary_extra(self):
        """Median seconds per gradient Allreduce on this rank after the warm-up steps (None if there
        was none): the measured exchange of the breakdown, taken like the step it is part of (the
        median step of the measured interval). The first Allreduces open the connections and would
        weigh on a mean."""
        times = self.exchange_times[self.warmup_steps:] or self.exchange_times
        seconds = float(np.median(times)) if times else None
        return {"exchange_s_per_step": seconds, "exchange_s": seconds}


class _AveragingTape:
    """A GradientTape whose ``gradient`` returns the all-ranks average (what Horovod's
    DistributedGradientTape does, with one MPI_Allreduce instead of Horovod's ops)."""

    def __init__(self, tape, backend):
        self._tape, self._backend = tape, backend

    def gradient(self, target, sources):
        return self._backend.average_gradients(self._tape.gradient(target, sources))


def mpi_env_check():
    """mpi4py under a launcher that is not MPI's starts a world of 1 silently; say so instead."""
    if os.environ.get("HOROVOD_RANK") is not None and os.environ.get("OMPI_COMM_WORLD_SIZE") is None:
        raise UsageError("the mpi backend needs mpirun (or srun with PMIx), not horovodrun's Gloo launcher")
