"""What the chief does around the training steps, one way for every backend.

Every loop (the all-reduce loop of Horovod and bare MPI, the classic PS
session loop, the TF2 PS coordinator, elastic Horovod) tells the bookkeeper
each global update it sees; the bookkeeper decides whether a log line, an
evaluation or a checkpoint is due, labels the epoch, and ends the run (final
evaluation, checkpoint, ``weights.npz``, compute probe, summary with its
breakdown). What differs by backend is only *how* a thing is done (averaging
a loss over ranks or reading it on the chief, evaluating on the PS weights or
on a replica, saving through a v1 Saver or a TF2 checkpoint): each loop hands
in an ``Adapter`` for that.

Due means crossed: a log is due when a multiple of ``--log_every`` global
updates lies between the update last seen and this one, so an asynchronous
chief whose global step jumps by several updates at once logs, evaluates and
checkpoints at the same boundaries as a synchronous loop that sees every
update. Every backend's intervals are therefore counted in global updates.
"""
import os

from common.model.models import gradient_sizes
from common.spec.precision import of_config as precision_of
from common.trainer.run_dir import save_weights_npz
from common.trainer.watchdog import check_alive


def crossed(prev, step, every):
    """Whether a multiple of ``every`` lies in (prev, step]; never for ``every`` <= 0."""
    return every > 0 and step // every > prev // every


class Adapter:
    """How one backend's loop reads a loss, evaluates, saves and sums up; the defaults suit a
    single process. ``evaluate`` and ``finish_extra`` are called on every rank (all-reduce
    backends make them collectives); ``save``, ``final_weights`` and ``compute_s`` on the chief only."""
    model = None

    def reduce_loss(self, losses):
        """The loss to log from the losses seen since the last log (all-reduce: averaged over ranks)."""
        return sum(losses) / len(losses)

    def lr(self, step):
        return None

    def log_extra(self, step):
        """Fields of the step record beyond loss and rate (PS: every worker's progress)."""
        return {}

    def evaluate(self, step):
        """(test loss, test accuracy) of the current weights."""
        raise NotImplementedError

    def save(self, step):
        """Write a checkpoint at global update ``step``."""
        raise NotImplementedError

    def final_weights(self):
        raise NotImplementedError

    def compute_s(self, cfg=None):
        """The step timed without the distribution method (common.model.probe), or None; ``cfg``: of
        another config than the run's (the same step in float32, beside an emulated policy's)."""
        return None

    def finish_extra(self, final):
        """Summary fields of this backend (weight divergence, lost workers, ...)."""
        return {}


