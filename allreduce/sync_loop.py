"""The synchronous data-parallel run both all-reduce trainers share (Horovod and bare MPI).

Backend-neutral: it calls only the members ``allreduce.backend.AllreduceBackend``
declares, so the Horovod trainer and the bare-MPI reference time exactly the
same step and keep the same books; the difference between them is the
exchange and nothing else. Lines marked ``# all-reduce:`` are the only
differences from single-process code.
"""
import contextlib
import itertools

from common.trainer.bookkeeper import Adapter, Bookkeeper
from common.inputs.data import input_failure, input_wait, make_dataset, read_batches
from common.model.models import build_model, loss_fn, make_optimizer, train_step_fn
from common.model.probe import compute_step_time
from common.trainer.checkpoints import Checkpoints
from common.model.evaluation import eval_sums, finish_eval
from common.model.optim import create_slots, loss_scale_of, loss_scaled, make_lr_schedule
from common.trainer.run_dir import check_resume_compatible, refuse_finished
from allreduce.deadline import StepDeadline
from allreduce.roster import step_failure
from common.base.errors import UsageError
from common.trainer.runlog import RunLog
from common.trainer.steptimes import StepTimes
from common.trainer.backend import check_jit


class AllreduceAdapter(Adapter):
    """The bookkeeper's view of an all-reduce job: every rank evaluates its slice of the test set and
    the sums are all-reduced; the logged loss is averaged over ranks; rank 0 saves."""

    def __init__(self, cfg, backend, model, optimizer, checkpoints, lr=None, deadline=None):
        self.cfg, self.backend, self.model, self.optimizer, self.checkpoints = cfg, backend, model, optimizer, checkpoints
        self.deadline = deadline
        self._test = {}
        self._lr = lr or (lambda step: float(optimizer.lr(step)))

    def _exchange(self):
        return self.deadline.exchange() if self.deadline else contextlib.nullcontext()

    def _own(self, what):
        return self.deadline.own(what) if self.deadline else contextlib.nullcontext(lambda: None)

    def reduce_loss(self, losses):
        with self._exchange():
            return self.backend.allreduce(sum(losses) / len(losses), "loss")   # all-reduce: average

    def lr(self, step):
        return self._lr(step)

    def log_extra(self, step):
        scale = loss_scale_of(self.optimizer)     # mixed_float16: the same on every rank (their sums agree)
        return {} if scale is None else {"loss_scale": scale}

    def evaluate(self, step):
        key = (self.backend.rank, self.backend.world_size)      # elastic: the world may have changed
        if key not in self._test:
            self._test = {key: make_dataset(self.cfg, *key, split="test")}
        with contextlib.ExitStack() as agreed:
            with self._exchange():
                agreed.enter_context(self.backend.consensus(self.model))   # all-reduce: the weights the ranks agree on
            with self._own("its share of the evaluation") as progress:     # bounded per batch
                sums = eval_sums(self.model, self._test[key], progress=progress)
        with self._exchange():
            return finish_eval(self.backend.allreduce(sums, "eval", op="sum"))

    def save(self, step):
        with self._own("its checkpoint's save"):
            self.checkpoints.save(step)

    def final_weights(self):
        return self.model.get_weights()

    def compute_s(self, cfg=None):
        return compute_step_time(cfg or self.cfg)   # the step without the exchange

    def finish_extra(self, final):
        extra = {"max_weight_divergence": self.backend.max_divergence(self.model)}   # all ranks alike?
        extra.update(self.backend.summary_extra())
        return extra


def train_allreduce(cfg, backend, num_train, loop="custom", extra_header=None, timeouts=None):
    """From a joined backend to the summary: plan, model, restore, broadcast, train, finish.
    ``timeouts``: (--step_timeout, --startup_timeout), each step bounded (allreduce/deadline.py)."""
    check_jit(cfg, backend)                      # XLA: an exchange inside the step needs XLA kernels
    if cfg.resume:                               # all-reduce: every rank refuses a changed world alike
        check_resume_compatible(cfg, cfg.train_dir, backend)
    plan = backend.plan(cfg, num_train)          # all-reduce: each rank runs 1/size of an epoch's steps
    with backend.scope():                        # all-reduce: a strategy's variables are made in its scope
        model = build_model(cfg, check_step=not backend.strategy_owns_variables)
        optimizer = make_optimizer(cfg, make_lr_schedule(cfg, plan))   # all-reduce: lr scaled by the workers
        if loop == "fit":
            optimizer = backend.wrap_optimizer(optimizer)   # all-reduce: inside Keras' train step
        optimizer = loss_scaled(cfg, optimizer)  # mixed_float16: outside the exchange, which carries it scaled
        create_slots(model, optimizer)           # all-reduce: every rank has the slots rank 0 restores

    checkpoints = Checkpoints(cfg, model, optimizer)
    start_step = checkpoints.restore(cfg) if backend.is_chief else 0   # all-reduce: rank 0 reads
    start_step = backend.broadcast_object(start_step)   # all-reduce: everyone resumes at rank 0's step
    refuse_finished(cfg, start_step, plan.total_updates)
    backend.broadcast_state(model, optimizer)    # all-reduce: rank 0's weights and slots everywhere
    peers = backend.roster()                     # all-reduce: who the other ranks are, to name a lost one
    if peers:
        peers.watch_sigterm()                    # mpirun ends the survivors of a lost rank with SIGTERM
    deadline = StepDeadline(backend.rank, *timeouts, roster=peers) if timeouts else None   # all-reduce: a stalled peer

    train_ds = backend.distribute_dataset(      # all-reduce: each rank its shard (a strategy: through it)
        lambda index, count: make_dataset(cfg, index, count, start_step=start_step, num_steps=plan.worker_steps))
    log = RunLog(cfg, backend, plan, model, start_step=start_step,
                 extra_header={"loop": loop, "threads_per_worker": backend.threads, **(extra_header or {})})
    books = Bookkeeper(cfg, plan, backend, log, AllreduceAdapter(cfg, backend, model, optimizer, checkpoints,
                                                                deadline=deadline), start=start_step)
    import tensorflow as tf
    extra = {}
    try:
        if loop == "fit":
            run_fit(backend, model, optimizer, train_ds, start_step, plan.total_updates, books, deadline)
        else:
            waits = run_custom(backend, model, optimizer, train_ds, start_step, plan.worker_steps, books, peers,
                               deadline)
            extra["input_s"] = input_wait(waits)
        books.finish(plan.total_updates, **extra)
    except tf.errors.OpError as exc:             # a collective of the books (the logged loss, an evaluation)
        raise step_failure(peers, f"rank {backend.rank}: training failed after update {books.last}", exc)
    finally:
        if deadline:
            deadline.stop()
    backend.shutdown()
    return 0


