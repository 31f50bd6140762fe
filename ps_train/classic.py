"""The classic between-graph PS job (TensorFlow 1's graph, a session per task): what
``ps_train/main.py`` runs unless ``--ps_api v2``. A PS task serves its variables until the chief
releases it; a worker builds the replicated graph with its variables on the PS tasks, and the chief
(worker 0) also initialises or restores them, evaluates, checkpoints and writes the run's records.
Lines marked ``# PS:`` are the only differences from single-process code.
"""
import os
import re
import sys
import threading
import time

from common.inputs.data import input_failure, input_wait, num_examples
from common.base.errors import RunError, UsageError, describe, say_first
from common.base.files import make_dirs
from common.model.models import check_plugin
from common.model.probe import compute_step_time
from common.trainer.bookkeeper import Adapter, Bookkeeper
from common.trainer.checkpoints import remove_partial_checkpoints
from common.trainer.run_dir import check_resume_compatible, check_train_dir, refuse_finished
from common.trainer.runlog import RunLog
from common.trainer.steptimes import StepTimes
from common.trainer.watchdog import Watchdog
from ps_train import stop
from ps_train.stop import hard_exit
from ps_train.backend import PSBackend, describe_placement, shard_bytes
from ps_train.chief import WaitMeter, WorkerTracker, evaluate
from ps_train.graph import build_graph, data_position, scaffold
from tf_cluster.listen import listen_only_on
from ps_train.peers import ChiefWatch, PSWatch



def run(args, cfg, cluster, job, index, restrict):
    """This task of a between-graph job: a PS serves until the chief releases it, a worker trains."""
    backend = PSBackend(cluster, job, index, sync=args.sync, replicas_to_aggregate=args.replicas_to_aggregate,
                        startup_timeout=args.startup_timeout, step_timeout=args.step_timeout,
                        backup_workers=args.backup_workers)
    if backend.is_chief:
        check_train_dir(cfg)
        if cfg.resume:
            check_resume_compatible(cfg, cfg.train_dir, backend)
    if restrict:                                 # PS: listen on this task's address only (tf_cluster/listen.py)
        listen_only_on(backend, args.bind)
    num_train = 0 if backend.is_ps else num_examples(cfg)
    if not backend.is_ps:                        # a plug-in's training step, and Keras 3 refused, before joining
        check_plugin(cfg, graph_mode=True)
    backend.setup(cfg)                           # PS: start this task's gRPC server
    if backend.is_ps:                            # PS: serve variables until the chief says stop
        print(f"ps:{index} serving on {backend.address}", flush=True)
        code = stop.serve_until_done(backend)   # released by the chief: a clean exit, whatever its result
        print(f"ps:{index} done" + (f" (the chief failed with code {code})" if code else ""), flush=True)
        hard_exit(0)
    try:
        lost = run_worker(cfg, backend, num_train)
    except BaseException as exc:                 # PS: a failed chief still releases the PS tasks
        say_first(exc)                           # its line before the release: a crash there cannot lose it
        backend.shutdown(2 if isinstance(exc, UsageError) else 1)
        raise
    if lost:
        print(f"chief: finished without worker(s) {', '.join(lost)} (lost during training)", flush=True)
    backend.shutdown()                           # PS: let every PS task exit
    hard_exit(0)


def run_worker(cfg, backend, num_train):
    """A worker (or the chief) from its running server to the end of training: returns lost workers."""
    backend.wait_for_ps()                        # PS: bounded wait instead of a silent hang
    import tensorflow as tf
    quiet_tensorflow(tf)
    plan = backend.plan(cfg, num_train)          # PS: one update = R worker batches (sync) or 1 (async)
    start_update = resume_point(cfg, plan) if backend.is_chief and cfg.resume else 0
    graph = build_graph(cfg, backend, plan)      # PS: variables on the PS tasks
    ps_watch = PSWatch(backend)                  # PS: a lost PS ends this task with one line
    try:
        if not backend.is_chief:
            wait_until_initialised(tf, backend)  # PS: the chief initialises (or restores)
        def start_log():
            # PS: the trainer's clock starts once the session exists (variables initialised or
            # restored on the PS), as the Horovod trainer's starts after its initial broadcast;
            # what came before is in the report's start-up column, not in the run's warm-up.
            return RunLog(cfg, backend, plan, graph.model, start_step=start_update, extra_header={
                "cluster": backend.cluster, "replicas_to_aggregate": backend.replicas_to_aggregate,
                "placement": describe_placement(tf.compat.v1.global_variables(), graph.owners),
                "ps_shard_bytes": shard_bytes(tf.compat.v1.trainable_variables()),
                "loss_source": "chief's own batches"})
        if backend.is_chief:                     # PS: say once what a global step is
            print(f"{backend.mode} mode, {plan.workers} workers, {backend.num_ps} PS: global step = updates "
                  f"applied on the PS; {plan.global_step_meaning}; target {plan.total_updates} updates", flush=True)
        return train(cfg, backend, plan, graph, start_log, ps_watch)
    except (tf.errors.OpError, RunError) as exc:
        ps_watch.exit_if_lost(exc)               # PS: a closed PS port is the cause, in its own line
        raise
    finally:                                     # from here on, PS tasks leaving is expected
        ps_watch.stop()


