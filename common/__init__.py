"""The pieces every trainer shares.

TF_USE_LEGACY_KERAS=1 before anything imports TensorFlow, where the ``tf-keras`` package (Keras 2)
is installed: from TensorFlow 2.16 on ``tf.keras`` is Keras 3, which ``horovod.tensorflow.keras`` and
the trainers' Keras 2 code cannot drive, and set-up adds ``tf-keras`` on those stacks
(hvdps/install/stack.py). Without it (TensorFlow 2.15, whose own ``tf.keras`` is Keras 2) the variable must
stay unset: 2.15 reads it too and then fails to find ``tf_keras``. A value the user set wins.

Full garbage collections a tenth as often as Python's default: one after 100 young ones, not 10.
A full pass walks every object the collector tracks, and importing TensorFlow leaves over 250,000 of
them; at the default a trainer ran five such passes before its first step, about 0.45 s of CPU in
every process of every run (BENCHMARKS.md, section 21). Young collections are as before, and a
2,000-step run made no full pass after its start-up at either setting: a step's garbage is freed as it was.
"""
import gc
import importlib.util
import os

gc.set_threshold(gc.get_threshold()[0], gc.get_threshold()[1], 100)

if "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is not None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
