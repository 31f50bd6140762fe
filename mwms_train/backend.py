"""TensorFlow's own all-reduce: MultiWorkerMirroredStrategy behind the common all-reduce interface.

One task per worker, each with a copy of every variable (``MirroredVariable``); the
gradients are summed across the workers by the strategy's collective all-reduce inside
``optimizer.apply_gradients``, over gRPC between hosts (``--implementation ring``, or
``auto``; ``nccl`` on GPUs), packed into messages of ``--pack_size_mb``. Nothing here
reduces a tensor itself: the loop (allreduce/sync_loop.py) runs its usual step through
``strategy.run`` and the strategy does the exchange, as TensorFlow's multi-worker custom
training loop tutorial does.

Host-side values (the logged loss, evaluation sums, rank 0's state at a resume) go through
the same strategy's replica-context collectives (``all_reduce``, ``all_gather``).

Faults: TensorFlow does not recover a lost worker in this strategy (no elastic mode, no
re-formed ring); a collective waiting for a dead peer fails after ``--step_timeout``
seconds (``CommunicationOptions.timeout_seconds``), so the job ends in bounded time with
one line, and ``--resume`` continues from rank 0's latest checkpoint.
"""
import contextlib
import os
import pickle
import socket

import numpy as np

from allreduce.backend import AllreduceBackend, place_rank, ring_wire
from common.base.errors import RunError, UsageError, describe
from common.launch.hosts import parse_address
from tf_cluster.spec import parse_tf_config, tf_config_of, validate_cluster
from common.spec.plan import make_plan
from common.trainer.watchdog import OutsideDeadline
from common.base.flags import check_finite
from tf_cluster.listen import choose_address, restrict_listening
from common.base.procs import wait_for_ports

IMPLEMENTATIONS = ("ring", "auto", "nccl")
# Why the step cannot be XLA-compiled: the strategy's all-reduce runs inside it, across processes.
# TensorFlow 2.21 on CPU: "Collectives are not yet implemented for CPU devices when compiling with XLA"
# (UnimplementedError at the first step); XLA's GPU collectives are not tried here (no GPU).
JIT_REFUSAL = ("MWMS all-reduces inside the training step with TensorFlow's collective all-reduce, and "
               "TensorFlow's XLA has no collectives for CPU devices (\"Collectives are not yet implemented "
               "for CPU devices when compiling with XLA\")")


