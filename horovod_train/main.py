"""Horovod trainer: synchronous data parallelism with ring all-reduce.

One process per GPU (or per CPU slot). Any of these launch lines works:

    horovodrun -np 4 python horovod_train/main.py --model cnn
    horovodrun --gloo -np 2 python horovod_train/main.py
    horovodrun --mpi -np 2 -H host1:1,host2:1 python horovod_train/main.py
    mpirun -np 4 -bind-to none -map-by slot -x PATH \\
        python horovod_train/main.py            # add --allow-run-as-root as root
                                                # (-x LD_LIBRARY_PATH too where it is set, e.g. CUDA)
    python horovod_train/main.py                # world size 1

Lines marked ``# Horovod:`` are the only differences from single-process code.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.spec.config import build_parser, from_args
from common.inputs.data import num_examples
from common.base.errors import cli
from common.model.models import build_model, make_optimizer
from common.model.optim import loss_scaled
from common.trainer.run_dir import check_resume_compatible, check_train_dir
from common.base.procs import launcher_rank
from allreduce.sync_loop import train_allreduce
from horovod_train.backend import (HorovodBackend, add_horovod_args, joining_elastic_job, mark_elastic_job,
                                   tuning_env)
from horovod_train.elastic import train_elastic


def make_parser():
    return add_horovod_args(build_parser(__doc__.splitlines()[0], prog="horovod_train/main.py"))


@cli
def main(argv=None):
    if launcher_rank() != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"   # Horovod: one error line per job, not per rank
    args = make_parser().parse_args(argv)
    cfg = from_args(args)
    check_train_dir(cfg, joining=args.elastic and joining_elastic_job(cfg.train_dir))  # every rank, before joining
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = num_examples(cfg)

    # Horovod: initialize, pin one GPU per process or split CPU cores between local ranks.
    backend = HorovodBackend(fp16_allreduce=args.fp16_allreduce, env=tuning_env(args), num_groups=args.num_groups,
                             sparse_as_dense=args.sparse_as_dense).setup(cfg)
    if args.elastic:                             # Horovod: the world may shrink and grow (elastic.py)
        if backend.is_chief:
            mark_elastic_job(cfg.train_dir)
        return train_elastic(cfg, args, backend, build_model(cfg),
                             loss_scaled(cfg, make_optimizer(cfg, cfg.learning_rate)), num_train)

    # Horovod: each rank runs 1/size of an epoch's steps, the lr scaled by the workers with a warm-up,
    # rank 0's state broadcast, gradients all-reduced through DistributedGradientTape (--loop custom)
    # or DistributedOptimizer (--loop fit): allreduce/sync_loop.py, shared with the bare-MPI trainer.
    return train_allreduce(cfg, backend, num_train, loop=args.loop,
                           extra_header={"fp16_allreduce": args.fp16_allreduce},
                           timeouts=(args.step_timeout, args.startup_timeout))


if __name__ == "__main__":
    sys.exit(main())
