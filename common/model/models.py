"""Models every method trains.

Initial weights of the MLP and CNN come from NumPy, seeded by ``cfg.seed``, not
from TensorFlow's RNG: TF draws different numbers in eager mode (Horovod) and in
graph mode (the PS backend's between-graph replication), and the equivalence
tests need every backend and every worker count to start from the same point.
"""
import contextlib

import numpy as np

from common.inputs.data import input_spec, make_dataset
from common.spec.builtins import model_of, TRANSFORMER_SIZES
from common.spec.plugins import build_model as build_plugin, seed_everything, is_plugin
from common.spec.keras3 import refuse_graph_mode, is_wrapped
from common.model.optim import is_loss_scaled


def _numpy_initializer(tf, seed, kind, draws=None):
    """A Keras initializer drawing from NumPy at ``seed``. ``draws`` (a list holding a count, shared by
    every initializer of one model build): each call draws at ``seed`` plus the count so far, so
    layers that clone their initializer from its config (MultiHeadAttention's query, key, value and
    output kernels) still start apart, and the same build draws the same weights in every backend (the
    variables are created in the same order in eager, graph and strategy code)."""
    class NumpyInit(tf.keras.initializers.Initializer):
        def __init__(self, seed, kind):
            self.seed, self.kind = seed, kind

        def __call__(self, shape, dtype=None, **kwargs):
            shape = tuple(int(s) for s in shape)
            seed = self.seed
            if draws is not None:
                seed = (seed + 7919 * draws[0]) % 2 ** 32
                draws[0] += 1
            rng = np.random.RandomState(seed)
            if self.kind == "zeros":
                value = np.zeros(shape, np.float32)
            elif self.kind == "embedding":   # Keras' Embedding default: uniform in [-0.05, 0.05]
                value = rng.uniform(-0.05, 0.05, size=shape).astype(np.float32)
            else:  # Glorot uniform, as Keras' default, with fan-in/out of dense and conv kernels
                receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
                fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
                limit = np.sqrt(6.0 / (fan_in + fan_out))
                value = rng.uniform(-limit, limit, size=shape).astype(np.float32)
            return tf.constant(value, dtype=dtype or tf.float32)

        def get_config(self):
            return {"seed": self.seed, "kind": self.kind}

    return NumpyInit(seed, kind)


def build_model(cfg, check_step=True):
    """An uncompiled Keras model for ``cfg.model`` whose input follows ``cfg.dataset``, its layers made
    under ``--precision``'s policy; a plug-in's is checked with one training step unless a strategy owns
    its variables (``check_step``)."""
    import tensorflow as tf
    with precision_policy(tf, cfg.precision):
        return _build(tf, cfg, check_step)


@contextlib.contextmanager
def precision_policy(tf, precision):
    """Keras' global mixed-precision policy set to ``precision`` while a model is built, and put back
    after: a layer keeps the policy it was made under (its compute dtype, its float32 variables), and
    nothing else of the process (a probe's model of another run, a test's) inherits it."""
    mp = tf.keras.mixed_precision
    previous = mp.global_policy()
    mp.set_global_policy(precision)
    try:
        yield
    finally:
        mp.set_global_policy(previous)


def _build(tf, cfg, check_step):
    shape, classes = input_spec(cfg)
    model = model_of(cfg)
    if model is None:
        return build_plugin(cfg, shape, classes, check_step)     # Config has checked it is a plug-in
    if model.application:
        seed_everything(tf, cfg.seed)
        build = getattr(tf.keras.applications, model.application)
        return build(weights=None, input_shape=shape, classes=classes, classifier_activation=None)
    init = lambda i: dict(kernel_initializer=_numpy_initializer(tf, cfg.seed * 100 + i, "glorot"),
                          bias_initializer=_numpy_initializer(tf, 0, "zeros"))
    if model.text:
        return build_transformer(tf, cfg, shape, classes)
    return BUILDERS[model.name](tf, tf.keras.layers, cfg, shape, classes, init)


def build_transformer(tf, cfg, shape, classes):
    """The transformer of ``cfg`` on sequences of ``shape`` over ``classes`` tokens, its weights drawn
    in order from ``cfg.seed`` (the projection's layer profile builds GPT-2's vocabulary and context)."""
    draws = [0]
    init = lambda kind: _numpy_initializer(tf, cfg.seed * 100, kind, draws)
    return _transformer(tf, tf.keras.layers, cfg, shape, classes, init)


def _mlp(tf, L, cfg, shape, classes, init):
    """The classic distributed-TF example: flatten -> hidden (ReLU) -> 10 logits."""
    return tf.keras.Sequential([
        L.Input(shape),
        L.Flatten(),
        L.Dense(cfg.hidden_units, activation="relu", **init(1)),
        L.Dense(classes, **init(2)),
    ], name="mlp")


