"""TensorFlow 2's parameter servers: ParameterServerStrategy + ClusterCoordinator (``--ps_api v2``).

The other PS implementation in this package (the default, ``--ps_api v1``) is
TensorFlow 1's between-graph replication, where every worker runs its own
training loop. Here, as TensorFlow 2 and Kubeflow's TFJob examples do it, the
**chief is a coordinator that does not train**: it builds the model under the
strategy (variables on the PS tasks, large ones split over them by a
partitioner) and schedules each training step as a function on whichever
worker is free; worker and PS tasks only run a gRPC server. Updates are
asynchronous (TensorFlow 2 has no synchronous PS): one step is one worker
batch and one update of the weights, exactly as in the classic async mode, so
the two are compared on the same plan (common/spec/plan.py).

Launch per role; the chief is a task of its own:

    python ps_train/main.py --ps_api v2 --job_name=ps     --task_index=0 $HOSTS
    python ps_train/main.py --ps_api v2 --job_name=worker --task_index=0 $HOSTS   # and 1, ...
    python ps_train/main.py --ps_api v2 --job_name=chief  --task_index=0 $HOSTS
      HOSTS='--ps_hosts=p:2222 --worker_hosts=w1:2222,w2:2222 --chief_host=c:2222'

or with TF_CONFIG holding a "chief" (a TFJob), or every role on this machine:

    hvdps launch ps --ps_api v2 --num_ps 2 --num_workers 2

Faults, as TensorFlow 2 defines them (GRPC_FAIL_FAST=use_caller): a lost
worker's scheduled steps are retried on the others and training finishes
(the chief names the worker); a lost PS ends the job with one line; a lost
chief ends it too (the servers give up after --startup_timeout). Either way
``--resume`` continues from the latest checkpoint. Worker and PS tasks leave
by themselves when the chief releases them (ps_train/stop.py): no
``server.join()`` that never returns.
"""
import collections
import gc
import os
import sys
import time


from common.trainer.backend import MIN_SHARD_BYTES, Backend
from common.inputs.data import input_failure, input_wait, make_dataset, num_examples
from common.base.errors import RunError, UsageError, describe, say_first
from ps_train.stop import hard_exit
from tf_cluster.listen import listen_only_on
from common.launch.hosts import parse_address
from common.model.models import build_model, make_optimizer, train_step_fn
from common.spec.plan import make_plan
from common.model.probe import compute_step_time
from common.base.procs import port_open, wait_for_ports
from common.trainer.bookkeeper import Adapter, Bookkeeper
from common.model.evaluation import eval_sums, finish_eval
from common.model.optim import make_lr_schedule
from common.trainer.steptimes import StepTimes
from common.trainer.run_dir import check_resume_compatible, check_train_dir, refuse_finished
from common.trainer.runlog import RunLog
from common.trainer.watchdog import Watchdog
from ps_train.backend import check_port_free, describe_placement, ps_wire, shard_bytes
from ps_train import stop
from ps_train.v2_checkpoints import MirroredCheckpoints, _sharded


