"""The pieces every trainer shares.

TF_USE_LEGACY_KERAS=1 before anything imports TensorFlow, where the ``tf-keras`` package (Keras 2)
is installed: from TensorFlow 2.16 on ``tf.keras`` is Keras 3, which ``horovod.tensorflow.keras`` and
the trainers' Keras 2 code cannot drive, and set-up adds ``tf-keras`` on those stacks
(hvdps/install/stack.py). Without it (TensorFlow 2.15, whose own ``tf.keras`` is Keras 2) the variable must
stay unset: 2.15 reads it too and then fails to find ``tf_keras``. A value the user set wins.
"""
import importlib.util
import os

if "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is not None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