def train(cfg, backend, plan, graph, start_log, ps_watch):
    """The session loop of every worker; the chief also logs, evaluates and checkpoints.

    Returns the workers the chief saw lost (async), after every live one has finished.
    """
    import tensorflow as tf
    dog = Watchdog(backend.startup_timeout + backend.step_timeout,
                   f"{backend.job}:{backend.index}: session did not start")
    chief_watch = None if backend.is_chief else ChiefWatch(backend, on_wait=dog.kick)
    step_opts = tf.compat.v1.RunOptions(timeout_in_ms=int(backend.step_timeout * 1000))
    try:
        session, sess, read, at, chief, books = start_session(cfg, backend, plan, graph, start_log, dog)
        fetches = [graph.train_op, graph.loss, graph.global_step, graph.input_wait]
        done = at >= plan.total_updates             # a worker that joins a finished job steps no more
        times, mine = StepTimes(f"worker:{backend.index}", cfg.log_every, cfg.warmup_steps), 0

        def step(raw):
            return raw.run(fetches, options=step_opts)
        who = f"{backend.job}:{backend.index}"
        while not done:
            if chief_watch:
                chief_watch.check()
            times.begin()
            try:
                _, loss, update, waited = retried(sess, step, f"{who}: training step",
                                                  first=ps_watch.exit_if_lost)   # a PS gone: its line
            except tf.errors.DeadlineExceededError:
                session.check()                  # the queue runner's own error first, if it stopped
                raise RunError((chief.blocked() if chief else None) or
                               f"{backend.job}:{backend.index}: no update for {backend.step_timeout:g}s "
                               f"({backend.mode} mode): a worker or PS was lost")
            except tf.errors.OutOfRangeError:
                break                        # this worker's data stream is used up: its part is done
            except (tf.errors.OpError, OSError) as exc:   # a full disk under the checkpoint hook, ...
                raise input_failure(exc, who) or RunError(f"{who}: {describe(exc)}")
            mine += 1
            times.end(mine, float(waited))      # PS: this worker's own batches, at its own pace
            dog.kick()
            session.check()
            if books:
                chief.input_waits.append(waited)  # PS: the chief's own batches, as rank 0's elsewhere
                books.after_update(int(update), float(loss))
            done = reached(plan.total_updates, int(update), lambda: int(read(graph.global_step)))
        read(graph.mark_done)
        times.save(cfg.train_dir)
        if not chief:                        # PS: nothing else to do; the chief ends the job
            if session.release is not None:
                read(session.release)        # PS: backups: a token for a worker still waiting
            ps_watch.stop()
            hard_exit(0)
        final = int(read(graph.global_step))
        if session.release is not None:
            read(session.release)                # PS: backups: no worker left waiting for a token
        chief.lost = chief.tracker.wait_for_finish(read, graph, dog.kick)   # PS: the other workers' last steps
        books.finish(final)
        return chief.lost
    finally:
        dog.stop()


