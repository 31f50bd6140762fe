"""Elastic Horovod: training that survives ranks that die and grows when hosts come back.

    horovodrun -np 3 --min-np 2 --max-np 4 --host-discovery-script ./discover_hosts.sh \\
        --network-interface lo python horovod_train/main.py --elastic --commit_steps 10

(hostfiles/discover_hosts.sh prints ``host:slots`` lines; Horovod polls it.)

The state (weights, optimizer slots and iteration count, epoch, samples done
in the epoch, updates, samples) is committed every ``--commit_steps`` updates
and at each epoch end. When a rank dies, the survivors roll back to the last
commit; when the world changes size (a failure, or the discovery script adding
slots), every rank recomputes from the state what depends on the size:

- the learning rate: the warm-up rule of common.model.optim with the *current*
  world size (Goyal et al.'s lr x workers), from the update count;
- the data: the current epoch's permutation, sharded over the new world,
  resumed at ``samples done // (batch x workers)``: with interleaved sharding
  the first k global batches are exactly the first k*b*n positions whatever n
  was, so no example is skipped (at most part of one batch is seen twice).

Only rank 0 writes metrics, checkpoints and weights; a process that becomes
rank 0 after a reset opens the metrics file and appends its own header.
"""
import time

from common.trainer.bookkeeper import Bookkeeper
from common.inputs.data import make_dataset
from common.base.errors import UsageError
from common.model.models import train_step_fn
from common.spec.plan import make_plan
from allreduce.sync_loop import AllreduceAdapter
from common.trainer.checkpoints import Checkpoints
from common.model.optim import create_slots, make_lr_schedule
from common.trainer.runlog import RunLog
from common.trainer.steptimes import StepTimes


def train_elastic(cfg, args, backend, model, optimizer, num_train):
    import horovod.tensorflow as hvd
    import tensorflow as tf
    if cfg.resume:
        raise UsageError("--elastic does not resume from checkpoints yet: drop --resume (the elastic state "
                         "itself survives lost ranks)")
    create_slots(model, optimizer)                # Horovod: every rank has the state it will receive
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, epoch_samples=0, updates=0, samples=0)
    chief_log = None

    def plan_now():
        return make_plan(cfg, num_train, backend.world_size, backend.world_size)

    def log():
        """The RunLog of this process while it is rank 0 (created on first need), else a silent one."""
        nonlocal chief_log
        backend.refresh()
        if not backend.is_chief:
            return RunLog.disabled()
        if chief_log is None:
            # Horovod: rank 0 can move to another live process on a reset, so no folder lock; the
            # folder's elastic_job file names the one job that writes there
            chief_log = RunLog(cfg, backend, plan_now(), model, start_step=state.updates, one_writer=False,
                               extra_header={"elastic": True, "commit_steps": args.commit_steps})
        return chief_log

    adapter = AllreduceAdapter(cfg, backend, model, optimizer, Checkpoints(cfg, model, optimizer),
                               lr=lambda step: float(optimizer.lr.numpy()))
    books = Bookkeeper(cfg, plan_now(), backend, RunLog.disabled(), adapter)
    train_step = tf.function(train_step_fn(model, optimizer, wrap_tape=backend.wrap_tape), autograph=False)  # Horovod: all-reduce

    # this process's own steps, under whatever rank it holds when the job ends
    times = StepTimes(f"rank:{backend.rank}", cfg.log_every, cfg.warmup_steps)

    def on_reset():
        backend.refresh()
        # Horovod: the state rolls back to its last commit; the steps after it will run again
        times.spans = [span for span in times.spans if span[0] <= state.updates]
        if backend.is_chief:
            print(f"elastic: the world is now {backend.world_size} rank(s); resuming at update {state.updates}",
                  flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run                              # Horovod: restore and retry on a lost rank / new hosts
    def train(state):
        books.restart(state.updates)              # every rank, a new one too, counts from the synced state
        while state.epoch < cfg.epochs:
            backend.refresh()
            n, b = backend.world_size, cfg.batch_size
            books.plan = plan = plan_now()        # Horovod: what depends on the world size, recomputed
            lr = make_lr_schedule(cfg, plan)      # the lr rule at the current world size
            done = state.epoch_samples // (b * n)
            data = make_dataset(cfg, backend.rank, n, start_step=state.epoch * plan.steps_per_epoch + done,
                                num_steps=(state.epoch + 1) * plan.steps_per_epoch)
            batches = iter(data)
            while True:
                times.begin()
                asked = time.perf_counter()
                try:
                    x, y = next(batches)
                except StopIteration:
                    times.started = None
                    break
                waited = time.perf_counter() - asked
                optimizer.lr.assign(float(lr(state.updates)))
                loss = float(train_step(x, y))
                times.end(state.updates + 1, waited)
                state.updates += 1
                state.epoch_samples += b * n
                state.samples += b * n
                books.log = log()
                books.after_update(state.updates, loss, epoch=0, samples_seen=state.samples, world_size=n)
                if state.updates % args.commit_steps == 0:
                    state.commit()                # Horovod: a failure rolls back to here
            # the epoch ends by samples, not at a fixed update count (the world may have changed)
            books.log = log()
            books.after_update(state.updates, None, epoch=state.epoch + 1, samples_seen=state.samples, world_size=n)
            state.epoch += 1
            state.epoch_samples = 0
            state.commit()

    train(state)
    books.log = log()
    books.finish(state.updates, samples_seen=state.samples)
    backend.refresh()
    times.task = f"rank:{backend.rank}"          # its rank in the world that finished (ranks come and go)
    times.save(cfg.train_dir)
    return 0
