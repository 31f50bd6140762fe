"""A job of ranks joined by mpi4py's COMM_WORLD: what every trainer that exchanges through plain MPI
calls shares (the bare-MPI reference, local SGD).

It joins the world, splits the host's cores between its local ranks as the Horovod trainer does,
broadcasts rank 0's state, reduces metrics and times every exchange it makes with one
``MPI_Allreduce`` on one fused float32 buffer: the MPI library does the reduction, nothing is
hand-written. What a method exchanges, and when, is its own package's.
"""
import os
import sys
import time

import numpy as np

from allreduce.backend import AllreduceBackend, place_rank, yield_when_idle
from allreduce.roster import Roster
from common.base.errors import UsageError
from common.spec.plan import make_plan


def abort_on_exception(comm):
    """An exception nothing caught ends the whole job (MPI_Abort), as ``python -m mpi4py`` does: at a
    plain exit mpi4py's MPI_Finalize would wait for ranks blocked in a collective with this one."""
    previous = sys.excepthook

    def hook(*exc_info):
        previous(*exc_info)
        sys.stderr.flush()
        comm.Abort(1)
    sys.excepthook = hook


def mpi_env_check(name):
    """mpi4py under a launcher that is not MPI's starts a world of 1 silently; say so instead."""
    if os.environ.get("HOROVOD_RANK") is not None and os.environ.get("OMPI_COMM_WORLD_SIZE") is None:
        raise UsageError(f"the {name} backend needs mpirun (or srun with PMIx), not horovodrun's Gloo launcher")


class MPIJob(AllreduceBackend):
    """The ranks of one mpirun (or srun) line, with mpi4py. ``exchange_times``: the wall time of every
    exchange this rank made through ``sum_buffer``, the breakdown's measured exchange."""
    mode = "sync"

    def __init__(self):
        super().__init__()
        self.comm = self.MPI = None
        self.threads = None
        self.exchange_times = []
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
        return Roster.gather(self.rank, self.comm.allgather)          # MPI: each rank's host and pid

    def plan(self, cfg, num_examples):
        """One step = one update averaging one batch from every rank (as Horovod)."""
        return make_plan(cfg, num_examples, self.world_size, batches_per_update=self.world_size)

    def wrap_optimizer(self, optimizer):
        raise UsageError(f"the {self.name} backend runs the custom loop only (Keras fit needs Horovod's "
                         "DistributedOptimizer)")

    def shutdown(self, code=0):
        """MPI_Finalize runs at interpreter exit (mpi4py); nothing to leave before that."""

    def sum_buffer(self, flat):
        """One MPI_Allreduce(SUM) of a fused float32 buffer, timed into ``exchange_times``."""
        out = np.empty_like(flat)
        t0 = time.perf_counter()
        self.comm.Allreduce(flat, out, op=self.MPI.SUM)
        self.exchange_times.append(time.perf_counter() - t0)
        return out

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

        Only what the exchange keeps equal: non-trainable state (BatchNormalization's
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
        """Median seconds per exchange on this rank after the warm-up (None if there was none): the
        measured exchange of the breakdown, taken like the step it is part of (the median step of the
        measured interval). The first exchanges open the connections and would weigh on a mean."""
        times = self.exchange_times[self.warmup_steps:] or self.exchange_times
        seconds = float(np.median(times)) if times else None
        return {"exchange_s_per_step": seconds, "exchange_s": seconds}
