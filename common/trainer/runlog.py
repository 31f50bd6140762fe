"""What the chief records while a run trains: metrics.jsonl, TensorBoard events, progress, throughput.

One ``RunLog`` for every backend, so each writes the same records the same way; TensorBoard's events
go through its own pure-Python writer, which works in the eager loops and the PS graph alike.
"""
import os
import sys
import threading
import time

import numpy as np

from common.base.procs import under_launcher
from common.base.errors import describe
from common.base.files import WriteError, make_dirs, take_folder
from common.trainer.metrics import MetricsWriter, ThroughputMeter, format_throughput
from common.spec.keras3 import keras_of
from common.model.probe import breakdown


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

    def __init__(self, cfg, backend, plan, model, extra_header=None, start_step=0, one_writer=True):
        self.cfg = cfg
        self.plan = plan
        self.enabled = backend.is_chief
        if self.enabled and one_writer:  # one writer per run folder: a second run into it is refused here
            make_dirs(cfg.train_dir)
            take_folder(cfg.train_dir, "--train_dir")
        self.meter = ThroughputMeter(cfg.warmup_steps + start_step, min_span=plan.updates_per_round)
        self.metrics = MetricsWriter(cfg.train_dir, enabled=self.enabled)
        self.tb = TensorBoard(os.path.join(cfg.train_dir, "tensorboard")) if self.enabled else None
        self.progress = Progress(plan.total_updates, initial=start_step, desc=backend.name, enabled=self.enabled)
        self.last_eval = (None, None)
        if self.enabled:
            cfg.save(cfg.train_dir)
            self.metrics.header(cfg, backend.name, backend.mode, backend.world_size, backend.tasks, plan,
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
        self.tb.scalars(step, samples, loss=loss, samples_per_sec=rate, learning_rate=lr,
                        loss_scale=extra.get("loss_scale"))
        self.progress.update(step, loss=float(loss), **({"samples/s": rate} if rate else {}))

    def training_started(self):
        """The first update has ended: time to the target counts from here (MetricsWriter.training_started)."""
        if self.enabled:
            self.metrics.training_started()

    def paused(self):
        """An evaluation or a checkpoint has just ended: it is in no throughput interval (ThroughputMeter.pause)."""
        if self.enabled:
            self.meter.pause()

    def resumed(self, step, samples_seen=None):
        """Update ``step`` is the first since the pause: the next interval begins at it."""
        if self.enabled:
            self.meter.resume(step, samples_seen if samples_seen is not None else step * self.plan.samples_per_update)

    def eval(self, epoch, step, loss, accuracy, **extra):
        if not self.enabled:
            return
        self.last_eval = (loss, accuracy)
        self.metrics.eval(epoch, step, loss, accuracy, target=self.cfg.target_accuracy, **extra)
        self.tb.scalars(step, extra.get("samples_seen", step * self.plan.samples_per_update),
                        test_loss=loss, test_accuracy=accuracy)
        self.progress.write(f"epoch {epoch}: step {step} test_loss={loss:.4f} test_accuracy={accuracy:.4f}")

    def finish(self, steps, grad_bytes_per_step, status="ok", samples_seen=None, compute_s=None, wire=None,
               exchange_s=None, wait_s=None, input_s=None, **extra):
        """The summary; ``compute_s`` (common.model.probe), ``wire`` (Backend.wire_bytes) and a measured
        ``exchange_s``, ``wait_s`` or ``input_s`` make its per-step ``breakdown``."""
        if not self.enabled:
            return None
        stats = self.meter.stats()
        loss, acc = self.last_eval
        samples = samples_seen if samples_seen is not None else steps * self.plan.samples_per_update
        split = breakdown(compute_s, stats.get("median"), self.plan.workers, self.cfg.batch_size, wire, exchange_s,
                          wait_s, input_s)
        self.metrics.summary(status, steps, samples, stats, loss, acc,
                             grad_bytes_per_step, breakdown=split, wire=wire, **extra)
        self.progress.close()
        print(f"samples/sec: {format_throughput(stats)}  test_accuracy: "
              f"{acc if acc is None else round(acc, 4)}  time: {self.metrics.elapsed():.1f}s", flush=True)
        self.metrics.close()
        self.tb.close()
        return stats
