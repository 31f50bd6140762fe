"""TF2 PS's checkpoints (ps_train/v2.py): the PS variables saved from, and restored through, a copy
of the model and optimizer held on the chief."""
import numpy as np

from common.base.errors import RunError

from common.model.models import build_model, make_optimizer
from common.model.optim import make_lr_schedule
from common.trainer.checkpoints import Checkpoints


class MirroredCheckpoints:
    """Checkpoints of the PS variables, written from a copy held on the chief.

    Why a copy: TensorFlow 2.15 saves variables spread over several tasks
    from a freshly traced function that it registers on every worker, and
    while a lost worker is being waited for (the coordinator's recovery
    thread holds the eager context), that registration blocks the chief for
    good. Plain eager reads and assigns do not. So each save reads the PS
    variables into an unsharded copy of the model and optimizer on the chief
    and checkpoints that locally; a restore goes the other way. The files
    have the Horovod trainer's layout (whole variables, slots, step).
    """

    def __init__(self, cfg, plan, model, optimizer):
        self.shadow_model = build_model(cfg)     # outside the strategy's scope: on the chief
        self.shadow_optimizer = make_optimizer(cfg, make_lr_schedule(cfg, plan))
        self.shadow_optimizer._create_all_weights(self.shadow_model.trainable_variables)
        self.inner = Checkpoints(cfg, self.shadow_model, self.shadow_optimizer)
        self.pairs = _pairs(model, optimizer, self.shadow_model, self.shadow_optimizer)

    def restore(self, cfg):
        step = self.inner.restore(cfg)
        if cfg.resume:
            for whole, shards in self.pairs:     # PS: the restored values onto the PS tasks
                value = whole.numpy()
                cuts = np.cumsum([s.shape[0] for s in shards])[:-1] if len(shards) > 1 else []
                for shard, part in zip(shards, np.split(value, cuts) if len(shards) > 1 else [value]):
                    shard.assign(part)
        return step

    def pull(self):
        for whole, shards in self.pairs:         # PS: plain eager reads of the PS variables
            whole.assign(np.concatenate([s.numpy() for s in shards]) if len(shards) > 1 else shards[0].numpy())

    def save(self, step):
        self.pull()
        self.inner.save(step)


def _pairs(model, optimizer, shadow_model, shadow_optimizer):
    """[(whole variable on the chief, [its shards on the PS tasks])] for weights, slots, step count."""
    whole, groups = _sharded(model), []
    for v in model.weights:                      # Keras lists a split variable's shards one by one
        owner = whole.get(id(v))
        if groups and owner is not None and groups[-1][0] is owner:
            groups[-1][1].append(v)
        else:
            groups.append((owner, [v]))
    shards_of = [shards for _, shards in groups]
    if [tuple(w.shape) for w in shadow_model.weights] != \
            [(sum(s.shape[0] for s in shards), *shards[0].shape[1:]) for shards in shards_of]:
        raise RunError("chief: the model's PS variables do not match its copy on the chief")
    pairs = list(zip(shadow_model.weights, shards_of))
    trainable = {id(v) for v in model.trainable_variables}
    for w, shards in zip(shadow_model.weights, shards_of):
        if id(shards[0]) not in trainable:
            continue
        for slot in optimizer.get_slot_names():
            pairs.append((shadow_optimizer.get_slot(w, slot), [optimizer.get_slot(s, slot) for s in shards]))
    pairs.append((shadow_optimizer.iterations, [optimizer.iterations]))
    return pairs


def _sharded(model):
    """{id(shard): the ShardedVariable}: Keras lists a partitioned variable's shards one by one."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable
    whole = {}
    for layer in [model, *model.submodules]:
        for value in vars(layer).values():
            # a list attribute too: a Keras 3 plug-in's variables (common/spec/keras3.py)
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, ShardedVariable):
                    for shard in item.variables:
                        whole[id(shard)] = item
    return whole