def _cnn(tf, L, cfg, shape, classes, init):
    return tf.keras.Sequential([
        L.Input(shape),
        L.Conv2D(32, 3, padding="same", activation="relu", **init(1)),
        L.Conv2D(64, 3, padding="same", activation="relu", **init(2)),
        L.MaxPooling2D(2),
        L.Flatten(),
        L.Dense(128, activation="relu", **init(3)),
        L.Dense(classes, **init(4)),
    ], name="cnn")


def _rec(tf, L, cfg, shape, classes, init):
    """Recommendation-style: each categorical feature's id looks up a row of its own table (one
    Embedding of features x rows, ids offset per feature), the rows are concatenated into an MLP. Its
    gradient is sparse: only the looked-up rows (tf.IndexedSlices)."""
    offsets = np.arange(shape[0], dtype=np.int64) * cfg.embedding_rows
    return tf.keras.Sequential([
        L.Input(shape, dtype="int64"),
        L.Lambda(lambda ids: ids + offsets, name="feature_offsets"),
        L.Embedding(shape[0] * cfg.embedding_rows, cfg.embedding_dim, name="embedding",
                    embeddings_initializer=_numpy_initializer(tf, cfg.seed * 100, "embedding")),
        L.Flatten(),
        L.Dense(cfg.hidden_units, activation="relu", **init(1)),
        L.Dense(classes, **init(2)),
    ], name="rec")


def _transformer(tf, L, cfg, shape, classes, init):
    """A decoder-only, byte-level language model of ``--transformer_size``, GPT-2's layout: token and
    position embeddings, blocks of causal Keras MultiHeadAttention and a GELU MLP, each behind a
    LayerNormalization and added back (pre-norm residuals), a final LayerNormalization, and logits
    from the token embedding itself (tied: the output layer is the embedding's transpose). No dropout:
    every backend and worker count must compute the same function. Its logits are [batch, seq_len,
    classes]: a next-byte distribution at every position."""
    size = TRANSFORMER_SIZES[cfg.transformer_size]
    width, positions = size.width, shape[0]
    dense = lambda units, **kw: dict(units=units, kernel_initializer=init("glorot"), bias_initializer=init("zeros"), **kw)

    class Positions(L.Layer):
        """Adds a learned vector per position."""
        def build(self, input_shape):
            self.table = self.add_weight(name="positions", shape=(positions, width), initializer=init("embedding"))

        def call(self, h):
            return h + tf.cast(self.table, h.dtype)[None, :tf.shape(h)[1]]

    class TiedLogits(L.Layer):
        """Logits as the hidden state times the token embedding's transpose; the table is reached through
        a function, so it is the embedding's weight alone (not tracked, nor counted, twice)."""
        def __init__(self, table, tied_to, **kw):
            super().__init__(**kw)
            self.table, self.tied_to = table, tied_to      # tied_to: the layer profile counts its FLOPs there

        def call(self, h):
            return tf.matmul(h, tf.cast(self.table(), h.dtype), transpose_b=True)

    ids = L.Input(shape, dtype="int32", name="bytes")
    embedding = L.Embedding(classes, width, embeddings_initializer=init("embedding"), name="tokens")
    h = Positions(name="positions")(embedding(ids))
    for b in range(size.layers):
        a = L.LayerNormalization(epsilon=1e-5, name=f"block{b}_ln1")(h)
        a = L.MultiHeadAttention(size.heads, width // size.heads, kernel_initializer=init("glorot"),
                                 bias_initializer=init("zeros"), name=f"block{b}_attention")(
            a, a, use_causal_mask=True)
        h = L.Add(name=f"block{b}_add1")([h, a])
        m = L.LayerNormalization(epsilon=1e-5, name=f"block{b}_ln2")(h)
        m = L.Dense(**dense(size.mlp, activation="gelu"), name=f"block{b}_mlp_in")(m)
        m = L.Dense(**dense(width), name=f"block{b}_mlp_out")(m)
        h = L.Add(name=f"block{b}_add2")([h, m])
    h = L.LayerNormalization(epsilon=1e-5, name="final_ln")(h)
    logits = TiedLogits(lambda: embedding.embeddings, embedding.name, name="logits")(h)
    return tf.keras.Model(ids, logits, name=f"transformer_{size.name}")


# Each built-in model's builder, by the name common/spec/builtins.py declares it under (a Keras
# application is built from its declaration).
BUILDERS = {"mlp": _mlp, "cnn": _cnn, "rec": _rec, "transformer": _transformer}