def run_custom(backend, model, optimizer, train_ds, start_step, total_steps, books, peers=None, deadline=None):
    import tensorflow as tf
    # autograph=False: the step is straight-line code (a model's own control flow is Keras'); AutoGraph would
    # parse and rewrite its source and what it calls in every process before step 1; jit_compile: XLA
    train_step = tf.function(backend.distribute(train_step_fn(model, optimizer, wrap_tape=backend.wrap_tape)),
                             autograph=False, jit_compile=books.cfg.jit_compile or None)  # all-reduce
    step, waits = start_step, []
    times = StepTimes(f"rank:{backend.rank}", books.cfg.log_every, books.cfg.warmup_steps,
                      getattr(backend, "exchange_times", None))     # all-reduce: the exchange where timed
    batches = itertools.islice(read_batches(train_ds, f"rank {backend.rank}", waits, first_step=start_step + 1),
                               total_steps - start_step)             # a strategy's dataset may repeat
    for x, y in timed(batches, times, deadline, start_step + 1):
        try:
            loss = float(train_step(x, y))
        except tf.errors.OpError as exc:         # a lost peer, a collective's timeout: one line, not a trace
            raise step_failure(peers, f"rank {backend.rank}: training step {step + 1} failed", exc)
        except (AttributeError, TypeError, NotImplementedError) as exc:
            if step > start_step:                # the step traced once already: not a tracing failure
                raise
            raise UsageError(f"--model {books.cfg.model}: its training step cannot be traced into a TensorFlow "
                             f"graph ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): a layer "
                             f"that works only eagerly (.numpy(), Python control flow on tensors) cannot run "
                             f"under {backend.name}")
        step += 1
        backend.after_step(model, step, last=step == total_steps)   # all-reduce: local SGD's weight exchange
        times.end(step, waits[-1] if waits else None)
        if deadline:
            deadline.end()
        books.after_update(step, loss)
    times.save(books.cfg.train_dir)
    return waits


def timed(batches, times, deadline=None, step=1):
    """The batches, each step's clock (and its deadline) started before its batch is asked for."""
    while True:
        times.begin()
        if deadline:
            deadline.begin(step)
        try:
            batch = next(batches)
        except StopIteration:
            if deadline:
                deadline.end()
            return
        if deadline:
            deadline.batch()                     # the batch came: now the compute and the exchange
        yield batch
        step += 1


def run_fit(backend, model, optimizer, train_ds, start_step, total_steps, books, deadline=None):
    import tensorflow as tf

    times = StepTimes(f"rank:{backend.rank}", books.cfg.log_every, books.cfg.warmup_steps)

    class Hook(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step = start_step

        def on_train_batch_begin(self, batch, logs=None):
            times.begin()
            if deadline:                         # Keras reads the batch inside its step: one phase
                deadline.begin(self.step + 1)
                deadline.batch()

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            times.end(self.step)
            if deadline:
                deadline.end()
            books.after_update(self.step, float(logs["loss"]))

    model.compile(optimizer=optimizer, loss=loss_fn(), metrics=["accuracy"], run_eagerly=False,
                  jit_compile=books.cfg.jit_compile)
    try:
        model.fit(train_ds, steps_per_epoch=total_steps - start_step, epochs=1, verbose=0,
                  callbacks=backend.keras_callbacks() + [Hook()])   # all-reduce: broadcast + metric averaging
    except tf.errors.OpError as exc:
        raise input_failure(exc, f"rank {backend.rank}") or exc
    times.save(books.cfg.train_dir)