class StrategyBackend(Backend):
    """The TF2 implementation behind the common interface; rank 0 is the coordinator (chief)."""
    name = "ps2"
    mode = "async"

    def __init__(self, cluster, job, index, startup_timeout=60.0, step_timeout=60.0):
        super().__init__()
        if "chief" not in cluster:
            raise UsageError("--ps_api v2 needs a chief task, the coordinator: pass --chief_host "
                             "(or a 'chief' in TF_CONFIG / --cluster_spec)")
        if not cluster.get("worker"):
            raise UsageError("--ps_api v2 needs at least one worker task (--worker_hosts)")
        self.cluster, self.job, self.index = cluster, job, index
        self.num_ps = len(cluster["ps"])
        self.tasks = {"ps": self.num_ps}
        self.world_size = len(cluster["worker"])     # the training tasks; the chief only coordinates
        self.is_chief = job == "chief"
        self.rank = 0 if self.is_chief else -1
        self.device = f"/job:{job}/task:{index}"
        self.address = cluster[job][index]
        self.chief_address = cluster["chief"][0]
        self.startup_timeout, self.step_timeout = startup_timeout, step_timeout
        self.threads = 0
        self.bind_address = None
        self.server = self.strategy = self.coordinator = None

    def setup(self, cfg):
        """Workers and PS tasks start their gRPC server; the chief connects the strategy to them."""
        import tensorflow as tf
        self.threads = cfg.threads_per_worker
        _, port = parse_address(self.address, f"{self.job}:{self.index}")
        check_port_free(self.bind_address or "", port, f"{self.job}:{self.index}")
        if not self.is_chief:
            config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=self.threads,
                                              inter_op_parallelism_threads=2 if self.threads else 0)
            try:
                self.server = tf.distribute.Server(tf.train.ClusterSpec(self.cluster), job_name=self.job,
                                                   task_index=self.index, protocol="grpc", config=config,
                                                   start=True)
            except tf.errors.OpError as exc:
                raise UsageError(f"{self.job}:{self.index} could not start its gRPC server: "
                                 f"{exc.message.splitlines()[0]}")
            return self
        # The strategy would wait without limit for a task that never comes.
        wait_for_ports(self.cluster["ps"], self.startup_timeout, "parameter server")
        wait_for_ports(self.cluster["worker"], self.startup_timeout, "worker")
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.cluster), task_type="chief", task_id=0, rpc_layer="grpc")
        # Under a mixed policy, no partitioner: Keras reads a mixed layer's variables through
        # AutoCastVariables, which wrap resource variables and refuse a ShardedVariable; the strategy
        # then places each variable whole, round robin (the header's placement says where).
        partitioner = None if cfg.precision != "float32" else \
            tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=MIN_SHARD_BYTES,
                                                                       max_shards=self.num_ps)
        try:
            self.strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
            self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        except (tf.errors.OpError, ValueError) as exc:
            raise RunError(f"chief: cannot connect to the cluster: {describe(exc)}")
        return self

    def plan(self, cfg, num_examples):
        """One update = one worker batch, as in classic async mode."""
        return make_plan(cfg, num_examples, self.world_size, batches_per_update=1)

    def wrap_optimizer(self, optimizer):
        """Nothing to wrap: created under the strategy, the optimizer's updates run on the PS tasks."""
        return optimizer

    def wire_bytes(self, sizes, plan):
        return ps_wire(sizes)

    def shutdown(self, code=0):
        """The chief releases every PS and worker task (ps_train/stop.py).

        Python's cyclic collector is off from here to hard_exit: an eager object left in a cycle
        (a per-worker iterator, a RemoteValue, an executor) is otherwise collected at a random
        moment, and its ``__del__`` sends an RPC to a task that may be leaving, in a native
        runtime whose channels to that task are failing. Nothing is allocated after this but the
        release's few sessions."""
        if self.is_chief:
            gc.disable()
            stop.signal_done([(job, i, addr) for job in ("ps", "worker")
                              for i, addr in enumerate(self.cluster[job])], code)

    # ---------------------------------------------------------------- v2 only
    def worker_names(self):
        return [f"worker:{i}" for i in range(self.world_size)]

    def gone(self, job):
        """Tasks of ``job`` whose port is closed now."""
        return [f"{job}:{i} ({addr})" for i, addr in enumerate(self.cluster[job]) if not port_open(addr)]

    def who_is_gone(self, within=5.0):
        """(PS tasks gone, workers gone) once either is seen, or both empty after ``within`` seconds.

        A killed task's connections can reset before its listening socket closes (the kernel closes
        a dying process's sockets one by one): the error that reached the chief may be the first
        sign of a PS or worker whose port is still open for a moment, so its port is watched for a
        little before the error is taken as something else."""
        deadline = time.monotonic() + within
        while True:
            ps, workers = self.gone("ps"), self.gone("worker")
            if ps or workers or time.monotonic() >= deadline:
                return ps, workers
            time.sleep(0.1)


