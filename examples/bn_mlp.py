"""A model with state of its own: hvdps compare --model examples/bn_mlp.py:build ...

BatchNormalization keeps a moving mean and variance that training updates
outside the optimizer, and the L2 kernel regularizer adds a loss term of the
model's own (``model.losses``). Every backend applies both as a single process
does (docs/plugins.md, "Models with state"); this model is how the tests check it.
"""
import tensorflow as tf


def build(cfg, input_shape, num_classes):
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input(input_shape),
        layers.Flatten(),
        layers.Dense(64, use_bias=False, kernel_regularizer=tf.keras.regularizers.l2(1e-4)),
        layers.BatchNormalization(),
        layers.ReLU(),
        layers.Dense(num_classes),          # logits: no softmax
    ], name="bn_mlp")
