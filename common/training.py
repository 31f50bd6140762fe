"""Backend-neutral training pieces: learning-rate rule, evaluation sums, checkpoints, progress.

Pure TensorFlow (no Horovod, no tf.distribute), so the Horovod loop and the PS
loop apply the identical learning-rate rule and evaluation arithmetic.
"""
import os
import sys
import time

import numpy as np

from common.errors import RunError, UsageError, describe


_SCHEDULE = []


def _schedule_class():
    """Defined on first use (TF imported lazily) and registered, so Keras and Horovod's
    DistributedOptimizer, which rebuilds the optimizer from its config, can re-create it."""
    if _SCHEDULE:
        return _SCHEDULE[0]
    import tensorflow as tf

    @tf.keras.utils.register_keras_serializable(package="hvdps")
    class WarmupThenConstant(tf.keras.optimizers.schedules.LearningRateSchedule):
        def __init__(self, base, peak, warmup_steps):
            self.base, self.peak, self.warmup_steps = float(base), float(peak), int(warmup_steps)

        def __call__(self, step):
            if self.warmup_steps == 0:
                return tf.constant(self.peak, tf.float32)
            frac = tf.minimum(tf.cast(step, tf.float32) / float(self.warmup_steps), 1.0)
            return self.base + (self.peak - self.base) * frac

        def get_config(self):
            return {"base": self.base, "peak": self.peak, "warmup_steps": self.warmup_steps}

    _SCHEDULE.append(WarmupThenConstant)
    return WarmupThenConstant


def make_lr_schedule(cfg, plan):
    """Linear warm-up from the single-worker lr to ``lr * plan.lr_scale`` (Goyal et al. 2017),
    over ``--lr_warmup_epochs`` epochs counted in updates.

    Returned as a Keras schedule so the same object drives the eager Horovod loop
    and (called on the global-step tensor) the PS graph.
    """
    scale = plan.lr_scale if cfg.scale_lr else 1
    warmup = 0 if scale == 1 else int(round(cfg.lr_warmup_epochs * plan.updates_per_epoch))
    return _schedule_class()(cfg.learning_rate, cfg.learning_rate * scale, warmup)


def eval_sums(model, dataset):
    """[loss sum, correct, examples] over a dataset (eager), for cross-worker reduction."""
    from common.models import eval_batch_sums
    total = np.zeros(3, np.float64)
    for x, y in dataset:
        total += eval_batch_sums(model(x, training=False), y).numpy()
    return total


def finish_eval(sums):
    loss_sum, correct, count = (float(v) for v in sums)
    if count == 0:
        return float("nan"), float("nan")
    return loss_sum / count, correct / count


# Every fixed name a run writes in its --train_dir (event and checkpoint files inside the two
# folders are named by TensorFlow, created fresh and renamed into place).
RUN_OUTPUTS = ("config.json", "metrics.jsonl", "weights.npz", "launch.json", "elastic_job", "links.json",
               "compare_run.json", "checkpoints", "tensorboard", os.path.join("checkpoints", "checkpoint"))


def check_train_dir(cfg, joining=False):
    """Fail early, on every worker, if results cannot be written or resumed from.

    ``joining``: this process joins a job already under way (elastic Horovod), so
    the run it finds in the directory is its own.
    """
    from common.files import refuse_link, writable_dir
    d = cfg.train_dir
    if os.path.exists(d) and not os.path.isdir(d):
        raise UsageError(f"--train_dir {d} exists and is not a directory")
    if cfg.resume and not os.path.isdir(d):      # refused without creating anything
        raise UsageError(f"--resume: no readable checkpoint directory at {os.path.join(d, 'checkpoints')}")
    writable_dir(d, "--train_dir")
    for name in RUN_OUTPUTS:     # TF's checkpoint and event writers would follow a planted link
        refuse_link(os.path.join(d, name), "a run's output")
    ckpt = os.path.join(d, "checkpoints")
    if cfg.resume and (not os.path.isdir(ckpt) or not os.access(ckpt, os.R_OK | os.X_OK)):
        raise UsageError(f"--resume: no readable checkpoint directory at {ckpt}")
    if cfg.resume and not os.path.exists(os.path.join(ckpt, "checkpoint")):
        raise UsageError(f"--resume: no checkpoint saved yet in {ckpt}")
    if not cfg.resume and not joining and os.path.exists(os.path.join(d, "metrics.jsonl")):
        raise UsageError(f"--train_dir {d} already holds a run (metrics.jsonl); "
                         f"use --resume to continue it or choose another directory")