def coordinate(cfg, backend, num_train):
    """The chief's whole run: returns the workers it saw lost (their steps ran elsewhere)."""
    import tensorflow as tf
    tf.get_logger().setLevel("CRITICAL")   # the coordinator's per-retry tracebacks; hvdps names lost tasks itself
    sys.unraisablehook = _quiet_lost_peer(sys.unraisablehook)
    plan = backend.plan(cfg, num_train)
    with backend.strategy.scope():               # PS: variables on the PS tasks, split by the partitioner
        model = build_model(cfg, check_step=False)      # PS: the strategy's variables, on the PS tasks
        optimizer = backend.wrap_optimizer(make_optimizer(cfg, make_lr_schedule(cfg, plan)))
        optimizer._create_all_weights(model.trainable_variables)   # slots exist before a restore
    checkpoints = MirroredCheckpoints(cfg, plan, model, optimizer)
    start = refuse_finished(cfg, checkpoints.restore(cfg), plan.total_updates)
    iterators = shard_iterators(backend, cfg, plan, start)   # PS: worker i reads shard i, on the worker
    train_step = make_train_step(backend.strategy, model, optimizer)
    log = RunLog(cfg, backend, plan, model, start_step=start, extra_header={
        "ps_api": "v2", "cluster": backend.cluster, "placement": describe_placement(model.weights, _sharded(model)),
        "ps_shard_bytes": shard_bytes(model.trainable_weights),
        "loss_source": "the logged step's own batch"})
    print(f"async mode (TF2 ParameterServerStrategy), {plan.workers} workers, {backend.num_ps} PS, chief "
          f"coordinates: {plan.global_step_meaning}; target {plan.total_updates} updates", flush=True)
    dog = Watchdog(backend.step_timeout + backend.startup_timeout, "chief: the first step did not finish")
    adapter = CoordinatorAdapter(cfg, backend, model, optimizer, checkpoints, dog)
    books = Bookkeeper(cfg, plan, backend, log, adapter, start=start)
    first, recoveries, spent = start + 1, 0, []
    try:
        while True:
            try:
                schedule_all(backend, books, dog, train_step, iterators, first, plan, adapter)
                break
            except tf.errors.OpError as exc:
                if input_failure(exc, "chief"):      # a worker read a bad record: the run ends, naming it
                    raise input_failure(exc, "chief")
                ps_gone, lost = backend.who_is_gone()
                if ps_gone:
                    raise RunError(f"chief: parameter server {ps_gone[0]} is gone: stopping")
                if not lost or len(lost) == plan.workers or recoveries >= plan.workers - 1:
                    raise RunError(f"chief: {describe(exc)}")
                # A lost worker whose error TensorFlow did not class as a worker failure (it retries
                # only what cluster_coordinator._is_worker_failure recognises): the coordinator has
                # raised it and cancelled the queued steps. Let the running ones land, then carry on
                # from what the PS has applied, on the workers still there.
                recoveries += 1
                first = settle(backend, optimizer) + 1
                adapter.note_lost_workers()
                # The coordinator cancelled the steps in flight, and tf.data ends an iterator for good
                # when a read of it is cancelled (its next read is "End of sequence"): every worker
                # reads anew, from where the PS is, as a resumed run does.
                spent.append(iterators)
                iterators = shard_iterators(backend, cfg, plan, first - 1)
        dog.pause()                              # the end: its evaluation and save stay bounded
        books.finish(plan.total_updates)
    finally:
        dog.stop()
    for times in adapter.tasks.values():
        times.save(cfg.train_dir)
    # PS: what holds resources on the workers and PS tasks is never destroyed: a destroyed one sends
    # its task an RPC, which could still be in flight as the release makes that task leave
    stop.keep_until_exit(iterators, spent, train_step, model, optimizer, checkpoints, adapter)
    return [name.split(" ")[0] for name in adapter.lost]


def schedule_all(backend, books, dog, train_step, iterators, first, plan, adapter):
    """Schedules updates ``first``..the last; the logged ones are fetched in order (with their
    steps' waits for a batch and spans on the worker that ran them: ``adapter``)."""
    # Steps are scheduled ahead of the bookkeeping so the workers' queue never runs dry;
    # a logged step is fetched (waited for) only once LAG later steps are queued behind it.
    lag, pending = 2 * plan.workers, collections.deque()
    for step in range(first, plan.total_updates + 1):
        result = backend.coordinator.schedule(train_step, args=(iterators,))   # PS: on a free worker
        if step > books.last and books.wants(step):   # after a recovery: past what was logged
            pending.append((step, result))
        while pending and pending[0][0] <= step - lag:
            books.after_update(*fetched(pending.popleft(), adapter))
            dog.kick(f"chief: no step finished for {backend.step_timeout:g}s (--step_timeout): "
                     f"every worker lost?")
    while pending:                               # in order, each when it has run: honest timings
        books.after_update(*fetched(pending.popleft(), adapter))
    backend.coordinator.join()                   # PS: every scheduled step has run somewhere


def settle(backend, optimizer):
    """After the coordinator raised a lost worker's error: the update count to carry on from, once
    the steps still running elsewhere have landed (so none is scheduled twice). The PS's count, not
    the last logged step: async steps land out of order, so cancelled ones may lie below it."""
    import tensorflow as tf
    try:
        backend.coordinator.join()               # PS: the running closures finish; the queued were cancelled
    except tf.errors.OpError:
        pass                                     # the same loss, reported once more
    return int(optimizer.iterations.numpy())