def start_session(cfg, backend, plan, graph, start_log, dog):
    """(session, its never-closed raw session, a reader, the global step it starts at, and on the
    chief its adapter and books): the data stream resumed where the job was, the chief's first
    checkpoint written (start-up, not warm-up)."""
    # PS: never closed. Closing a distributed session is a round of RPCs (and waits for the
    # SyncReplicasOptimizer's queue runner); every task leaves by hard_exit, and the PS tasks
    # are released explicitly.
    session = Session(cfg, backend, plan, graph)
    sess = stop.never_close(session.raw)
    dog.kick(f"{backend.job}:{backend.index}: a training step blocked (lost PS or sync peer?)")
    read = reader(sess)
    at = int(read(graph.global_step))
    start = data_position(plan, at, read(graph.worker_steps)[backend.rank])
    read(graph.data_init, {graph.data_skip: start})   # PS: resume the data stream where it was
    chief = books = None
    if backend.is_chief:
        chief = ChiefAdapter(cfg, backend, graph, read, dog)
        chief.sess = sess
        chief.first_checkpoint()         # start-up, not warm-up
    log = start_log()
    if chief:                            # PS: the chief keeps the books of the whole job
        chief.waits = WaitMeter(log.meter.warmup_steps)
        books = Bookkeeper(cfg, plan, backend, log, chief, start=int(read(graph.global_step)))
    return session, sess, read, at, chief, books


def reached(target, fetched, read_now):
    """Whether the job has applied ``target`` updates, after a step that fetched the global step.

    The step's own read of the global step may run before or after its update (they are not
    ordered), so near the target the PS is asked once more, as TF's StopAtStepHook does. The
    hook itself is not used: it fetches its own read of the global step with every step
    (a check that the variable is initialised, then the read: a cond of PS reads), which cost
    a fifth of a small model's step (BENCHMARKS.md, "The PS trainer against the classic program").
    """
    return fetched + 1 >= target and read_now() >= target


class Session:
    """A plain session made ready the way TF's MonitoredTrainingSession makes one, without its wrapper.

    The chief restores the latest checkpoint or initialises the variables and runs its local
    init; another worker waits until that is done and runs its own; sync: every worker's
    SyncReplicasOptimizer local step, and on the chief the tokens and the queue runner that
    applies the updates (what the optimizer's session hook does). Steps then run on the raw
    session: the monitored one wraps every step in Python layers (coordinator, hooks,
    recovery) that cost a twentieth of a small model's step (benchmarks/ps_step_cost.py).
    """

    def __init__(self, cfg, backend, plan, graph):
        import tensorflow as tf
        v1 = tf.compat.v1
        self.coord = v1.train.Coordinator()
        sync_local = runner = tokens = self.release = None
        if backend.sync:                         # PS: the chief runs the token queue; no spare tokens
            opt = graph.optimizer
            sync_local = opt.chief_init_op if backend.is_chief else opt.local_step_init_op
            if backend.is_chief:
                runner = opt.get_chief_queue_runner()
                tokens = opt.get_init_tokens_op(max(0, backend.replicas_to_aggregate - plan.workers))
                if backend.replicas_to_aggregate < plan.workers:
                    # Backup workers: the last update's tokens go to whoever asks first, so a late
                    # worker can wait at the token queue for an update that never comes. Once the
                    # target is reached the chief gives every worker one more token: its step ends,
                    # it sees the last update and is done.
                    self.release = opt.get_init_tokens_op(plan.workers)
            elif backend.replicas_to_aggregate < plan.workers:
                # ... and the late worker may be the chief (a slow host): each other worker leaves a
                # token as it finishes, so whoever still waits gets one and finishes in turn.
                self.release = opt.get_init_tokens_op(1)
        steps = scaffold(graph, backend.is_chief)
        steps.finalize()                         # no op is added past this point (the graph is final)
        manager = v1.train.SessionManager(local_init_op=steps.local_init_op, ready_op=steps.ready_op,
                                          ready_for_local_init_op=steps.ready_for_local_init_op,
                                          recovery_wait_secs=0.2)
        config = backend.session_config()
        if backend.is_chief:
            self.raw = restore_or_init(manager, backend, steps, config, os.path.join(cfg.train_dir, "checkpoints"))
        else:
            self.raw = manager.wait_for_session(backend.server.target, config=config,
                                                max_wait_secs=backend.startup_timeout)
            if self.raw is None:
                raise RunError(f"{backend.job}:{backend.index}: the chief did not initialise the model "
                               f"within {backend.startup_timeout:g}s (--startup_timeout)")
        if sync_local is not None:
            self.raw.run(sync_local)
        if tokens is not None:
            self.raw.run(tokens)
            runner.create_threads(self.raw, coord=self.coord, daemon=True, start=True)

    def check(self):
        """Raise what stopped the sync queue runner (a lost PS, say), if anything did."""
        if self.coord.should_stop():
            self.coord.raise_requested_exception()