class Bookkeeper:
    """Log, evaluate and checkpoint at the same global updates under every backend; end a run one way.

    Runs on every process of a job so that all-reduce backends reach their collectives together;
    only the chief saves and writes (``log`` is a RunLog that is silent elsewhere). Epochs are the
    plan's (every ``plan.updates_per_epoch`` updates) unless the loop counts them itself
    (elastic Horovod, whose world and so its updates per epoch change): it then passes
    ``epoch=0`` with each update and ``epoch=k`` (no loss) when epoch k has ended.
    """

    def __init__(self, cfg, plan, backend, log, adapter, start=0):
        self.cfg, self.plan, self.backend, self.log, self.adapter = cfg, plan, backend, log, adapter
        self.last = start
        self.losses = []
        self.last_loss = self.last_log = None
        self.evaluated_at = self.saved_at = None
        self.label = max(1, plan.epoch_of(start))
        self.events = []                          # (update, what): what the run did
        self.paused = False                       # an evaluation or a checkpoint since the last update
        self.started = None                       # the log an update has been told to: training started

    def due(self, prev, step, epoch=None):
        """What is due when the global step goes from ``prev`` to ``step``."""
        cfg = self.cfg
        end = step >= self.plan.total_updates if epoch is None else epoch == cfg.epochs
        epoch_ended = crossed(prev, step, self.plan.updates_per_epoch) if epoch is None else bool(epoch)
        out = []
        if end or crossed(prev, step, cfg.log_every):
            out.append("log")
        if end and epoch is None:
            # the last evaluation and checkpoint are finish()'s, at the job's final update: an
            # async chief sees the end while other workers' updates are still landing
            return out
        if end or (cfg.eval_every_epoch and epoch_ended) or crossed(prev, step, cfg.eval_every_steps):
            out.append("eval")
        if end or (crossed(prev, step, cfg.checkpoint_steps) if cfg.checkpoint_steps
                   else cfg.checkpoint_every_epoch and epoch_ended):
            out.append("checkpoint")
        return out

    def wants(self, step):
        """Whether update ``step`` (one after another, as a coordinator schedules them) needs anything."""
        return bool(self.due(step - 1, step))

    def restart(self, step):
        """Carry on from ``step`` (elastic: each (re)start from the state all ranks synced, a new rank too)."""
        self.last = step
        self.losses.clear()

    def after_update(self, step, loss, epoch=None, **extra):
        """Update ``step`` has been applied and ``loss`` is its (this worker's) loss, or None when
        only an epoch's end is told. ``extra`` goes into the step and eval records (elastic:
        samples_seen, world_size)."""
        if self.started is not self.log:          # time to the target counts from the first update's end
            self.log.training_started()           # (of each log: elastic Horovod's chief log comes later)
            self.started = self.log
        if loss is not None:
            self.losses.append(loss)
            self.last_loss = loss
        if self.paused:                           # the next throughput interval begins here, past the pause
            self.log.resumed(step, extra.get("samples_seen"))
            self.paused = False
        prev, self.last = self.last, step
        due = self.due(prev, step, epoch)
        if epoch:
            self.label = epoch
        elif epoch is None and crossed(prev, step, self.plan.updates_per_epoch):
            self.label = max(1, self.plan.epoch_of(step))   # crossed into the next epoch: the one that ended
        elif epoch is None:                       # inside an epoch (an eval every N updates): that epoch
            self.label = self.plan.epoch_label(step)
        if "log" in due and self.losses:
            self.write_log(step, **extra)
        if "eval" in due:
            self.evaluate(step, **extra)
        if "checkpoint" in due:
            self.save(step)
        if "eval" in due or "checkpoint" in due:
            self.log.paused()                     # the pause is no part of any throughput interval
            self.paused = True
        return due

    def write_log(self, step, **extra):
        value = float(self.adapter.reduce_loss(self.losses))
        check_alive(value)
        self.losses.clear()
        self.log.step(step, value, lr=self.adapter.lr(step), **self.adapter.log_extra(step), **extra)
        self.last_log = step
        self.events.append((step, "log"))

    def evaluate(self, step, **extra):
        self.log.eval(self.label, step, *self.adapter.evaluate(step), **extra)
        self.evaluated_at = step
        self.events.append((step, "eval"))

    def save(self, step):
        if self.backend.is_chief:                 # the chief alone writes checkpoints
            self.adapter.save(step)
        self.saved_at = step
        self.events.append((step, "checkpoint"))

    def finish(self, final, **extra):
        """End of the run at global update ``final``: evaluate and checkpoint what has not been,
        write the weights, time the bare step, and write the summary with its breakdown. A PS chief
        may not see the last updates itself (the other workers make them): a step record is still
        written at ``final``, as every loop ends with one, with the losses not yet logged (or,
        if there are none, the chief's latest)."""
        logged_end = self.last_log is not None and self.last_log >= min(final, self.plan.total_updates)
        if not logged_end and (self.losses or self.last_loss is not None):
            self.losses = self.losses or [self.last_loss]   # no batch of its own since: its latest
            self.write_log(final)
        if self.evaluated_at != final:
            if self.evaluated_at is None or final > self.evaluated_at:
                self.label = self.plan.epoch_label(final)   # the last epoch, even past the end
            self.evaluate(final)
        if self.saved_at != final:
            self.save(final)
        model = self.adapter.model
        compute_s = sizes = wire = None
        if self.backend.is_chief:
            save_weights_npz(self.adapter.final_weights(), os.path.join(self.cfg.train_dir, "weights.npz"))
            compute_s = self.adapter.compute_s()
            if compute_s and precision_of(self.cfg).emulated:     # what the emulation costs, measured here
                extra["float32_compute_s"] = self.adapter.compute_s(self.cfg.replace(precision="float32",
                                                                                     precision_auto=False))
            sizes = gradient_sizes(self.cfg, model)     # measured on a real batch
            wire = self.backend.wire_bytes(sizes, self.plan)
        extra.update(self.adapter.finish_extra(final))
        self.log.finish(final, self.backend.gradient_bytes(model), compute_s=compute_s,
                        gradient=sizes, wire=wire, checkpoints_at=self.at("checkpoint"), **extra)
        return extra

    def at(self, what):
        """The updates at which the run did ``what`` ("log", "eval" or "checkpoint")."""
        return [step for step, done in self.events if done == what]
