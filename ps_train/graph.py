"""The between-graph replicated training graph one PS worker builds.

Every worker builds the same graph under ``replica_device_setter``, so the
variables land on the PS tasks (round-robin) and the computation on the worker
itself. With several PS tasks, a large trainable variable is first split into
shards along its first axis (TensorFlow's own partitioned variables, see
``split_variables``), so k tasks share its bytes instead of one holding it. Bookkeeping vectors live on the PS beside the global step: how many
batches each worker has applied, which workers have finished, and (sync) how
long each worker's steps waited at the token queue; the chief reads them to
report lost workers, to know when the PS tasks may go, and for the per-step
breakdown.
"""
import contextlib
import dataclasses
from typing import Any

from common.inputs.data import make_dataset
from common.spec.keras3 import refuse_graph_mode
from common.model.models import build_model, eval_batch_sums, make_optimizer, state_updates, total_loss
from common.model.optim import loss_scaled, make_lr_schedule
from common.trainer.backend import MIN_SHARD_BYTES


@dataclasses.dataclass
class TrainGraph:
    global_step: Any
    model: Any
    loss: Any
    learning_rate: Any
    schedule: Any          # the learning rate as a function of the update (common.model.optim): read without the PS
    optimizer: Any
    train_op: Any          # one worker batch's targets: gradients pushed; worker's step counter bumped on the PS
    worker_steps: Any      # [workers] int64 on the PS: batches applied per worker
    worker_done: Any       # [workers] int64 on the PS: 1 once a worker has left its loop
    mark_done: Any
    saver: Any
    sync_wait: Any = None  # sync: [workers] float64 on the PS: seconds each worker waited for its token
    input_wait: Any = None  # this worker's step: seconds from its start until the batch came out of the iterator
    data_init: Any = None  # (re)starts this worker's data stream at data_skip batches
    data_skip: Any = None
    eval_init: Any = None  # chief only: re-reads the test set
    eval_sums: Any = None  # chief only: [loss sum, correct, count] of one test batch
    weights: Any = None    # the model's weights, a split one read whole (its shards concatenated)
    owners: Any = None     # {id(shard): the partitioned variable it is part of}
    loss_scale: Any = None  # mixed_float16: the dynamic loss scale, on the PS