def restore_or_init(manager, backend, steps, config, ckpt_dir):
    """The chief's session: the latest checkpoint in ``ckpt_dir`` restored, else the variables initialised.

    Saving is the chief loop's (ChiefAdapter.save), never a hook's."""
    import tensorflow as tf
    try:
        return manager.prepare_session(backend.server.target, init_op=steps.init_op, saver=steps.saver,
                                       checkpoint_dir=ckpt_dir, config=config)
    except tf.errors.NotFoundError as exc:
        missing = re.search(r"Key (\S+) not found in checkpoint", str(exc))
        if not missing:
            raise
        # The same model, mode and PS count (check_resume_compatible), yet another graph: a checkpoint
        # of another ps_train version (async Adam's beta powers are one pair per PS task), or a file
        # edited by hand. The Saver's NotFoundError is a page of stack trace.
        raise UsageError(f"--resume: {tf.train.latest_checkpoint(ckpt_dir)} holds no {missing.group(1)}, which "
                         f"this job's graph restores: it was written by another version of ps_train or "
                         f"another job (start a new --train_dir)") from None


def retried(sess, fn, what, attempts=3, pause=1.0, first=None):
    """fn(session), retried on a transient gRPC error (Unavailable, Aborted); ``first()`` is called
    before trying again (a training step: end at once with its own line if a PS is gone).

    The same session simply tries again: a one-off gRPC hiccup on the chief's read of the counters
    is not the end of a run. Reads and checkpoints are idempotent; a training step that failed
    this way may or may not have reached the PS, so tried again its batch may count twice, as
    under TF's own recovery (MonitoredSession runs the step again on a new session)."""
    import tensorflow as tf
    for attempt in range(1, attempts + 1):
        try:
            return fn(sess)
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
            if first:
                first()
            if attempt == attempts:
                raise RunError(f"{what}: {describe(exc)} ({attempts} attempts)")
            print(f"{what}: {type(exc).__name__}: {describe(exc)}; trying again", file=sys.stderr, flush=True)
            time.sleep(pause * attempt)


def reader(sess):
    """Run fetches on the PS outside the training steps (no step counted, no checkpoint)."""
    def read(fetches, feed_dict=None):
        return retried(sess, lambda raw: raw.run(fetches, feed_dict=feed_dict), "reading the PS")
    return read


