"""What a step, an update and an epoch mean for one run, computed once.

The two methods count differently: a Horovod step averages one batch from
every rank into one update; a synchronous PS update averages R worker batches;
an asynchronous PS update is one worker batch. Budgets are kept in samples so
both methods see the same data, and every figure that depends on this (the
trainers' stopping point, the learning-rate warm-up, samples/sec, the metrics
header) reads it from this one object instead of recomputing it.
"""
import dataclasses

from common.base.errors import UsageError


@dataclasses.dataclass(frozen=True)
class RunPlan:
    workers: int                  # training processes (ranks, or PS workers incl. a chief)
    batch_size: int               # per worker
    batches_per_update: int       # worker batches averaged into one update of the weights
    steps_per_epoch: int          # batches each worker runs per epoch
    worker_steps: int             # batches each worker runs in the whole run
    lr_scale: int                 # world-size factor of the learning-rate rule

    @property
    def samples_per_update(self):
        return self.batch_size * self.batches_per_update

    @property
    def updates_per_round(self):
        """Updates while every worker runs one step: 1 under all-reduce and sync PS, n async."""
        return max(1, self.workers // self.batches_per_update)

    @property
    def updates_per_epoch(self):
        return self.steps_per_epoch * self.workers // self.batches_per_update

    @property
    def total_updates(self):
        return self.worker_steps * self.workers // self.batches_per_update

    @property
    def samples_per_epoch(self):
        return self.steps_per_epoch * self.workers * self.batch_size

    @property
    def global_step_meaning(self):
        n = self.batches_per_update
        return (f"one update of the weights = {n} worker batch{'es' if n > 1 else ''} of {self.batch_size} "
                f"= {self.samples_per_update} samples")

    def epoch_of(self, update):
        """Epochs completed after ``update`` updates (what decides that an epoch's evaluation is due)."""
        return update // self.updates_per_epoch

    def epoch_label(self, update):
        """The epoch ``update`` belongs to, counting from 1: updates 1..U are epoch 1, U+1..2U epoch 2,
        so 150 updates at 100 per epoch end in epoch 2 under every backend. An asynchronous run can
        overshoot its last update by a few (workers in flight): those still belong to the last epoch."""
        last = -(-self.total_updates // self.updates_per_epoch)
        return max(1, min(-(-update // self.updates_per_epoch), last))

    def to_dict(self):
        d = dataclasses.asdict(self)
        d.update(samples_per_update=self.samples_per_update, updates_per_epoch=self.updates_per_epoch,
                 total_updates=self.total_updates, global_step_meaning=self.global_step_meaning)
        return d


def make_plan(cfg, num_examples, workers, batches_per_update, lr_scale=None):
    """Plan for ``workers`` processes, each update averaging ``batches_per_update`` batches.

    Synchronous all-reduce: batches_per_update = workers. Synchronous PS: R
    (replicas to aggregate). Asynchronous PS: 1. ``lr_scale`` defaults to the
    number of batches in one update (Goyal et al.: lr grows with the batch one
    update sees).
    """
    spe = steps_per_epoch(num_examples, workers, cfg.batch_size)
    worker_steps = cfg.train_steps if cfg.train_steps > 0 else cfg.epochs * spe
    return RunPlan(workers=workers, batch_size=cfg.batch_size, batches_per_update=batches_per_update,
                   steps_per_epoch=spe, worker_steps=worker_steps,
                   lr_scale=batches_per_update if lr_scale is None else lr_scale)


def steps_per_epoch(num_examples, num_shards, batch_size):
    """Steps each worker runs so that one epoch covers the data set once across workers."""
    steps = (num_examples // num_shards) // batch_size
    if steps == 0:
        raise UsageError(f"batch {batch_size} x {num_shards} workers exceeds the "
                         f"{num_examples} training examples: lower --batch_size")
    return steps
