"""A model plug-in written with Keras 3 (``import keras``), as TensorFlow 2.16 and later teach it:
hvdps compare --model examples/my_keras3_model.py:build --backends horovod,mpi,ps2 ...

The same small CNN as my_model.py. hvdps trains it under Horovod, bare MPI and TF2's
ParameterServerStrategy (``ps2``) through the tf.Variables its layers compute with
(common/spec/keras3.py); the classic TF1 parameter servers (``ps``) refuse it in one line.
"""
import keras


def build(cfg, input_shape, num_classes):
    layers = keras.layers
    return keras.Sequential([
        layers.Input(input_shape),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(num_classes),          # logits: no softmax
    ], name="my_keras3_cnn")