class ChiefAdapter(Adapter):
    """The bookkeeper's view of a classic PS chief: the loss of its own batches, every worker's
    progress and the weights read from the PS, checkpoints through the graph's Saver.

    Checkpoints are saved from the loop, not by TF's CheckpointSaverHook: the hook runs a second
    session call per step to re-read the global step from the PS whenever its stale value says a
    save may be due; on a small model that was a quarter of the chief's step time. The loop
    already fetches the global step with each step.
    """

    def __init__(self, cfg, backend, graph, read, dog):
        self.cfg, self.backend, self.graph, self.read, self.dog = cfg, backend, graph, read, dog
        self.kick = dog.kick
        self.model = graph.model
        self.dir = os.path.join(cfg.train_dir, "checkpoints")
        self.tracker = WorkerTracker(backend.task_names(), backend.sync, backend.step_timeout)
        self.lost = []
        self.waits = None
        self.input_waits = []                    # seconds each of the chief's steps waited for its batch

    def first_checkpoint(self):
        """One when there is none, as TF's hook wrote it: a restarted chief always has something
        to resume from (start-up, before the run's clock starts)."""
        import tensorflow as tf
        make_dirs(self.dir)
        if not tf.train.latest_checkpoint(self.dir):
            self.save(None)

    def read_counters(self):
        """Every worker's applied batches, (sync) seconds waited for tokens and (mixed_float16) the loss
        scale, in one PS read: (counts, waits or None, scale or None)."""
        g = self.graph
        wanted = [g.worker_steps] + [t for t in (g.sync_wait, g.loss_scale) if t is not None]
        got = iter(self.read(wanted))
        return next(got), *(next(got) if t is not None else None for t in (g.sync_wait, g.loss_scale))

    def lr(self, step):
        # the schedule's own value at this update, not a read of the rate on the PS: a session run
        # (a RunGraph round trip to the PS) per log costs about 2 ms, in sync mode stalling every worker
        return self.graph.schedule.at(step)

    def log_extra(self, step):                   # PS: every worker's progress, from the PS
        counts, waits, scale = self.read_counters()
        self.lost = self.tracker.update(counts)
        extra = {"worker_steps": counts.tolist(), "lost_workers": self.lost}
        if scale is not None:
            extra["loss_scale"] = float(scale)
        if waits is not None:
            extra.update(sync_wait_s=self.waits.update(step, waits, counts), sync_wait_total_s=waits.tolist())
        return extra

    def evaluate(self, step):
        with self.dog.doing(f"{self._who()}: its evaluation after update {step} did not finish"):
            return evaluate(self.read, self.graph, progress=self.kick)   # bounded per batch

    def _who(self):
        return f"{self.backend.job}:{self.backend.index} (chief)"

    def save(self, step):
        import tensorflow as tf

        def write(raw):                          # at the PS's own global step (async: it moves on)
            update = int(raw.run(self.graph.global_step))
            self.graph.saver.save(raw, os.path.join(self.dir, "model.ckpt"), global_step=update,
                                  write_meta_graph=False)
        try:
            with self.dog.doing(f"{self._who()}: its checkpoint's save at update {step} did not finish"):
                retried(self.sess, write, "chief: checkpoint")
        except (tf.errors.OpError, OSError) as exc:       # a full disk, say: one line, the old files kept
            remove_partial_checkpoints(self.dir)
            raise RunError(f"chief: checkpoint: {describe(exc)}")

    def final_weights(self):
        return self.read(self.graph.weights)

    def compute_s(self, cfg=None):
        self.kick()
        seconds = compute_step_time(cfg or self.cfg, self.backend.session_config())   # the step without PS
        self.kick()
        return seconds

    def finish_extra(self, final):
        counts, waits, _ = self.read_counters()
        extra = {"lost_workers": self.lost, "worker_steps": counts.tolist(), "input_s": input_wait(self.input_waits)}
        if waits is not None:
            extra.update(sync_wait_total_s=waits.tolist(), wait_s=self.waits.median())
        if self.backend.sync:                    # PS: each update took R gradients; every other one was dropped
            extra["dropped_gradients"] = max(0, int(counts.sum()) - final * self.backend.replicas_to_aggregate)
        return extra

    def blocked(self):
        """Why a step blocked for --step_timeout: the workers whose server is gone (or None).

        Counters cannot tell: in lock-step every live worker waits at the same count."""
        return self.tracker.gone(self.backend.task_addresses()[1:])


def resume_point(cfg, plan):
    """The global step of the checkpoint to resume from: readable, and short of the target."""
    import tensorflow as tf
    ckpt_dir = os.path.join(cfg.train_dir, "checkpoints")
    path = tf.train.latest_checkpoint(ckpt_dir)
    try:
        update = int(tf.train.load_variable(path, "global_step")) if path else None
        reader = tf.train.load_checkpoint(path) if path else None
        for name in (reader.get_variable_to_shape_map() if reader else {}):
            reader.get_tensor(name)          # every tensor readable: a truncated file fails here
    except (tf.errors.OpError, ValueError, IndexError) as exc:   # a truncated file: IndexError
        raise UsageError(f"--resume: cannot restore {path}: {str(exc).splitlines()[0]}")
    if update is None:
        raise UsageError(f"--resume: no checkpoint in {ckpt_dir} (the 'checkpoint' index names none "
                         f"that exists here)")
    return refuse_finished(cfg, update, plan.total_updates)


def wait_until_initialised(tf, backend):
    """Poll every 0.2s (TF's own SessionManager polls every 30s) until the chief has initialised."""
    check = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    deadline = time.monotonic() + backend.startup_timeout
    opts = tf.compat.v1.RunOptions(timeout_in_ms=5000)
    with tf.compat.v1.Session(backend.server.target, config=backend.session_config()) as sess:
        while True:
            try:
                if len(sess.run(check, options=opts)) == 0:
                    return
            except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError):
                pass
            if time.monotonic() > deadline:
                raise RunError(f"{backend.job}:{backend.index}: the chief did not initialise the model "
                               f"within {backend.startup_timeout:g}s (--startup_timeout)")
            time.sleep(0.2)


def quiet_tensorflow(tf):
    """v1 deprecation notices would drown the progress lines, and SyncReplicasOptimizer's
    token thread is cancelled when the session closes: that is the end, not an error."""
    tf.get_logger().setLevel("ERROR")
    default = threading.excepthook

    def hook(args):
        if isinstance(args.exc_value, tf.errors.CancelledError) and "QueueRunner" in (args.thread.name or ""):
            return
        default(args)

    threading.excepthook = hook