def check_plugin(cfg, graph_mode=False):
    """Before any task starts (hvdps compare and the local launchers, for every method) or a classic-PS
    worker joins: a model plug-in built once and taken through one eager training step (output shape
    and type, training mode, the gradient path: common/spec/plugins.py, check_training_step), since the
    strategies (MWMS, TF2 PS) build their model in their scope and the classic PS in its graph, where
    that step cannot run first. ``graph_mode``: it will train under the classic PS, which also
    refuses Keras 3 (check_plugin_for_graph_mode). Built-in models need neither."""
    if not is_plugin(cfg.model):
        return
    import tensorflow as tf
    if tf.executing_eagerly():
        build_model(cfg)        # eager, outside any strategy: the checked step; the model is thrown away
    if graph_mode:
        check_plugin_for_graph_mode(cfg)


def check_plugin_for_graph_mode(cfg):
    """Before a classic-PS task joins its job (or the launcher starts any): build a model plug-in once
    and refuse Keras 3 (common/spec/keras3.py). In a graph of its own, thrown away: tf-keras names layers
    per graph, so the trainer's own graph gets the same variable names as without this check."""
    if is_plugin(cfg.model):
        import tensorflow as tf
        with tf.Graph().as_default():
            refuse_graph_mode(cfg, build_model(cfg))


def num_parameters(model):
    return int(sum(int(np.prod(w.shape)) for w in model.trainable_weights))


def gradient_bytes(model):
    """Bytes one worker sends per step (float32 gradients of every trainable weight)."""
    return 4 * num_parameters(model)


def has_sparse_gradients(model):
    """True for models with an embedding lookup: their table's gradient is tf.IndexedSlices."""
    import tensorflow as tf
    if is_wrapped(model):                        # a Keras 3 plug-in (common/spec/keras3.py)
        import keras
        return any(isinstance(layer, keras.layers.Embedding) for layer in model.keras_layers)
    return any(isinstance(layer, tf.keras.layers.Embedding) for layer in model.submodules)


def gradient_sizes(cfg, model):
    """What one worker's gradient of one batch really is, the input of every backend's wire rule
    (allreduce.backend, ps_train.backend): ``dense_bytes`` (float32 tensors sent whole), and for embedding tables
    ``sparse_bytes`` (the tf.IndexedSlices TensorFlow produces: one row of values and one index
    per id looked up, duplicates included, as they are sent), ``sparse_table_bytes`` (the same
    tables sent dense), ``sparse_rows`` and ``sparse_unique_rows`` (rows looked up per batch).

    Measured, not assumed: a fresh copy of the model takes the gradient of one real batch of
    this run's data in a graph of its own (so a PS chief in graph mode and an eager rank 0 measure
    alike). A model without embeddings is all dense, counted from its weights with no step run.
    """
    dense_only = {"dense_bytes": gradient_bytes(model), "sparse_bytes": 0, "sparse_table_bytes": 0,
                  "sparse_rows": 0, "sparse_unique_rows": 0}
    if not has_sparse_gradients(model):
        return dense_only
    import tensorflow as tf
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x, y = v1.data.make_one_shot_iterator(make_dataset(cfg, 0, 1, num_steps=1)).get_next()
        fresh = build_model(cfg)
        variables = fresh.trainable_variables
        grads = tf.gradients(total_loss(fresh, y, fresh(x, training=True)), variables)
        sparse = {i: (g.values, g.indices) for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)}
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            values = sess.run(sparse)
    out = dict(dense_only, dense_bytes=0)
    for i, v in enumerate(variables):
        size = 4 * int(np.prod(v.shape))
        if i in values:
            rows, index = values[i]
            out["sparse_bytes"] += int(rows.nbytes + index.nbytes)
            out["sparse_table_bytes"] += size
            out["sparse_rows"] += int(index.size)
            out["sparse_unique_rows"] += int(np.unique(index).size)
        else:
            out["dense_bytes"] += size
    return out


def loss_fn():
    """The criterion Keras' ``fit`` is compiled with (it adds ``model.losses`` itself), on float32
    logits as ``total_loss``'s."""
    import tensorflow as tf

    def cross_entropy(labels, logits):
        return tf.keras.losses.sparse_categorical_crossentropy(labels, float32(tf, logits), from_logits=True)
    return cross_entropy


def float32(tf, logits):
    """Logits as float32 before the softmax and the loss: a model built under a mixed policy computes
    them in bfloat16 or float16, whose 8 or 11 bits of mantissa would round the cross-entropy of a
    256-way (or 1,000-way) softmax and whose float16 range would overflow its exponentials (Keras'
    mixed-precision guide keeps the model's outputs in float32 for this reason)."""
    return tf.cast(logits, tf.float32) if logits.dtype != tf.float32 else logits


