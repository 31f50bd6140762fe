"""Bare-MPI trainer: the Horovod trainer's loop with one mpi4py Allreduce per step instead of Horovod.

The reference that shows what Horovod's machinery costs or saves. Launch it as
any MPI program (one process per GPU or CPU slot):

    mpirun -np 2 -bind-to none -map-by slot -x PATH \\
        python mpi_train/main.py                # add --allow-run-as-root as root
    srun --mpi=pmix -n 8 python mpi_train/main.py
    python mpi_train/main.py                    # world size 1
    hvdps compare --backends horovod,mpi,ps     # side by side

Lines marked ``# MPI:`` are the only differences from single-process code.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # keep TF's C++ start-up chatter out of the logs
if __package__ in (None, ""):   # run as a script: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from allreduce.mpi import mpi_env_check
from allreduce.sync_loop import train_allreduce
from common.spec.config import build_parser, from_args
from common.inputs.data import num_examples
from common.base.errors import cli
from common.base.procs import launcher_rank
from common.trainer.run_dir import check_resume_compatible, check_train_dir
from mpi_train.backend import MPIBackend


def make_parser():
    return build_parser(__doc__.splitlines()[0], prog="mpi_train/main.py")


@cli(hard_exit=True)   # MPI: a failed rank leaves without MPI_Finalize, so mpirun ends the others
def main(argv=None):
    if launcher_rank() != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"   # MPI: one error line per job, not per rank
    args = make_parser().parse_args(argv)
    cfg = from_args(args)
    mpi_env_check("mpi")
    check_train_dir(cfg)                         # every rank, before joining
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = num_examples(cfg)

    backend = MPIBackend().setup(cfg)            # MPI: join COMM_WORLD, split the cores between local ranks
    # MPI: the Horovod trainer's run (allreduce/sync_loop.py) with one MPI_Allreduce per step
    return train_allreduce(cfg, backend, num_train, timeouts=(args.step_timeout, args.startup_timeout))


if __name__ == "__main__":
    sys.exit(main())
