"""A model plug-in: hvdps compare --model examples/my_model.py:build ...

hvdps calls ``build(cfg, input_shape, num_classes)`` on every worker and adds the
optimizer, the loss (sparse softmax cross-entropy on the logits) and the
distribution. Return an *uncompiled* Keras model whose output is logits.
"""
import tensorflow as tf


def build(cfg, input_shape, num_classes):
    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input(input_shape),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(num_classes),          # logits: no softmax
    ], name="my_small_cnn")