def fetched(pending, adapter):
    """(step, its loss): waits for that step's result (not for the later ones), and adds the
    step's wait for its batch to ``adapter.input_waits`` and its span to the worker's own
    (``adapter.times``). The loss is None when the coordinator has none for it (a step caught in a
    lost worker's recovery): that log point is then skipped, not invented."""
    step, result = pending
    value = result.fetch()                       # PS: from the worker that ran it
    if value is None:
        return step, None
    loss, waited, worker, started, ended = value
    adapter.input_waits.append(float(waited))
    if int(worker) >= 0:
        adapter.times(int(worker)).add(step, float(started), float(ended), float(waited))
    return step, float(loss)


def _quiet_lost_peer(default):
    """An unraisable-exception hook that drops TensorFlow errors raised in ``__del__``.

    When a PS dies, the coordinator's eager executors are garbage-collected with
    the RPC still failing, and their ``__del__`` prints "Exception ignored in"
    tracebacks (at a random moment: GC timing) next to the one line hvdps prints
    about the lost task. Anything else still goes to Python's default hook.
    """
    import tensorflow as tf

    def hook(unraisable):
        if not isinstance(unraisable.exc_value, tf.errors.OpError):
            default(unraisable)
    return hook


class CoordinatorAdapter(Adapter):
    """The bookkeeper's view of the TF2 coordinator: the logged step's own loss (fetched from the
    worker that ran it), lost workers from their ports, inline evaluation on the PS weights (as
    TensorFlow's guide does it), checkpoints of the chief's mirror of the PS variables."""

    def __init__(self, cfg, backend, model, optimizer, checkpoints, dog):
        self.cfg, self.backend, self.model, self.optimizer, self.checkpoints = cfg, backend, model, optimizer, checkpoints
        self.dog = dog
        self.test_ds = make_dataset(cfg, 0, 1, split="test")
        self.lost = []
        self.input_waits = []                    # the logged steps' waits for their batch, on their worker
        self.tasks = {}                          # worker index -> its logged steps (ranks/worker-<i>.json)

    def times(self, worker):
        """The logged steps worker ``worker`` ran, timed on it: its file in ranks/ at the end."""
        if worker not in self.tasks:
            self.tasks[worker] = StepTimes(f"worker:{worker}", self.cfg.log_every, self.cfg.warmup_steps)
        return self.tasks[worker]

    def reduce_loss(self, losses):
        return losses[-1]                        # only the watched steps are fetched

    def lr(self, step):
        return float(self.optimizer.lr(step))

    def log_extra(self, step):
        self.note_lost_workers()
        return {"lost_workers": self.lost}

    def note_lost_workers(self):
        for name in self.backend.gone("worker"):
            if name not in self.lost:
                self.lost.append(name)
                print(f"chief: {name} is gone; its steps run on the other workers", flush=True)

    def evaluate(self, step):
        with self.dog.doing(f"chief: its evaluation after update {step} did not finish"):
            return finish_eval(eval_sums(self.model, self.test_ds, progress=self.dog.kick))   # per batch

    def save(self, step):
        with self.dog.doing(f"chief: its checkpoint's save at update {step} did not finish"):
            self.checkpoints.save(step)

    def final_weights(self):
        self.checkpoints.pull()                  # PS: the PS variables, read into the chief's copy
        return self.checkpoints.shadow_model.get_weights()

    def compute_s(self, cfg=None):
        # The step without the strategy, timed here (the workers only serve). Not after a lost
        # worker: TF 2.15 blocks the registration of a new tf.function while it retries.
        self.note_lost_workers()
        return None if self.lost else compute_step_time(cfg or self.cfg)

    def finish_extra(self, final):
        # the input's share from the logged steps' waits (the others' results are never fetched)
        return {"lost_workers": self.lost, "updates_applied": int(self.optimizer.iterations.numpy()),
                "input_s": input_wait(self.input_waits)}


