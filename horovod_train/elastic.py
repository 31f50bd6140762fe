"""Elastic Horovod: training that survives ranks that die and grows when hosts come back.

    horovodrun -np 3 --min-np 2 --max-np 4 --host-discovery-script ./discover_hosts.sh \\
        --network-interface lo python horovod_train/main.py --elastic --commit_steps 10

(hostfiles/discover_hosts.sh prints ``host:slots`` lines; Horovod polls it.)

The state (weights, optimizer slots and iteration count, epoch, samples done
in the epoch, updates, samples) is committed every ``--commit_steps`` updates
and at each epoch end. When a rank dies, the survivors roll back to the last
commit; when the world changes size (a failure, or the discovery script adding
slots), every rank recomputes from the state what depends on the size:

- the learning rate: the warm-up rule of common.training with the *current*
  world size (Goyal et al.'s lr x workers), from the update count;
- the data: the current epoch's permutation, sharded over the new world,
  resumed at ``samples done // (batch x workers)``: with interleaved sharding
  the first k global batches are exactly the first k*b*n positions whatever n
  was, so no example is skipped (at most part of one batch is seen twice).

Only rank 0 writes metrics, checkpoints and weights; a process that becomes
rank 0 after a reset opens the metrics file and appends its own header.
"""
import os

from common.data import make_dataset
from common.models import gradient_bytes, gradient_sizes, train_step_fn
from common.probe import compute_step_time
from common.errors import UsageError
from common.plan import make_plan
from common.training import RunLog, eval_sums, finish_eval, save_weights_npz
from common.training import check_alive, create_slots


def lr_at(cfg, update, world_size, updates_per_epoch):
    """The lr rule of common.training.make_lr_schedule for a world size that may change."""
    peak = cfg.learning_rate * (world_size if cfg.scale_lr else 1)
    warmup = 0 if peak == cfg.learning_rate else cfg.lr_warmup_epochs * updates_per_epoch
    if warmup <= 0:
        return peak
    return cfg.learning_rate + (peak - cfg.learning_rate) * min(update / warmup, 1.0)


def train_elastic(cfg, args, backend, model, optimizer, num_train):
    import horovod.tensorflow as hvd
    import tensorflow as tf
    if cfg.resume:
        raise UsageError("--elastic does not resume from checkpoints yet: drop --resume (the elastic state "
                         "itself survives lost ranks)")
    create_slots(model, optimizer)                # Horovod: every rank has the state it will receive
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, epoch_samples=0, updates=0, samples=0)
    chief_log = None

    def log():
        """The RunLog of this process while it is rank 0 (created on first need), else a silent one."""
        nonlocal chief_log
        backend.refresh()
        if not backend.is_chief:
            return RunLog.disabled()
        if chief_log is None:
            plan = make_plan(cfg, num_train, backend.world_size, backend.world_size)
            chief_log = RunLog(cfg, backend, plan, start_step=state.updates,
                               extra_header={"elastic": True, "commit_steps": args.commit_steps})
        return chief_log

    train_step = tf.function(train_step_fn(model, optimizer, wrap_tape=backend.wrap_tape))  # Horovod: all-reduce

    def on_reset():
        backend.refresh()
        if backend.is_chief:
            print(f"elastic: the world is now {backend.world_size} rank(s); resuming at update {state.updates}",
                  flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run                              # Horovod: restore and retry on a lost rank / new hosts
    def train(state):
        while state.epoch < cfg.epochs:
            backend.refresh()
            n, b = backend.world_size, cfg.batch_size
            plan = make_plan(cfg, num_train, n, n)
            done = state.epoch_samples // (b * n)
            data = make_dataset(cfg, backend.rank, n, start_step=state.epoch * plan.steps_per_epoch + done,
                                num_steps=(state.epoch + 1) * plan.steps_per_epoch)
            losses = []
            for x, y in data:
                optimizer.lr.assign(lr_at(cfg, state.updates, n, plan.updates_per_epoch))
                losses.append(float(train_step(x, y)))
                state.updates += 1
                state.epoch_samples += b * n
                state.samples += b * n
                if state.updates % cfg.log_every == 0:
                    loss = float(backend.allreduce(sum(losses) / len(losses), "loss"))
                    check_alive(loss)
                    log().step(state.updates, loss, lr=float(optimizer.lr.numpy()), samples_seen=state.samples,
                               world_size=n)
                    losses.clear()
                if state.updates % args.commit_steps == 0:
                    state.commit()                # Horovod: a failure rolls back to here
            state.epoch += 1
            state.epoch_samples = 0
            test = make_dataset(cfg, backend.rank, n, split="test")
            log().eval(state.epoch, state.updates,
                       *finish_eval(backend.allreduce(eval_sums(model, test), "eval", op="sum")), world_size=n)
            state.commit()

    train(state)
    divergence = backend.max_divergence(model)
    final = log()
    sizes = compute_s = None
    if backend.is_chief:
        save_weights_npz(model.get_weights(), os.path.join(cfg.train_dir, "weights.npz"))
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
        tf.train.CheckpointManager(ckpt, os.path.join(cfg.train_dir, "checkpoints"), max_to_keep=3).save()
        compute_s = compute_step_time(cfg)        # the step without Horovod, as the other loops
        sizes = gradient_sizes(cfg, model)
    plan = make_plan(cfg, num_train, backend.world_size, backend.world_size)
    final.finish(state.updates, gradient_bytes(model), max_weight_divergence=divergence, samples_seen=state.samples,
                 compute_s=compute_s, gradient=sizes, wire=backend.wire_bytes(sizes, plan) if sizes else None)
    return 0