def remove_partial_checkpoints(directory):
    """After a failed save: TensorFlow's half-written ``<prefix>_temp...`` files and folders go,
    so a full disk leaves only whole checkpoints behind."""
    import shutil
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if "_temp" in name:
            path = os.path.join(directory, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def check_resume_compatible(cfg, train_dir, backend=None):
    """A resumed run continues exactly the job that was checkpointed, or is refused before a
    file in the run directory changes (exit 2).

    The same model, data and batch (config.json), and, from the run's first header in
    metrics.jsonl, the same backend and mode, the same number of workers and PS tasks and the
    same training data (a fingerprint of its arrays). A different world size would restart
    the data order at the wrong position, rescale the learning rate and mis-count the samples
    of every update already taken; hvdps does not convert a checkpoint, it refuses.
    ``backend``: the job being resumed into, once known (every rank can check: no exchange)."""
    from common.schemas import read_checkpoint_index, read_config
    index = os.path.join(train_dir, "checkpoints", "checkpoint")
    if os.path.lexists(index) and read_checkpoint_index(index) is None:    # TensorFlow: a bare ValueError
        raise UsageError(f"--resume: no checkpoint in {os.path.dirname(index)} (its 'checkpoint' index names none)")
    path = os.path.join(train_dir, "config.json")
    if not os.path.exists(path):
        raise UsageError(f"--resume: {path} is missing")
    old = read_config(path)
    for key in ("model", "dataset", "batch_size", "hidden_units", "image_shape", "num_classes", "seed",
                "synthetic_samples", "embedding_rows", "embedding_dim", "optimizer", "shuffle"):
        if getattr(old, key) != getattr(cfg, key):
            raise UsageError(f"--resume: {key} was {getattr(old, key)!r} in {path}, now "
                             f"{getattr(cfg, key)!r}")
    if backend is None:
        return
    from common.metrics import read_records
    first = next((r for r in read_records(os.path.join(train_dir, "metrics.jsonl")) if r["type"] == "header"), None)
    if first is None:
        raise UsageError(f"--resume: {train_dir}/metrics.jsonl has no header: not a run hvdps can continue")
    now = {"backend": backend.name, "mode": backend.mode, "world_size": backend.world_size, "num_ps": backend.num_ps}
    names = {"backend": "backend", "mode": "mode", "world_size": "workers", "num_ps": "PS tasks"}
    for key, value in now.items():
        if key in first and first[key] != value:
            raise UsageError(f"--resume: {train_dir} was trained with {names[key]} {first[key]}, this job has "
                             f"{value}; a checkpoint resumes only into the job that wrote it (start a new "
                             f"--train_dir, or launch the same job)")
    from common.data import data_fingerprint
    if first.get("data_fingerprint") and first["data_fingerprint"] != data_fingerprint(cfg):
        raise UsageError(f"--resume: the training data differ from those {train_dir} was trained on "
                         f"(fingerprint {first['data_fingerprint'][:12]}, now {data_fingerprint(cfg)[:12]})")


def save_weights_npz(weights, path):
    """Final weights (arrays in model order), written atomically: tests and users diff these."""
    from common.files import write_atomic
    write_atomic(path, lambda f: np.savez(f, *[np.asarray(w) for w in weights]))


def load_weights_npz(path):
    from common.schemas import read_weights
    return read_weights(path)


class Progress:
    """tqdm bar on a terminal; plain periodic lines in logs (CI, kubectl logs) and under a
    launcher that forwards output (mpirun, horovodrun, srun): it gives each rank a pty, so the
    rank sees a terminal, but prefixes and relays line by line, and a bar's carriage returns
    come out as fragments like ``[1,0]<stdout>:[horovod] step 10/44 ...^M``."""

    def __init__(self, total, initial=0, desc="train", enabled=True):
        self.enabled = enabled
        self.bar = None
        self.total = total
        self.desc = desc
        self._last = 0.0
        from common.procs import under_launcher
        if enabled and sys.stderr.isatty() and not under_launcher():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)

    def update(self, step, **info):
        if not self.enabled:
            return
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix_str(text, refresh=True)
        elif time.time() - self._last >= 2.0 or step >= self.total:
            self._last = time.time()
            print(f"[{self.desc}] step {step}/{self.total} {text}", flush=True)

    def write(self, text):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _quiet_writer_thread():
    """TensorBoard's writer thread prints the traceback of what stopped it (a full disk) and raises it
    again at the writer's next call, where ``TensorBoard._guard`` makes it one line: the thread's own
    print is left out, every other thread's exception is reported as before."""
    import threading
    if getattr(threading.excepthook, "hvdps", False):
        return
    previous = threading.excepthook

    def hook(args):
        tb = args.exc_traceback
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.endswith("event_file_writer.py"):
                return
            tb = tb.tb_next
        previous(args)
    hook.hvdps = True
    threading.excepthook = hook