class MWMSBackend(AllreduceBackend):
    """Worker ``index`` of ``cluster`` ({"worker": [host:port, ...]}, or None: one process on its
    own); rank 0 writes."""
    name = "mwms"
    mode = "sync"
    strategy_owns_variables = True

    def jit_refusal(self):
        return JIT_REFUSAL

    def __init__(self, cluster, index, implementation="ring", pack_size_mb=0.0, step_timeout=60.0,
                 startup_timeout=60.0):
        super().__init__()
        if implementation not in IMPLEMENTATIONS:
            raise UsageError(f"--implementation {implementation}: expected one of {', '.join(IMPLEMENTATIONS)}")
        self.cluster, self.rank = cluster, index
        self.world_size = len(cluster["worker"]) if cluster else 1
        self.is_chief = index == 0
        self.address = cluster["worker"][index] if cluster else None
        self.local_rank, self.local_size = self._local_place() if cluster else (0, 1)
        self.implementation, self.pack_bytes = implementation, int(pack_size_mb * (1 << 20))
        self.step_timeout, self.startup_timeout = step_timeout, startup_timeout
        self.strategy = None
        self._fns = {}

    def _local_place(self):
        """(this task's index among the tasks on its host, how many there are): the core split."""
        host = lambda addr: parse_address(addr, "worker")[0]       # noqa: E731
        mine = host(self.address)
        same = [i for i, a in enumerate(self.cluster["worker"]) if host(a) == mine]
        return same.index(self.rank), len(same)

    def setup(self, cfg):
        """Threads first (TensorFlow's context is configured once), then the strategy, which starts
        this task's gRPC server and waits for its peers."""
        import tensorflow as tf
        self.threads = place_rank(cfg, self.local_rank, self.local_size)   # the Horovod trainer's rule
        impl = {"ring": tf.distribute.experimental.CommunicationImplementation.RING,
                "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}[self.implementation]
        if impl == tf.distribute.experimental.CommunicationImplementation.NCCL and \
                not tf.config.list_physical_devices("GPU"):
            raise UsageError("--implementation nccl needs GPUs; this machine has none (use ring or auto)")
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=self.pack_bytes, timeout_seconds=self.step_timeout, implementation=impl)
        resolver = None if self.cluster is None else tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.cluster), task_type="worker", task_id=self.rank, rpc_layer="grpc")
        # The strategy's join waits inside TensorFlow, GIL held, for a peer that may never start:
        # bounded by --startup_timeout from a watcher process (common/trainer/watchdog.py)
        with OutsideDeadline(self.startup_timeout if self.world_size > 1 else 0, self._never_joined):
            try:
                self.strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                                          communication_options=options)
            except (tf.errors.OpError, ValueError, RuntimeError) as exc:
                raise RunError(f"worker {self.rank}: cannot join the cluster: {describe(exc)}")
            if self.world_size > 1:      # the strategy would wait without limit for a peer that never comes
                wait_for_ports([a for i, a in enumerate(self.cluster["worker"]) if i != self.rank],
                               self.startup_timeout, "worker")
        return self

    def _never_joined(self):
        """The watcher's line: which peers accept no connection (checked when the time is up)."""
        missing = []
        for i, address in enumerate(self.cluster["worker"]):
            if i == self.rank:
                continue
            host, port = parse_address(address, "worker")
            try:
                socket.create_connection((host, port), timeout=1).close()
            except OSError:
                missing.append(f"worker:{i} ({address})")
        who = ", ".join(missing) if missing else "a peer"
        return (f"worker {self.rank}: the cluster did not come up within --startup_timeout "
                f"{self.startup_timeout:g} s: {who} never joined")

    def plan(self, cfg, num_examples):
        """One step = one update averaging one batch from every worker (as Horovod)."""
        return make_plan(cfg, num_examples, self.world_size, batches_per_update=self.world_size)

    @contextlib.contextmanager
    def scope(self):
        """The strategy's scope, where a model's averaged statistics (BatchNormalization's moving mean
        and variance: sync-on-read, ``aggregation=MEAN``) are made ``ONLY_FIRST_REPLICA``: each worker
        keeps its own, as each Horovod rank does, and the chief's are the ones checkpointed and
        written. With MEAN, every read outside a step is an all-reduce every worker must join, and
        the chief reads alone (a checkpoint, its weights): the workers' collectives would pair with
        different tensors and the job would fail at its first checkpoint. Either way a step updates
        its own worker's copy and sends nothing."""
        import tensorflow as tf

        def own_statistics(next_creator, **kwargs):
            if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ and \
                    kwargs.get("aggregation") == tf.VariableAggregation.MEAN:
                kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
            return next_creator(**kwargs)
        with self.strategy.scope(), tf.variable_creator_scope(own_statistics):
            yield

    def distribute(self, step):
        """The step runs on this worker's replica; ``apply_gradients`` sums the gradients over the
        workers (the collective all-reduce), which the tape has already divided by their number."""
        strategy = self.strategy

        def run(x, y):
            return strategy.experimental_local_results(strategy.run(step, args=(x, y)))[0]
        return run

    def distribute_dataset(self, make):
        """``distribute_datasets_from_function``, as TensorFlow's strategies take input: the strategy
        calls ``make`` with this worker's InputContext (its input pipeline id is the worker's index)
        and prefetches the batches to the worker's device. ``make`` shards as every method does, so
        the strategy shards nothing more."""
        # .repeat(): an infinite dataset, as Keras' fit gives it; the loop takes the plan's steps. A finite
        # one makes the strategy's iterator all-reduce "has a batch" among the workers before every step
        # (get_next_as_optional, always on across workers), a collective per step for the input alone.
        return self.strategy.distribute_datasets_from_function(
            lambda ctx: make(ctx.input_pipeline_id, ctx.num_input_pipelines).repeat())

    def wrap_tape(self, tape):
        return _ScaledTape(tape, self.world_size)

    def wrap_optimizer(self, optimizer):
        raise UsageError("the mwms backend runs the custom loop only (--loop custom)")

    def wire_bytes(self, sizes, plan):
        """A ring of gRPC messages: 2(n-1)/n of the dense gradient per worker; embedding gradients
        (tf.IndexedSlices) are all-gathered by the strategy, as Horovod does by default."""
        return ring_wire(sizes, self.world_size, sparse="allgather")

    # ----------------------------------------------------- host values, through the strategy
    def _collective(self, array, how):
        """``how`` ("sum" or "gather") of a float64 array over the workers, as NumPy. One traced
        function per kind (a new shape retraces once), so a logged loss costs a collective, not a trace."""
        import tensorflow as tf
        if how not in self._fns:
            strategy = self.strategy

            def replica(value):
                value = tf.identity(value)        # on this replica's device: the collective's destination
                ctx = tf.distribute.get_replica_context()
                if how == "sum":
                    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)
                return ctx.all_gather(tf.expand_dims(value, 0), axis=0)
            self._fns[how] = tf.function(lambda value: strategy.experimental_local_results(
                strategy.run(replica, args=(value,)))[0], autograph=False)
        try:
            return self._fns[how](tf.constant(np.asarray(array, dtype=np.float64))).numpy()
        except tf.errors.OpError as exc:
            raise RunError(f"worker {self.rank}: a collective with the other workers failed "
                           f"(a worker lost?): {describe(exc)}")

    def allreduce(self, value, name="metric", op="mean"):
        arr = np.array(value, dtype=np.float64, ndmin=1)
        if op in ("sum", "mean"):
            out = self._collective(arr, "sum")
            out = out / self.world_size if op == "mean" else out
        else:
            gathered = self._collective(arr, "gather")
            out = gathered.max(axis=0) if op == "max" else gathered.min(axis=0)
        return out.reshape(np.shape(value))

    def _from_rank_0(self, array):
        """Rank 0's float64 array on every worker: a sum to which only rank 0 adds anything."""
        arr = np.asarray(array, dtype=np.float64)
        return self._collective(arr if self.is_chief else np.zeros_like(arr), "sum")

    def broadcast_object(self, obj):
        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if self.is_chief else np.zeros(0, np.uint8)
        size = int(self._from_rank_0([data.size])[0])
        payload = np.zeros(size, np.float64)
        payload[:data.size] = data
        return pickle.loads(self._from_rank_0(payload).astype(np.uint8).tobytes())

    def broadcast_state(self, model, optimizer):
        """Rank 0's weights and optimizer state everywhere, in one collective on a fused buffer (the
        strategy already starts every worker from rank 0's initial values; this carries a restored
        checkpoint over)."""
        variables = list(model.variables) + list(optimizer.variables())
        values = [np.asarray(v.numpy(), dtype=np.float64).ravel() for v in variables]
        flat = self._from_rank_0(np.concatenate(values) if values else np.zeros(0))
        at = 0
        for v, old in zip(variables, values):
            v.assign(flat[at:at + old.size].reshape(v.shape).astype(v.dtype.as_numpy_dtype))
            at += old.size

    def max_divergence(self, model):
        """Largest |w_rank - w_rank0| over the trainable weights: 0 when the all-reduce kept them equal."""
        mine = np.concatenate([np.asarray(w.numpy(), dtype=np.float64).ravel() for w in model.trainable_weights])
        ref = self._from_rank_0(mine)
        worst = float(np.max(np.abs(mine.astype(np.float32) - ref.astype(np.float32)))) if mine.size else 0.0
        return float(self.allreduce(worst, op="max"))

    def summary_extra(self):
        return {"mwms_implementation": self.implementation, "mwms_pack_bytes": self.pack_bytes}


