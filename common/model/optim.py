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


def loss_scaled(cfg, optimizer, api="keras"):
    """``optimizer`` behind Keras' dynamic loss scaling under ``--precision mixed_float16``, as it is
    otherwise. Outside any distribution wrapper's own (Horovod's DistributedOptimizer for ``--loop
    fit``, the classic PS's SyncReplicasOptimizer goes outside it), so the gradients it unscales and
    checks are the exchanged ones and every worker agrees on a skipped step. Keras' LossScaleOptimizer
    (its scale starts at 2**15, halves on a non-finite gradient, doubles after
    ``--loss_scale_growth_steps`` finite ones, 2,000 as Keras') for
    the eager loops; TensorFlow's v1 MixedPrecisionLossScaleOptimizer, the same dynamic rule, for a
    ``tf.compat.v1.train`` optimizer in a graph."""
    if cfg.precision != "mixed_float16":
        return optimizer
    import tensorflow as tf
    growth = cfg.loss_scale_growth_steps
    if api == "v1":
        scale = tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=2 ** 15, increment_period=growth)
        return _counted_class()(optimizer, scale)
    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer, dynamic_growth_steps=growth)


_COUNTED = []


def _counted_class():
    """TensorFlow's v1 MixedPrecisionLossScaleOptimizer, except that a step whose update it skips (a
    non-finite gradient) still advances the global step. Every loop counts such a step as an update
    taken, as Keras' does, and the classic PS's global step is what its books, its workers' data
    streams and SyncReplicasOptimizer's tokens are counted in: a step that left it behind would end
    the run late and past the data each worker was given."""
    if _COUNTED:
        return _COUNTED[0]
    import tensorflow as tf

    class EveryStepCounted(tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer):
        def apply_gradients(self, grads_and_vars, global_step=None, name=None):
            update = super().apply_gradients(grads_and_vars, None, name)
            if global_step is None:
                return update
            with tf.control_dependencies([update]):
                return tf.compat.v1.assign_add(global_step, 1).op

        def loss_scale_tensor(self):
            """The scale now, as a tensor on the task that holds it (the classic PS chief logs it)."""
            return self._loss_scale()

    _COUNTED.append(EveryStepCounted)
    return EveryStepCounted


def is_loss_scaled(optimizer):
    """Whether ``optimizer`` is Keras' LossScaleOptimizer (its step scales the loss and unscales the
    gradients: common/model/models.py, train_step_fn)."""
    return hasattr(optimizer, "get_scaled_loss") and hasattr(optimizer, "inner_optimizer")


def loss_scale_of(optimizer):
    """The loss scale a Keras LossScaleOptimizer holds now, as a float; None for any other optimizer."""
    return float(optimizer.loss_scale) if is_loss_scaled(optimizer) else None


def create_slots(model, optimizer):
    """Create the optimizer's variables (slots, iteration count) now, on every rank.

    Keras creates them on the first apply_gradients; a resumed run must have them
    before rank 0 restores and broadcasts, or ranks 1..n-1 hang in the broadcast
    (Horovod and bare MPI alike).
    """
    getattr(optimizer, "inner_optimizer", optimizer)._create_all_weights(model.trainable_variables)