def total_loss(model, labels, logits):
    """What every custom loop minimises: the batch's mean cross-entropy plus the model's own losses.

    ``model.losses`` holds what layers add themselves (kernel regularizers, ``add_loss``);
    Keras' ``fit`` adds them to the compiled loss, so a custom loop that left them out would
    train a different objective than ``fit`` and than a single process does. The mean by hand,
    not a Keras Loss object: those refuse their default reduction inside a tf.distribute
    strategy, and the same formula must hold under every backend.
    """
    import tensorflow as tf
    logits = float32(tf, logits)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    return loss + tf.add_n([tf.cast(extra, tf.float32) for extra in model.losses]) if model.losses else loss


def state_updates(model, inputs):
    """The ops that update the model's non-trainable state on ``model(inputs, training=True)``
    in a TF1 graph (BatchNormalization's moving mean and variance, any ``add_update``).

    Eager code and ``tf.function`` apply them as the model runs; a graph built for a
    session does not: they must be run with the train op, or the state never moves
    (and evaluation with ``training=False`` reads the initial 0 and 1). ``model.updates``
    also lists the conditional ops of the model's symbolic construction, which are tied
    to its Keras Input and cannot run; only the updates of this call (and any
    unconditional ones) are returned.
    """
    return list(model.get_updates_for(inputs)) + list(model.get_updates_for(None))


def train_step_fn(model, optimizer, wrap_tape=None):
    """One step of data parallelism's inner loop, as a plain function of a batch.

    The one train step of every eager loop: the Horovod and bare-MPI loops and
    elastic Horovod wrap the tape (``wrap_tape``: where the gradients are
    all-reduced), the compute probe leaves it alone, and the TF2 strategy's chief
    runs it per replica. Callers wrap it in ``tf.function`` (or ``strategy.run``).
    The loss is ``common.model.models.total_loss``, the model's own losses included.

    Under ``--precision mixed_float16`` the optimizer is Keras' LossScaleOptimizer (optim.loss_scaled):
    the loss is multiplied by its scale before the gradient, so that small gradients survive float16,
    and the gradients divided by it again after the exchange, as Horovod's and Keras' guides do it.
    Every rank unscales the same all-reduced sums, so every rank skips a non-finite step and halves its
    scale alike; the wire carries the float32 gradients of the float32 variables either way.
    """
    import tensorflow as tf

    scaled = is_loss_scaled(optimizer)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = total_loss(model, y, model(x, training=True))
            target = optimizer.get_scaled_loss(loss) if scaled else loss    # mixed_float16: loss x scale
        if wrap_tape is not None:
            tape = wrap_tape(tape)
        grads = tape.gradient(target, model.trainable_variables)   # exchanged scaled, as they were computed
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))   # skipped, scale halved, if not finite
        return loss
    return step


def make_optimizer(cfg, learning_rate, api="keras"):
    """The optimizer before any distribution wrapper; ``learning_rate`` may be a schedule
    (Keras) or a tensor (v1).

    One rule, two APIs: Horovod's DistributedOptimizer wraps a Keras optimizer,
    TensorFlow's SyncReplicasOptimizer only a ``tf.compat.v1.train`` one.
    """
    import tensorflow as tf
    keras, v1 = tf.keras.optimizers.legacy, tf.compat.v1.train
    if cfg.optimizer == "sgd":
        return keras.SGD(learning_rate) if api == "keras" else v1.GradientDescentOptimizer(learning_rate)
    if cfg.optimizer == "momentum":
        return (keras.SGD(learning_rate, momentum=cfg.momentum) if api == "keras"
                else v1.MomentumOptimizer(learning_rate, cfg.momentum))
    return keras.Adam(learning_rate) if api == "keras" else v1.AdamOptimizer(learning_rate)


def eval_batch_sums(logits, labels):
    """[sum of losses, correct predictions, examples] of one batch, as float64.

    Sums, not means, so workers' and batches' parts add up to the whole test
    set exactly; the eager (Horovod) and graph (PS) evaluations both use it.
    A language model's every position is an example (its accuracy: next-byte).
    """
    import tensorflow as tf
    labels, logits = tf.cast(labels, tf.int32), float32(tf, logits)
    losses = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    correct = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)
    return tf.stack([tf.reduce_sum(tf.cast(losses, tf.float64)),
                     tf.reduce_sum(tf.cast(correct, tf.float64)),
                     tf.cast(tf.size(labels), tf.float64)])