def build_graph(cfg, backend, plan):
    import tensorflow as tf
    v1 = tf.compat.v1
    owners = {}
    with v1.device(backend.device_setter()), split_variables(tf, backend.num_ps, owners,  # PS: on the PS
                                                              whole=cfg.precision != "float32"):
        global_step = v1.train.get_or_create_global_step()
        model = build_model(cfg)
        refuse_graph_mode(cfg, model)            # a Keras 3 plug-in: one line (common/spec/keras3.py)
        # Where this worker's data stream starts is known once the session runs (0, or the
        # restored position on --resume): fed to data_init as data_skip.
        data_skip = v1.placeholder_with_default(tf.constant(0, tf.int64), [], name="hvdps/data_skip")
        train_ds = make_dataset(cfg, backend.rank, plan.workers, start_step=data_skip,
                                num_steps=stream_steps(plan, backend.sync))
        data_iterator = v1.data.make_initializable_iterator(train_ds)
        # The input's share, measured at the iterator as the other trainers' loops measure it: a stamp
        # with no inputs runs as the step starts, the other once the batch is out (both on this
        # worker, no PS traffic); run only where fetched (the chief's loop).
        asked = tf.timestamp()
        x, y = data_iterator.get_next()
        with tf.control_dependencies([x, y]):
            input_wait = tf.maximum(tf.timestamp() - asked, 0.0)   # the wall clock may step back
        logits = model(x, training=True)
        loss = total_loss(model, y, logits)
        # PS: the model's non-trainable state (BatchNormalization's moving statistics) lives on
        # the PS with the weights; each worker's step applies its batch's update to it there,
        # as a single process's step would (a session graph does not run them by itself).
        updates = state_updates(model, x)
        schedule = make_lr_schedule(cfg, plan)
        with v1.device(global_step.device):      # PS: computed where the update reads it
            learning_rate = schedule(global_step)
        unscaled = make_optimizer(cfg, learning_rate, api="v1")
        scaled = loss_scaled(cfg, unscaled, api="v1")   # mixed_float16: the loss scaled
        optimizer = backend.wrap_optimizer(scaled)   # PS: sync wraps, around the loss scale: it sees the average
        zeros = v1.zeros_initializer()
        with v1.device(global_step.device):      # PS: bookkeeping beside the global step (see below)
            worker_steps = v1.get_variable("hvdps/worker_steps", [plan.workers], tf.int64, zeros,
                                           trainable=False)
            worker_done = v1.get_variable("hvdps/worker_done", [plan.workers], tf.int64, zeros,
                                          trainable=False)
            sync_wait = v1.get_variable("hvdps/sync_wait", [plan.workers], tf.float64, zeros,
                                        trainable=False) if backend.sync else None
        grads = optimizer.compute_gradients(loss, var_list=model.trainable_variables)
        if backend.sync:                         # PS: SyncReplicasOptimizer places its own update
            with local_step_read_once(tf, backend.device):
                minimize = optimizer.apply_gradients(grads, global_step=global_step)
        elif scaled is not unscaled:             # PS: one finiteness check over every task's gradients
            minimize = optimizer.apply_gradients(grads, global_step=global_step)   # skips a step whole
        else:                                    # PS: each task updates its own variables
            minimize = apply_on_each_ps(tf, cfg, schedule, grads, global_step)
        # Run with the update, not chained after it (a second PS round trip inside every
        # step), and its constants on the PS (else two more tensors sent per step). With the
        # update's own constants on the PS (apply_on_each_ps), a 1-PS MLP step moves 9 tensors
        # between worker and PS (5 reads, 4 gradients); the classic program of benchmarks/bare_ps.py
        # moves 13 (its Adam constants too). Measured: BENCHMARKS.md, section 7.
        # The sync wait is timed on the same PS and grouped there with the counter: no tensor
        # crosses for either, and no control signal (train_op below).
        with v1.device(global_step.device):
            bookkeeping = [v1.scatter_add(worker_steps, [backend.rank], [1])]
            if sync_wait is not None:
                bookkeeping.append(time_token_wait(tf, minimize, sync_wait, backend.rank))
            bookkeeping = tf.group(*bookkeeping)
        # Two targets, not one group: a group on the worker waits for the PS's bookkeeping through a
        # control signal of its own (a RecvTensor RPC every step), while a target on the PS is done
        # when the PS's part of the step returns, which the step waits for anyway.
        train_op = [tf.group(minimize, *updates), bookkeeping]
        mark_done = v1.scatter_update(worker_done, [backend.rank], [1]).op
        graph = TrainGraph(global_step, model, loss, learning_rate, schedule, optimizer, train_op, worker_steps,
                           worker_done, mark_done, saver=None, sync_wait=sync_wait, input_wait=input_wait,
                           data_init=data_iterator.initializer, data_skip=data_skip,
                           weights=whole_weights(model.weights, owners), owners=owners,
                           loss_scale=scaled.loss_scale_tensor() if scaled is not unscaled else None)
        if backend.is_chief:
            graph.eval_init, graph.eval_sums = _eval_ops(tf, cfg, model)
    # Relative paths in the 'checkpoint' index: a copied or moved run directory
    # resumes from its own files, never from the directory it was copied from.
    # The sync wait is a measurement, not training state: left out of checkpoints (so runs saved
    # before it existed still resume), and zeroed by the chief's session (scaffold below).
    saved = [v for v in v1.global_variables() if v is not sync_wait]
    graph.saver = v1.train.Saver(saved + v1.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS), sharded=True,
                                 max_to_keep=3, save_relative_paths=True)
    return graph