class _ScaledTape:
    """Gradients divided by the number of workers, so the strategy's sum in ``apply_gradients``
    is their average (the loss is each worker's batch mean, as in the other trainers)."""

    def __init__(self, tape, workers):
        self._tape, self._workers = tape, workers

    def gradient(self, target, sources):
        import tensorflow as tf
        out = []
        for g in self._tape.gradient(target, sources):
            if isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values / self._workers, g.indices, g.dense_shape))
            else:
                out.append(None if g is None else g / self._workers)
        return out




def add_mwms_args(parser):
    g = parser.add_argument_group("MultiWorkerMirroredStrategy")
    g.add_argument("--worker_hosts", default=None,
                   help="comma-separated host:port of every worker task (or TF_CONFIG's cluster)")
    g.add_argument("--task_index", type=int, default=None, help="this task's index in --worker_hosts (or TF_CONFIG)")
    g.add_argument("--implementation", choices=IMPLEMENTATIONS, default="ring",
                   help="the collective all-reduce: ring (gRPC, the default), auto (TensorFlow picks), "
                        "nccl (GPUs)")
    g.add_argument("--pack_size_mb", type=float, default=0.0,
                   help="gradients are all-reduced in packs of this size (CommunicationOptions.bytes_per_pack; "
                        "0: TensorFlow decides)")
    g.add_argument("--bind", default="auto",
                   help="address this task's gRPC server listens on: auto = its own cluster address when that is "
                        "an address of this machine, else every interface; an IP; or 0.0.0.0")
    parser.bound("pack_size_mb", 0, 1 << 20)
    return parser


