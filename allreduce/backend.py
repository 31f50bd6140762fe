"""What the all-reduce methods share: the backend interface their loop calls (allreduce/sync_loop.py),
how a rank takes its share of the host, and the ring's wire rule.

``AllreduceBackend`` adds to ``common.trainer.backend.Backend`` what the all-reduce loops (allreduce/sync_loop.py,
horovod_train/elastic.py) need: where gradients are exchanged, broadcasts, metric reductions, the
divergence check, and the two points where a method that does not exchange every step (local SGD)
exchanges weights instead (``after_step``, ``consensus``).
"""
import contextlib
import os

from common.trainer.backend import Backend
from common.base.procs import host_cores


def yield_when_idle():
    """Open MPI's default for a job with no more ranks than cores is to spin while a rank waits
    in MPI. A training rank is not one thread: TensorFlow's threads compute while Horovod's
    background thread (or a blocking Allreduce) waits, so the spin takes the core the rank's own
    compute needs. Measured here (BENCHMARKS.md section 2, CNN batch 64, 2 ranks on 2 cores):
    Horovod 0.52x the bare-MPI reference spinning, 0.86x yielding. Called before MPI_Init; an
    explicit ``--mca mpi_yield_when_idle 0`` (or OMPI_MCA_mpi_yield_when_idle=0) still wins."""
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def place_rank(cfg, local_rank, local_size):
    """One GPU per process, or on CPU the host's cores split between its local ranks (instead of
    each starting a thread pool the size of the machine and fighting); returns the threads.
    The all-reduce trainers (Horovod and bare MPI) place their ranks alike."""
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    threads = cfg.threads_per_worker or max(1, host_cores() // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    return threads


class AllreduceBackend(Backend):
    """A method where every rank trains and gradients are averaged over all of them each step
    (Horovod, bare MPI, TensorFlow's MultiWorkerMirroredStrategy). ``threads`` is what
    ``place_rank`` gave this rank."""
    mode = "sync"
    threads = 0
    strategy_owns_variables = False     # True: they update only in a strategy's replica context

    def wrap_tape(self, tape):
        """The GradientTape whose ``gradient()`` returns gradients averaged over the ranks."""
        raise NotImplementedError

    def after_step(self, model, step, last):
        """Called after each training step (``step``: the updates done; ``last``: the run's final
        one): where a method that exchanges weights instead of gradients (local SGD) exchanges them.
        Nothing for a method whose gradients were exchanged inside the step."""

    def consensus(self, model):
        """A context in which ``model`` holds the weights every rank agrees on, for an evaluation
        between two exchanges of a method whose ranks drift apart between them (local SGD); the
        ranks' own weights come back after it. Nothing to do where every step keeps them equal."""
        return contextlib.nullcontext()

    def scope(self):
        """Where the model, optimizer and slots are created: a strategy's scope for a method whose
        variables the strategy owns (MultiWorkerMirroredStrategy), else nothing."""
        return contextlib.nullcontext()

    def distribute(self, step):
        """How one train step runs on this rank: as it is, or through a strategy's ``run``."""
        return step

    def distribute_dataset(self, make):
        """This rank's training batches, from ``make(worker_index, num_workers)``: the rank's own
        pipeline (Horovod and MPI: each rank reads its shard), or a strategy's distributed dataset."""
        return make(self.rank, self.world_size)

    def allreduce(self, value, name="metric", op="mean"):
        """A host value (float or array) averaged (``op="mean"``) or summed over the ranks."""
        raise NotImplementedError

    def broadcast_object(self, obj):
        """Rank 0's picklable ``obj`` on every rank."""
        raise NotImplementedError

    def broadcast_state(self, model, optimizer):
        """Rank 0's weights and optimizer slots on every rank (start and resume)."""
        raise NotImplementedError

    def max_divergence(self, model):
        """Largest difference of any trainable weight between ranks (0 when the exchange is exact)."""
        raise NotImplementedError

    def keras_callbacks(self):
        """Callbacks Keras ``fit`` needs for this method (``--loop fit``)."""
        return []

    def summary_extra(self):
        """Summary fields only this method measures (bare MPI: its exchange time)."""
        return {}

    def roster(self):
        """Every rank's host and pid (allreduce/roster.py), for a method whose ranks an MPI launcher
        starts and ends (Horovod, bare MPI): a survivor names a lost rank. None elsewhere."""
        return None


def ring_share(n):
    """Of every byte all-reduced, what each of n ranks sends (and receives) on a ring: 2(n-1)/n
    (a reduce-scatter and an all-gather of n-1 chunks of 1/n each). The one place the ring's
    volume is written: the trainers' wire rule, the per-link prediction and the time model use it."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


def ring_wire(sizes, workers, sparse="dense", scale=1.0):
    """Ring all-reduce: each worker sends (and receives) 2(n-1)/n of every dense tensor per step.

    Embedding tables (sparse gradients) go one of two ways: ``dense``, the whole table
    all-reduced like any tensor (bare MPI's fused buffer; Horovod's ``sparse_as_dense``), or
    ``allgather``, the slices of every worker gathered by every worker (Horovod's default for
    tf.IndexedSlices): a ring all-gather makes each worker send n-1 workers' slices.
    ``scale``: bytes per gradient byte on the wire (0.5 with fp16 compression)."""
    n = workers
    ring = ring_share(n)
    dense = sizes["dense_bytes"] + (sizes["sparse_table_bytes"] if sparse == "dense" else 0)
    total = ring * dense + (n - 1) * sizes["sparse_bytes"] * (sparse == "allgather")
    rule = "ring all-reduce: 2(n-1)/n x gradient bytes per worker"
    if sizes["sparse_table_bytes"]:
        rule += ("; embedding tables all-reduced dense" if sparse == "dense" else
                 "; embedding slices all-gathered: (n-1) x each worker's slices")
    return {"bytes_per_step_per_worker": int(scale * total), "wire_rule": rule}
