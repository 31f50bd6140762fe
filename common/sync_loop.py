"""The synchronous data-parallel loop both all-reduce trainers run (Horovod and bare MPI).

Backend-neutral: it calls only ``backend.wrap_tape`` (where gradients start to
be exchanged), ``backend.allreduce`` (metrics) and ``backend.is_chief``, so the
Horovod trainer and the bare-MPI reference time exactly the same step and log
it the same way; the difference between them is the exchange and nothing else.
"""
from common.data import make_dataset
from common.models import train_step_fn
from common.training import check_alive, checkpoint_interval, eval_sums, finish_eval


class EndOfStep:
    """After every update: the averaged loss every --log_every, evaluation per epoch, checkpoints."""

    def __init__(self, cfg, backend, plan, model, optimizer, log, checkpoints):
        self.cfg, self.backend, self.plan, self.model, self.optimizer = cfg, backend, plan, model, optimizer
        self.log, self.checkpoints = log, checkpoints
        self.test_ds = make_dataset(cfg, backend.rank, backend.world_size, split="test")
        self.checkpoint_every = checkpoint_interval(cfg, plan)

    def __call__(self, step, losses):
        last = step == self.plan.total_updates
        if step % self.cfg.log_every == 0 or last:
            loss = float(self.backend.allreduce(sum(losses) / len(losses), "loss"))  # all-reduce: average
            check_alive(loss)
            self.log.step(step, loss, lr=float(self.optimizer.lr(step)))
            losses.clear()
        if (step % self.plan.updates_per_epoch == 0 and self.cfg.eval_every_epoch) or last:
            # all-reduce: each rank scores its slice of the test set; the sums are all-reduced.
            sums = self.backend.allreduce(eval_sums(self.model, self.test_ds), "eval", op="sum")
            self.log.eval(self.plan.epoch_label(step), step, *finish_eval(sums))
        if self.backend.is_chief and (step % self.checkpoint_every == 0 or last):
            self.checkpoints.save(step)          # rank 0 only writes checkpoints


def run_custom(backend, model, optimizer, train_ds, start_step, end_of_step):
    import tensorflow as tf
    train_step = tf.function(train_step_fn(model, optimizer, wrap_tape=backend.wrap_tape))  # all-reduce
    losses, step = [], start_step
    for x, y in train_ds:
        losses.append(float(train_step(x, y)))
        step += 1
        end_of_step(step, losses)