@contextlib.contextmanager
def split_variables(tf, num_ps, owners, whole=False):
    """Trainable variables created in this block are split over the ``num_ps`` PS tasks when large.

    A variable creator (the hook every ``tf.Variable`` goes through, Keras' included) makes a
    large trainable variable a TensorFlow partitioned variable instead: shards along the first
    axis, as many as the rule of common.trainer.backend.MIN_SHARD_BYTES gives, each a variable of its
    own that replica_device_setter places on the next PS task. Keras keeps the partitioned
    variable as the layer's weight (reads concatenate the shards on the worker) and lists its
    shards among the model's variables, so the optimizer, its slots and the Saver (which writes
    the shards as slices of one tensor) each work shard by shard. Each shard is initialised
    with its slice of the full initial value, so the model starts exactly as unsplit.
    ``owners`` receives {id(shard): partitioned variable}.

    ``whole``: under a mixed-precision policy nothing is split. Keras reads each variable of a mixed
    layer through an AutoCastVariable, which wraps a resource variable and refuses a partitioned one;
    the variables are placed whole, round robin, and the header's ``ps_shard_bytes`` says what each
    task then holds.
    """
    v1 = tf.compat.v1
    if num_ps < 2 or whole:
        yield owners
        return
    partitioner = v1.min_max_variable_partitioner(max_partitions=num_ps, axis=0, min_slice_size=MIN_SHARD_BYTES)
    inside = []                              # the shards themselves come through here too

    def creator(next_creator, **kw):
        shape = tf.TensorShape(kw.get("shape"))
        dtype = tf.as_dtype(kw.get("dtype") or tf.float32)
        if (inside or not kw.get("trainable", True) or not shape.is_fully_defined() or shape.rank < 1
                or partitioner(shape=shape, dtype=dtype)[0] < 2):
            return next_creator(**kw)
        initial = kw["initial_value"]
        full = tf.convert_to_tensor(initial() if callable(initial) else initial, dtype)

        def slice_of(shard_shape, dtype=None, partition_info=None):
            return tf.slice(full, partition_info.var_offset, shard_shape)
        scope = v1.get_default_graph().get_name_scope()
        name = kw.get("name") or "Variable"
        inside.append(name)
        try:
            split = v1.get_variable(f"{scope}/{name}" if scope else name, shape, dtype, initializer=slice_of,
                                    partitioner=partitioner, trainable=True, use_resource=True)
        finally:
            inside.pop()
        for shard in split:
            owners[id(shard)] = split
        return split

    with v1.variable_creator_scope(creator):
        yield owners


def whole_weights(weights, owners):
    """The model's weights as the unsplit model has them: each partitioned variable once, whole."""
    out, seen = [], set()
    for w in weights:
        split = owners.get(id(w))
        if split is None:
            out.append(w)
        elif id(split) not in seen:
            seen.add(id(split))
            out.append(split.as_tensor())
    return out


def scaffold(graph, is_chief):
    """The session's scaffold (classic.Session): the graph's saver, and the sync wait zeroed by the chief.

    A restored chief finds every saved variable ready and the wait uninitialised:
    its local-init step (run once the saved ones are) zeroes it. The other
    workers' readiness check includes it, so none steps before that."""
    import tensorflow as tf
    v1 = tf.compat.v1
    if graph.sync_wait is None:
        return v1.train.Scaffold(saver=graph.saver)
    saved = [v for v in v1.global_variables() if v is not graph.sync_wait]
    extra = {"local_init_op": tf.group(v1.train.Scaffold.default_local_init_op(), graph.sync_wait.initializer)
             } if is_chief else {}
    return v1.train.Scaffold(saver=graph.saver, **extra,
                             ready_for_local_init_op=v1.report_uninitialized_variables(saved))


@contextlib.contextmanager
def local_step_read_once(tf, device):
    """SyncReplicasOptimizer's local step, read once per step as the classic program reads it.

    The worker's step hands its local step to every gradient's accumulator on the PS, with the
    gradient. As a resource variable (TF2's default) each of those uses is a read of its own,
    and each read crosses to the PS as a tensor of its own: a RecvTensor RPC per variable per
    step (4 more for a 2-layer MLP, a third more than the whole step's other transfers), where
    the classic program's reference variable sends one snapshot. A caching device on the
    worker gives the variable one read that every use shares (TF's own ResourceVariable
    caching); its value is the same read, before the step's token is assigned to it.
    """
    def creator(next_creator, **kw):
        if kw.get("name") == "sync_rep_local_step":
            kw["caching_device"] = device
        return next_creator(**kw)

    with tf.compat.v1.variable_creator_scope(creator):
        yield


