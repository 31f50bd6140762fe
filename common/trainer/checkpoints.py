"""Checkpoints of weights, optimizer slots and the global step, saved and restored together.

TensorFlow's ``tf.train.CheckpointManager`` under one class that every eager loop uses; a failed save
(a full disk) leaves only whole checkpoints behind and ends the run with one line.
"""
import os
import shutil

from common.base.errors import RunError, UsageError, describe


def remove_partial_checkpoints(directory):
    """After a failed save: TensorFlow's half-written ``<prefix>_temp...`` files and folders go,
    so a full disk leaves only whole checkpoints behind."""
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