class TensorBoard:
    """Scalar events through TensorBoard's own pure-Python writer.

    tf.summary needs eager mode and tf.compat.v1.summary.FileWriter refuses eager
    mode; this works in both, so the eager Horovod loop and the graph-mode PS
    chief write identical event files.
    """

    def __init__(self, logdir):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.logdir = logdir
        _quiet_writer_thread()
        self.writer = self._guard(lambda: EventFileWriter(logdir))

    def _guard(self, write):
        """The writer flushes from a thread of its own and raises what it met (a full disk comes back as
        TensorFlow's ResourceExhaustedError, or an OSError) at a later call: one line naming the folder."""
        from common.errors import describe
        from common.files import WriteError
        try:
            return write()
        except Exception as exc:
            raise WriteError(f"cannot write TensorBoard events to {self.logdir}: {describe(exc)}")

    def scalars(self, step, samples=None, **values):
        """Each value under its own tag against the global step, and again under ``by_samples/``
        against the samples seen: a global step is one worker batch under async PS and one batch
        from every worker under all-reduce, so only the second axis overlays backends."""
        from tensorboard.compat.proto import event_pb2, summary_pb2
        values = {k: float(v) for k, v in values.items() if v is not None and np.isfinite(v)}
        axes = [(step, "")] + ([(samples, "by_samples/")] if samples is not None else [])
        for x, prefix in axes:
            vals = [summary_pb2.Summary.Value(tag=prefix + k, simple_value=v) for k, v in values.items()]
            if vals:
                event = event_pb2.Event(wall_time=time.time(), step=int(x), summary=summary_pb2.Summary(value=vals))
                self._guard(lambda: self.writer.add_event(event))

    def close(self):
        self._guard(self.writer.close)


class RunLog:
    """Everything the chief records about a run: metrics file, TensorBoard, progress, throughput.

    Constructed on every worker so loops need no ``if chief`` around each call;
    on non-chief workers every method is a no-op.

    Steps here are updates of the weights (the global step); what one update
    is worth in samples comes from the run plan, for every backend alike.
    """

    def __init__(self, cfg, backend, plan, model, extra_header=None, start_step=0):
        from common.metrics import MetricsWriter, ThroughputMeter
        self.cfg = cfg
        self.plan = plan
        self.enabled = backend.is_chief
        self.meter = ThroughputMeter(cfg.warmup_steps + start_step, min_span=plan.updates_per_round)
        self.metrics = MetricsWriter(cfg.train_dir, enabled=self.enabled)
        self.tb = TensorBoard(os.path.join(cfg.train_dir, "tensorboard")) if self.enabled else None
        self.progress = Progress(plan.total_updates, initial=start_step, desc=backend.name, enabled=self.enabled)
        self.last_eval = (None, None)
        if self.enabled:
            cfg.save(cfg.train_dir)
            from common.keras3 import keras_of
            self.metrics.header(cfg, backend.name, backend.mode, backend.world_size, backend.num_ps, plan,
                                start_step=start_step, keras=keras_of(model), **(extra_header or {}))

    @classmethod
    def disabled(cls):
        """A RunLog that records nothing (a process that is not rank 0)."""
        log = cls.__new__(cls)
        log.enabled = False
        return log

    def step(self, step, loss, lr=None, samples_seen=None, **extra):
        if not self.enabled:
            return
        samples = samples_seen if samples_seen is not None else step * self.plan.samples_per_update
        rate = self.meter.update(step, samples)
        self.metrics.step(step, samples, loss, rate, **extra)
        self.tb.scalars(step, samples, loss=loss, samples_per_sec=rate, learning_rate=lr)
        self.progress.update(step, loss=float(loss), **({"samples/s": rate} if rate else {}))

    def eval(self, epoch, step, loss, accuracy, **extra):
        if not self.enabled:
            return
        self.last_eval = (loss, accuracy)
        self.metrics.eval(epoch, step, loss, accuracy, target=self.cfg.target_accuracy, **extra)
        self.tb.scalars(step, extra.get("samples_seen", step * self.plan.samples_per_update),
                        test_loss=loss, test_accuracy=accuracy)
        self.progress.write(f"epoch {epoch}: step {step} test_loss={loss:.4f} test_accuracy={accuracy:.4f}")

    def finish(self, steps, grad_bytes_per_step, status="ok", samples_seen=None, compute_s=None, wire=None,
               exchange_s=None, wait_s=None, **extra):
        """The summary; ``compute_s`` (common.probe), ``wire`` (Backend.wire_bytes) and a measured
        ``exchange_s`` or ``wait_s`` make its per-step ``breakdown``."""
        if not self.enabled:
            return None
        from common.probe import breakdown
        stats = self.meter.stats()
        loss, acc = self.last_eval
        samples = samples_seen if samples_seen is not None else steps * self.plan.samples_per_update
        split = breakdown(compute_s, stats.get("median"), self.plan.workers, self.cfg.batch_size, wire, exchange_s,
                          wait_s)
        self.metrics.summary(status, steps, samples, stats, loss, acc,
                             grad_bytes_per_step, breakdown=split, wire=wire, **extra)
        self.progress.close()
        from common.metrics import format_throughput
        print(f"samples/sec: {format_throughput(stats)}  test_accuracy: "
              f"{acc if acc is None else round(acc, 4)}  time: {self.metrics.elapsed():.1f}s", flush=True)
        self.metrics.close()
        self.tb.close()
        return stats


