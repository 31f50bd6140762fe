"""Bare-MPI trainer: the Horovod trainer's loop with one mpi4py Allreduce per step instead of Horovod.

The reference that shows what Horovod's machinery costs or saves. Launch it as
any MPI program (one process per GPU or CPU slot):

    mpirun -np 2 -bind-to none -map-by slot -x PATH -x PYTHONPATH \\
        python mpi_train/main.py                # add --allow-run-as-root as root
    srun --mpi=pmix -n 8 python mpi_train/main.py
    python mpi_train/main.py                    # world size 1
    hvdps-compare --backends horovod,mpi,ps     # side by side

Lines marked ``# MPI:`` are the only differences from single-process code.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.config import build_parser, from_args
from common.data import load_arrays, make_dataset
from common.errors import cli
from common.models import build_model, gradient_bytes, gradient_sizes, make_optimizer
from common.probe import compute_step_time
from common.procs import launcher_rank
from common.sync_loop import EndOfStep, run_custom
from common.training import (Checkpoints, RunLog, check_resume_compatible, check_train_dir, create_slots,
                             make_lr_schedule, refuse_finished, save_weights_npz)
from mpi_train.backend import MPIBackend, mpi_env_check


@cli
def main(argv=None):
    if launcher_rank() != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"   # MPI: one error line per job, not per rank
    args = build_parser(__doc__.splitlines()[0], prog="mpi_train/main.py").parse_args(argv)
    cfg = from_args(args)
    mpi_env_check()
    check_train_dir(cfg)                         # every rank, before joining
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = len(load_arrays(cfg)[0])

    backend = MPIBackend().setup(cfg)            # MPI: join COMM_WORLD, split the cores between local ranks
    plan = backend.plan(cfg, num_train)          # MPI: each rank runs 1/size of an epoch's steps
    model = build_model(cfg)
    optimizer = make_optimizer(cfg, make_lr_schedule(cfg, plan))   # MPI: lr scaled by the workers
    create_slots(model, optimizer)               # MPI: every rank has the slots rank 0 restores

    checkpoints = Checkpoints(cfg, model, optimizer)
    start_step = checkpoints.restore(cfg) if backend.is_chief else 0   # MPI: rank 0 reads
    start_step = backend.broadcast_object(start_step)   # MPI: everyone resumes at rank 0's step
    refuse_finished(cfg, start_step, plan.total_updates)
    backend.broadcast_state(model, optimizer)    # MPI: rank 0's weights and slots everywhere

    train_ds = make_dataset(cfg, backend.rank, backend.world_size, start_step=start_step,
                            num_steps=plan.worker_steps)
    log = RunLog(cfg, backend, plan, start_step=start_step,
                 extra_header={"loop": "custom", "threads_per_worker": backend.threads})
    end_of_step = EndOfStep(cfg, backend, plan, model, optimizer, log, checkpoints)
    run_custom(backend, model, optimizer, train_ds, start_step, end_of_step)

    compute_s = compute_step_time(cfg) if backend.is_chief else None   # the step without MPI
    divergence = backend.max_divergence(model)   # MPI: all ranks must hold the same weights
    if backend.is_chief:
        save_weights_npz(model.get_weights(), os.path.join(cfg.train_dir, "weights.npz"))
    sizes = gradient_sizes(cfg, model) if backend.is_chief else None   # measured on a real batch
    log.finish(plan.total_updates, gradient_bytes(model), max_weight_divergence=divergence,
               exchange_s_per_step=backend.exchange_summary(), compute_s=compute_s, gradient=sizes,
               wire=backend.wire_bytes(sizes, plan) if sizes else None, exchange_s=backend.exchange_summary())
    backend.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