def apply_on_each_ps(tf, cfg, schedule, grads, global_step):
    """An async update as k independent ones: one optimizer per PS task, for the variables on it.

    One optimizer over variables on k tasks keeps its shared state on one task
    (Adam's beta1/beta2 powers beside its first variable), so each update on
    another task reads both powers from there and signals back when done: at
    k = 4, 10 tensors and 6 control signals between PS tasks every worker
    step, each a RecvTensor RPC of its own, on top of the worker's traffic.
    An optimizer per task keeps its state and its arithmetic on that task:
    built under the task's device, its constants and learning rate are made
    there too (under replica_device_setter they would otherwise be made on the
    worker and sent every step). Each optimizer applies once per worker step,
    so its powers advance exactly as the single optimizer's would. The step
    counter is bumped beside the updates, not after them: an async update
    orders nothing across tasks, and a chain would be a PS round trip more.
    """
    v1 = tf.compat.v1
    by_task = {}
    for grad, var in grads:
        if grad is not None:
            by_task.setdefault(var.device, []).append((grad, var))
    updates = []
    for device, pairs in sorted(by_task.items()):
        with v1.device(device):
            updates.append(make_optimizer(cfg, schedule(global_step), api="v1").apply_gradients(pairs))
    with v1.device(global_step.device):
        updates.append(v1.assign_add(global_step, 1))
    return tf.group(*updates)


def time_token_wait(tf, minimize, sync_wait, rank):
    """Add to sync_wait[rank] how long this step's token took, timed on the PS that holds it.

    SyncReplicasOptimizer's worker step pushes every gradient into its
    accumulator, then dequeues a token from the queue beside the global step;
    the token comes once the chief has taken R gradients from every accumulator
    and applied the update. The time between "all my gradients are in" and "my
    token is here" is therefore this worker's wait for the other workers'
    gradients plus the update itself: the part of a sync step that is neither
    its own compute nor its own transfers. Both stamps are taken on the PS's
    clock (no clock skew between machines), next to the dequeue, and the sum
    stays there; the chief reads it with the step counters.
    """
    token = minimize.op.inputs[1] if len(minimize.op.inputs) > 1 else None
    if token is None or token.op.type not in ("QueueDequeueV2", "QueueDequeue"):
        raise RuntimeError(f"SyncReplicasOptimizer's step is not '<local step> = <token dequeue>' in this "
                           f"TensorFlow ({tf.__version__}): cannot time the sync wait")
    with tf.control_dependencies(token.op.control_inputs):      # the same inputs the dequeue waits for
        pushed = tf.timestamp()
    with tf.control_dependencies([token, pushed]):              # stamped after both: never before `pushed`
        arrived = tf.timestamp()
    # tf.timestamp reads the wall clock, which a time daemon may step back between the stamps.
    return tf.compat.v1.scatter_add(sync_wait, [rank], [tf.maximum(arrived - pushed, 0.0)])


def stream_steps(plan, sync):
    """Batches one worker's data stream holds: all the job may ask of that worker before it
    reaches its target updates, so that no worker runs dry first and leaves the job short.

    - Asynchronous: one batch an update, whoever pushes it, and a worker may cover a lost peer's
      share: every update of the job (worker steps x N). Sync with every worker needs only its
      own worker steps, and takes the same bound.
    - Sync with backup workers: SyncReplicasOptimizer hands out N tokens an update and every
      push takes one, applied or dropped as stale, a fast worker taking a slow one's tokens as
      well. The job pushes N batches an update, at worst all of them one worker's: N x (the
      target updates + 1, the chief's release). A stream sized to the applied batches runs dry
      before the target once a slow worker's tokens are taken.
    """
    if sync and plan.batches_per_update < plan.workers:
        return plan.workers * (plan.total_updates + 1)
    return plan.worker_steps * plan.workers


def data_position(plan, update, own_batches):
    """Batches this worker has already trained on, from restored counters.

    Sync with every worker in each update (lock-step, no spare tokens): exactly
    one batch per update, so the global step. Otherwise the worker's own count
    of applied batches, as the checkpoint recorded it.
    """
    if plan.batches_per_update == plan.workers:
        return int(update)
    return int(own_batches)


def _eval_ops(tf, cfg, model):
    test_ds = make_dataset(cfg, 0, 1, split="test").unbatch().batch(256)
    it = tf.compat.v1.data.make_initializable_iterator(test_ds)
    xt, yt = it.get_next()
    return it.initializer, eval_batch_sums(model(xt, training=False), yt)
