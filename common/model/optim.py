"""The update rule every loop shares: the learning-rate warm-up and the optimizer's slots.

Pure TensorFlow (no Horovod, no tf.distribute), so the all-reduce loops and the PS graph apply the
identical learning-rate rule, and every rank holds the optimizer's variables before a restore.
"""
import numpy as np


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

        def at(self, step):
            """The rate at update ``step`` as a Python float, in float32 arithmetic as ``__call__``
            computes it (the same bits, tests/test_optim.py): a PS chief logs the rate of the step
            it reached without asking the PS, where the schedule runs, for it."""
            f32 = np.float32
            if self.warmup_steps == 0:
                return float(f32(self.peak))
            frac = min(f32(step) / f32(self.warmup_steps), f32(1.0))
            return float(f32(self.base) + f32(self.peak - self.base) * frac)

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


def create_slots(model, optimizer):
    """Create the optimizer's variables (slots, iteration count) now, on every rank.

    Keras creates them on the first apply_gradients; a resumed run must have them
    before rank 0 restores and broadcasts, or ranks 1..n-1 hang in the broadcast
    (Horovod and bare MPI alike).
    """
    optimizer._create_all_weights(model.trainable_variables)
