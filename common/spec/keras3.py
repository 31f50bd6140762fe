"""A model plug-in written with ``import keras`` (Keras 3), trained by the trainers' one code path.

The trainers drive Keras 2 (``tf.keras``: tf-keras under TF_USE_LEGACY_KERAS=1) on every stack:
its optimizers, its ``fit`` and Horovod's Keras integration. A Keras 3 model on the TensorFlow
backend computes with plain ``tf.Variable`` objects, each held as ``.value`` by a Keras 3 variable,
and reads them on every call. ``Keras3Model`` is a Keras 2 model that calls the Keras 3 model and
tracks exactly those ``tf.Variable`` objects, trainable and not, in the Keras 3 model's order. So
the gradient tape (Horovod's included), the optimizers, checkpoints, ``get_weights`` and
``model.fit`` see ordinary variables, and the Keras 3 model's layers still do the computing; there is
no second copy of any weight. The run records which Keras built its model (``keras_of``).

Not offered: the classic TF1 PS (``ps_train/graph.py``) builds its model in a TF1 graph inside
``replica_device_setter`` and runs it in a TF1 session, which Keras 3 does not support
(its state updates, seed generators and variable creation assume eager or ``tf.function``);
``refuse_graph_mode`` says so in one line, with what to use instead.
"""
import sys
from importlib.metadata import version

from common.base.errors import UsageError


def is_keras3_model(model):
    """True for a ``keras.Model`` of Keras 3 (``keras`` >= 3 installed and imported)."""
    keras = sys.modules.get("keras")
    if keras is None or not str(getattr(keras, "__version__", "0")).startswith("3"):
        return False
    return isinstance(model, keras.Model)


def seed_keras3(seed):
    """Seed Keras 3's own generators too, where a plug-in has imported it: its initializers given no
    seed draw from Keras 3's global SeedGenerator, which ``tf.random.set_seed`` does not reach."""
    keras = sys.modules.get("keras")
    if keras is not None and str(getattr(keras, "__version__", "0")).startswith("3"):
        keras.utils.set_random_seed(seed)


def wrap(model):
    """The Keras 2 model that trains ``model`` (a built Keras 3 model)."""
    import tensorflow as tf

    class Keras3Model(tf.keras.Model):
        def __init__(self, inner):
            super().__init__(name=inner.name)
            self.__dict__["keras3_model"] = inner       # not tracked: its variables are, below, once each
            self.keras3_trainable = [v.value for v in inner.trainable_variables]
            self.keras3_state = [v.value for v in inner.non_trainable_variables]

        def call(self, inputs, training=False):
            return self.keras3_model(inputs, training=training)

        # In the Keras 3 model's order, a partitioned variable (ParameterServerStrategy's ShardedVariable)
        # as its shards in place, as tf.keras lists a partitioned weight of its own layers.
        @property
        def trainable_weights(self):
            return _shards_in_place(self.keras3_trainable) if self.trainable else []

        @property
        def non_trainable_weights(self):
            return _shards_in_place(self.keras3_state) + (
                [] if self.trainable else _shards_in_place(self.keras3_trainable))

        @property
        def _undeduplicated_weights(self):
            return self.trainable_weights + self.non_trainable_weights

        @property
        def losses(self):                               # regularizers and add_loss of the Keras 3 layers
            return list(self.keras3_model.losses)

        @property
        def keras_layers(self):
            return list(self.keras3_model._flatten_layers(include_self=False))

    return Keras3Model(model)


def is_wrapped(model):
    return hasattr(model, "keras3_model")


def _shards_in_place(variables):
    """A variable partitioned by the strategy in scope (a ShardedVariable: no tf.Variable itself, its
    shards in ``.variables``) as its shards, the rest as they are; no tf.distribute import in common/."""
    import tensorflow as tf
    out = []
    for v in variables:
        out += [v] if isinstance(v, tf.Variable) else list(v.variables)
    return out


def keras_of(model):
    """Which Keras built ``model``, as the report shows it: 'keras 3.x' for a Keras 3 plug-in,
    'tf-keras 2.x' where tf.keras is tf-keras, else tf.keras's own Keras ('keras 2.15.0' on TF 2.15)."""
    import tensorflow as tf
    if not is_wrapped(model) and getattr(tf.keras, "__name__", "").startswith("tf_keras"):
        return f"tf-keras {version('tf-keras')}"
    import keras
    return f"keras {keras.__version__}"


def refuse_graph_mode(cfg, model):
    """The classic PS trains TF1 graphs (replica_device_setter, a TF1 session): refuse a
    Keras 3 plug-in in one line that says what to use instead."""
    if is_wrapped(model):
        raise UsageError(f"--model {cfg.model}: a Keras 3 model (import keras) cannot train under the classic "
                         f"parameter servers (--ps_api v1), which build TF1 graphs: use --ps_api v2 "
                         f"(ParameterServerStrategy), Horovod or bare MPI, or write the plug-in with tf.keras")