def make_train_step(strategy, model, optimizer):
    import tensorflow as tf

    replica_step = train_step_fn(model, optimizer)   # PS: the variables it updates live on the PS

    where = getattr(tf.distribute.coordinator, "experimental_get_current_worker_index", None)

    @tf.function(autograph=False)
    def train_step(iterator):
        # The input's share, measured at the iterator on the worker that runs the step (stateful ops
        # run in program order in a tf.function): returned with the loss, read for the logged steps,
        # with the step's start and end on that worker's clock and which worker ran it (TF >= 2.12:
        # the coordinator's call-time worker index), for that worker's own timeline.
        asked = tf.timestamp()
        x, y = next(iterator)
        with tf.control_dependencies([x, y]):
            waited = tf.maximum(tf.timestamp() - asked, 0.0)     # the wall clock may step back
        loss = strategy.run(replica_step, args=(x, y))
        with tf.control_dependencies(tf.nest.flatten(loss)):
            ended = tf.timestamp()
        worker = where() if where else tf.constant(-1, tf.int64)
        return loss, waited, worker, asked, ended

    return train_step


def shard_iterators(backend, cfg, plan, start):
    """Per-worker iterators where worker i reads shard i of n, as under every other backend.

    TensorFlow's ``create_per_worker_dataset`` runs one and the same dataset
    function on every worker (its docs: workers' datasets are assumed
    identical), so a worker cannot learn its shard from it. This makes the
    same per-worker resource call that function makes, once per worker with
    that worker's shard (TensorFlow 2.15's ClusterCoordinator). Each stream
    repeats: when a worker is lost, the others run its steps on their own data.
    """
    import tensorflow as tf
    try:
        from tensorflow.python.distribute import input_lib
        from tensorflow.python.distribute.coordinator import values as coordinator_values
        workers = backend.coordinator._cluster.workers
    except (ImportError, AttributeError) as exc:
        raise RunError(f"--ps_api v2 needs the ClusterCoordinator internals of TensorFlow 2.15-2.21 ({exc}); this is "
                       f"TensorFlow {tf.__version__}")
    skip = start // plan.workers                 # resume: every worker's stream where the run left it

    def stream(i):
        return make_dataset(cfg, i, plan.workers, start_step=skip, num_steps=plan.worker_steps).repeat()

    spec = input_lib.get_iterator_spec_from_dataset(backend.strategy, stream(0))
    remote = []
    for i, worker in enumerate(workers):
        # autograph=False: the dataset is built by plain Python, with nothing for AutoGraph to convert in
        # make_dataset or what it calls
        value = worker.create_resource(tf.function(lambda i=i: iter(stream(i)), autograph=False))
        value._type_spec = spec                  # what create_per_worker_dataset sets too
        remote.append(value)
    return coordinator_values.PerWorkerDistributedIterator(tuple(remote))


def serve(backend):
    """A worker or PS task: serve until the chief releases it; the chief's code is printed."""
    print(f"{backend.job}:{backend.index} serving on {backend.address}", flush=True)
    code = stop.serve_until_done(backend)
    print(f"{backend.job}:{backend.index} done" + (f" (the chief failed with code {code})" if code else ""),
          flush=True)


def fail_fast_env():
    """TensorFlow's documented setting for PS training: a call to a lost task fails at once
    (and the coordinator retries the step elsewhere) instead of waiting for it to return."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")


def run(args, cfg, cluster, job, index, restrict):
    """The same job with TensorFlow 2's strategy: the chief coordinates, workers and PS tasks serve."""
    fail_fast_env()                           # PS: a lost worker's steps are retried on the others
    backend = StrategyBackend(cluster, job, index, startup_timeout=args.startup_timeout,
                                 step_timeout=args.step_timeout)
    if backend.is_chief:
        check_train_dir(cfg)
        if cfg.resume:
            check_resume_compatible(cfg, cfg.train_dir, backend)
    if restrict:                                 # PS: listen on this task's address only
        listen_only_on(backend, args.bind)
    num_train = num_examples(cfg) if backend.is_chief else 0
    backend.setup(cfg)                           # PS: servers start; the chief connects the strategy
    if not backend.is_chief:                     # PS: workers and PS tasks serve until released
        serve(backend)
        hard_exit(0)
    try:
        lost = coordinate(cfg, backend, num_train)
    except BaseException as exc:                 # PS: a failed chief still releases the servers
        say_first(exc)                           # its line before the release: a crash there cannot lose it
        backend.shutdown(2 if isinstance(exc, UsageError) else 1)
        raise
    if lost:
        print(f"chief: finished without worker(s) {', '.join(lost)} (lost during training; their steps "
              f"ran on the others)", flush=True)
    backend.shutdown()                           # PS: every worker and PS task exits
    hard_exit(0)
