"""Horovod trainer: synchronous data parallelism with ring all-reduce.

One process per GPU (or per CPU slot). Any of these launch lines works:

    horovodrun -np 4 python horovod_train/main.py --model cnn
    horovodrun --gloo -np 2 python horovod_train/main.py
    horovodrun --mpi -np 2 -H host1:1,host2:1 python horovod_train/main.py
    mpirun -np 4 -bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH \\
        python horovod_train/main.py            # add --allow-run-as-root as root
    python horovod_train/main.py                # world size 1

Lines marked ``# Horovod:`` are the only differences from single-process code.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.config import build_parser, from_args
from common.data import load_arrays, make_dataset
from common.errors import cli
from common.models import build_model, gradient_bytes, gradient_sizes, loss_fn, make_optimizer
from common.training import (Checkpoints, RunLog, check_resume_compatible, check_train_dir, create_slots,
                             make_lr_schedule, refuse_finished, save_weights_npz)
from common.probe import compute_step_time
from common.procs import launcher_rank
from common.sync_loop import EndOfStep, run_custom
from horovod_train.backend import (HorovodBackend, add_horovod_args, joining_elastic_job, mark_elastic_job,
                                   tuning_env)
from horovod_train.elastic import train_elastic


@cli
def main(argv=None):
    if launcher_rank() != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"   # Horovod: one error line per job, not per rank
    parser = add_horovod_args(build_parser(__doc__.splitlines()[0], prog="horovod_train/main.py"))
    args = parser.parse_args(argv)
    cfg = from_args(args)
    check_train_dir(cfg, joining=args.elastic and joining_elastic_job(cfg.train_dir))  # every rank, before joining
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = len(load_arrays(cfg)[0])

    # Horovod: initialize, pin one GPU per process or split CPU cores between local ranks.
    backend = HorovodBackend(fp16_allreduce=args.fp16_allreduce, env=tuning_env(args), num_groups=args.num_groups,
                             sparse_as_dense=args.sparse_as_dense).setup(cfg)
    if args.elastic:                             # Horovod: the world may shrink and grow (elastic.py)
        if backend.is_chief:
            mark_elastic_job(cfg.train_dir)
        return train_elastic(cfg, args, backend, build_model(cfg), make_optimizer(cfg, cfg.learning_rate), num_train)

    # Horovod: each rank runs 1/size of the steps an epoch takes, on its own shard.
    plan = backend.plan(cfg, num_train)
    model = build_model(cfg)
    # Horovod: scale the learning rate by the number of workers, with a warm-up.
    optimizer = make_optimizer(cfg, make_lr_schedule(cfg, plan))
    if args.loop == "fit":
        optimizer = backend.wrap_optimizer(optimizer)   # Horovod: all-reduce inside Keras' train step
    create_slots(model, optimizer)               # Horovod: every rank has the slots rank 0 restores

    checkpoints = Checkpoints(cfg, model, optimizer)
    start_step = checkpoints.restore(cfg) if backend.is_chief else 0   # Horovod: rank 0 reads
    start_step = backend.broadcast_object(start_step)  # Horovod: everyone resumes at rank 0's step
    refuse_finished(cfg, start_step, plan.total_updates)
    backend.broadcast_state(model, optimizer)    # Horovod: rank 0's weights and slots everywhere

    train_ds = make_dataset(cfg, backend.rank, backend.world_size, start_step=start_step,
                            num_steps=plan.worker_steps)
    log = RunLog(cfg, backend, plan, start_step=start_step,
                 extra_header={"loop": args.loop, "fp16_allreduce": args.fp16_allreduce,
                               "threads_per_worker": backend.threads})
    end_of_step = EndOfStep(cfg, backend, plan, model, optimizer, log, checkpoints)

    if args.loop == "fit":
        run_fit(backend, model, optimizer, train_ds, start_step, plan.total_updates, end_of_step)
    else:
        run_custom(backend, model, optimizer, train_ds, start_step, end_of_step)

    compute_s = compute_step_time(cfg) if backend.is_chief else None   # the step without Horovod
    divergence = backend.max_divergence(model)   # Horovod: all ranks must hold the same weights
    if backend.is_chief:
        save_weights_npz(model.get_weights(), os.path.join(cfg.train_dir, "weights.npz"))
    sizes = gradient_sizes(cfg, model) if backend.is_chief else None   # measured on a real batch
    log.finish(plan.total_updates, gradient_bytes(model) // (2 if args.fp16_allreduce else 1),
               max_weight_divergence=divergence, compute_s=compute_s, gradient=sizes,
               wire=backend.wire_bytes(sizes, plan) if sizes else None)
    backend.shutdown()
    return 0


def run_fit(backend, model, optimizer, train_ds, start_step, total_steps, end_of_step):
    import tensorflow as tf

    class Hook(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.step, self.losses = start_step, []

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            self.losses.append(float(logs["loss"]))
            end_of_step(self.step, self.losses)

    model.compile(optimizer=optimizer, loss=loss_fn(), metrics=["accuracy"], run_eagerly=False)
    model.fit(train_ds, steps_per_epoch=total_steps - start_step, epochs=1, verbose=0,
              callbacks=backend.keras_callbacks() + [Hook()])   # Horovod: broadcast + metric averaging


if __name__ == "__main__":
    sys.exit(main())