def check_mwms_flags(args):
    """The flags that do not depend on the cluster (the local launcher checks them once, too)."""
    check_finite("pack_size_mb", args.pack_size_mb)
    if not 0 <= args.pack_size_mb <= 1 << 20:
        raise UsageError(f"--pack_size_mb must be in [0, {1 << 20}], got {args.pack_size_mb}")


def resolve_workers(args, environ):
    """(cluster or None, this task's index) from --worker_hosts/--task_index or TF_CONFIG; None:
    nothing given, one process on its own. An all-reduce cluster has worker tasks only."""
    check_mwms_flags(args)
    tf_config = tf_config_of(environ)            # its own, or its JobSet pod's (tf_cluster/jobset.py)
    if tf_config:
        cluster, role, index = parse_tf_config(tf_config, need_ps=False)
        if set(cluster) != {"worker"}:
            raise UsageError(f"TF_CONFIG: MultiWorkerMirroredStrategy takes worker tasks only, got "
                             f"{', '.join(sorted(cluster))}")
        flags = args.worker_hosts and [a.strip() for a in args.worker_hosts.split(",")]
        if flags and flags != cluster["worker"]:
            raise UsageError(f"--worker_hosts {args.worker_hosts} conflicts with TF_CONFIG ({','.join(cluster['worker'])})")
        if args.task_index is not None and args.task_index != index:
            raise UsageError(f"--task_index={args.task_index} conflicts with TF_CONFIG task index {index}")
        return cluster, index
    if args.worker_hosts is None:
        if args.task_index not in (None, 0):
            raise UsageError("--task_index needs --worker_hosts (or TF_CONFIG)")
        return None, 0
    items = [a.strip() for a in args.worker_hosts.split(",")]
    if any(not a for a in items):
        raise UsageError(f"--worker_hosts: empty host in {args.worker_hosts!r} (expected host:port,host:port)")
    cluster = validate_cluster({"worker": items}, "--worker_hosts", need_ps=False)
    index = 0 if args.task_index is None else args.task_index
    if not 0 <= index < len(items):
        raise UsageError(f"--task_index {index} out of range (0..{len(items) - 1})")
    return cluster, index


def listen_on_own_address(address, bind, who):
    """This task's gRPC server (started by the strategy, on every interface by TensorFlow's
    default) binds its own cluster address instead: the PS tasks' rule (tf_cluster/listen.py), which
    may re-execute the process with the bind shim. Already in place under the local launcher,
    whose tasks inherit a loopback-only environment."""
    if address is None:
        return
    host, port = parse_address(address, who)
    ip, note = choose_address(host, bind)
    if note:
        print(f"{who}: {note}", flush=True)
    if ip is not None and os.environ.get("HVDPS_BIND_ADDR") == ip:
        return
    restrict_listening(ip, port, who)
