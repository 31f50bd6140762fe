"""The interfaces the trainers use, and nothing more.

``Backend`` is what every loop and the bookkeeper (common/bookkeeper.py) call;
``AllreduceBackend`` adds what the all-reduce loops (common/sync_loop.py,
horovod_train/elastic.py) need: where gradients are exchanged, broadcasts,
metric reductions and the divergence check. Anything else a method needs (the
PS device setter and gRPC server, Horovod's elastic state) lives in that
backend's own package and is marked ``# Horovod:`` or ``# PS:`` where its main
calls it. This module imports no backend: each main constructs its own, and
the application tier (``hvdps/``) maps backend names to launchers.
"""

import os


# A trainable variable larger than this is split over the PS tasks along its first axis, into
# ceil(bytes / MIN_SHARD_BYTES) shards, at most one per task, by the same rule under both PS APIs
# (TF1's min_max_variable_partitioner; TF2's MinSizePartitioner is built on it). Small enough
# that the MLP's 4 KB hidden bias is split too: left whole, it sits on top of one task's 1/k of the
# kernels (4 tasks: 79,872 bytes against 76,810 for an even split), and with k tasks that one task's
# link carries 4% more than n x M / k per round. Split, every task holds within 0.1% of M / k.
MIN_SHARD_BYTES = 1 << 10

def yield_when_idle():
    """Open MPI's default for a job with no more ranks than cores is to spin while a rank waits
    in MPI. A training rank is not one thread: TensorFlow's threads compute while Horovod's
    background thread (or a blocking Allreduce) waits, so the spin takes the core the rank's own
    compute needs. Measured here (BENCHMARKS.md section 4a, CNN batch 64, 2 ranks on 2 cores):
    Horovod 0.52x the bare-MPI reference spinning, 0.86x yielding. Called before MPI_Init; an
    explicit ``--mca mpi_yield_when_idle 0`` (or OMPI_MCA_mpi_yield_when_idle=0) still wins."""
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


def place_rank(cfg, local_rank, local_size):
    """One GPU per process, or on CPU the host's cores split between its local ranks (instead of
    each starting a thread pool the size of the machine and fighting); returns the threads.
    The all-reduce trainers (Horovod and bare MPI) place their ranks alike."""
    import tensorflow as tf
    from common.procs import host_cores
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    threads = cfg.threads_per_worker or max(1, host_cores() // local_size)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    return threads


class Backend:
    """A distribution method as a training loop sees it.

    ``setup()`` joins the job and fills rank / world_size / is_chief; ``plan()``
    says what one update means for this method; ``wrap_optimizer()`` is where
    gradients start to be exchanged; ``shutdown()`` leaves the job.
    """
    name = "base"
    mode = "sync"
    num_ps = 0

    def __init__(self):
        self.rank, self.world_size, self.is_chief = 0, 1, True

    def setup(self, cfg):
        raise NotImplementedError

    def plan(self, cfg, num_examples):
        """The RunPlan (common.plan) of this run: steps, updates and samples per update."""
        raise NotImplementedError

    def wrap_optimizer(self, optimizer):
        raise NotImplementedError

    def wire_bytes(self, sizes, plan):
        """What one step puts on the network, by this method's algorithm and the gradient's
        measured sizes (``common.models.gradient_sizes``): ``{"bytes_per_step_per_worker": ...,
        "bytes_per_update_per_ps": ..., "wire_rule": "..."}``. One rule per method, in this
        module, for every backend alike."""
        return {}

    def gradient_bytes(self, model):
        """Bytes of one gradient as this method sends it (the summary's ``grad_bytes_per_step``)."""
        from common.models import gradient_bytes
        return gradient_bytes(model)

    def shutdown(self, code=0):
        """Leave the job; ``code`` is the trainer's result (the PS chief passes it on to the PS tasks)."""


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

    def scope(self):
        """Where the model, optimizer and slots are created: a strategy's scope for a method whose
        variables the strategy owns (MultiWorkerMirroredStrategy), else nothing."""
        import contextlib
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
        """Every rank's host and pid (common/roster.py), for a method whose ranks an MPI launcher
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


def ps_wire(sizes, plan, num_ps):
    """Parameter servers: a worker pushes its gradient and pulls the weights every batch; a PS
    task carries its share of that for every batch that makes an update (even sharding). An
    embedding table moves only the rows a batch looks up, both ways: the ids and the gathered
    rows out, the ids and the rows' gradients in (tf.IndexedSlices, duplicates included)."""
    per_batch = 2 * (sizes["dense_bytes"] + sizes["sparse_bytes"])
    rule = "PS: push gradient + pull weights per worker batch; a PS task carries 1/num_ps of it per batch in an update"
    if sizes["sparse_table_bytes"]:
        rule += "; embedding tables: only the looked-up rows and their ids, both ways"
    return {"bytes_per_step_per_worker": int(per_batch),
            "bytes_per_update_per_ps": int(per_batch * plan.batches_per_update / max(1, num_ps)),
            "wire_rule": rule}