class Watchdog:
    """Ends the process with a one-line error if the training loop stops making progress.

    The last line of defence against gRPC/MPI calls that TensorFlow or Horovod
    would otherwise wait on forever (a dead peer during session creation, say).
    """

    def __init__(self, timeout, message, code=1):
        import threading
        self.timeout, self.message, self.code = timeout, message, code
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hvdps-watchdog")
        self._thread.start()

    def kick(self, message=None):
        self._last = time.monotonic()
        if message:
            self.message = message

    def _run(self):
        while not self._stop.wait(0.5):
            if time.monotonic() - self._last > self.timeout:
                print(f"error: {self.message} (no progress for {self.timeout:.0f}s)",
                      file=sys.stderr, flush=True)
                os._exit(self.code)

    def stop(self):
        self._stop.set()


class Checkpoints:
    """Weights, optimizer slots and the global step, restored and saved together (rank 0 only)."""

    def __init__(self, cfg, model, optimizer):
        import tensorflow as tf
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self.step)
        self.manager = tf.train.CheckpointManager(self.ckpt, os.path.join(cfg.train_dir, "checkpoints"),
                                                  max_to_keep=3)

    def restore(self, cfg):
        """The step of the latest checkpoint (0 for a new run), with its weights and slots loaded."""
        if not cfg.resume:
            return 0
        import tensorflow as tf
        try:
            self.ckpt.restore(self.manager.latest_checkpoint).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, AssertionError, IndexError) as exc:   # TF raises all four
            raise UsageError(f"--resume: cannot restore {self.manager.latest_checkpoint}: "
                             f"{str(exc).splitlines()[0]}")
        return int(self.step.numpy())

    def save(self, step):
        """A full disk or a vanished directory ends the run with one line; TensorFlow writes to a
        temporary name first, so the checkpoints already there stay intact."""
        import tensorflow as tf
        self.step.assign(step)
        try:
            self.manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as exc:
            remove_partial_checkpoints(self.manager.directory)
            raise RunError(f"cannot write a checkpoint to {self.manager.directory}: {describe(exc)}")


def check_alive(value):
    if not np.all(np.isfinite(value)):
        raise RunError("loss became NaN/inf: lower --learning_rate")



def refuse_finished(cfg, step, total):
    """A resumed run must have steps left: else one line saying how to train further."""
    if step >= total:
        raise UsageError(f"--resume: {cfg.train_dir} is already at step {step} of {total}; "
                         f"raise --epochs or --train_steps to train further")
    return step


def create_slots(model, optimizer):
    """Create the optimizer's variables (slots, iteration count) now, on every rank.

    Keras creates them on the first apply_gradients; a resumed run must have them
    before rank 0 restores and broadcasts, or ranks 1..n-1 hang in the broadcast
    (Horovod and bare MPI alike).
    """
    optimizer._create_all_weights(model.trainable_variables)
