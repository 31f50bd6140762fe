"""Local SGD trainer: each rank trains alone and the ranks average their weights every k steps.

Lin et al., "Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020). Launch it as any MPI
program (one process per GPU or CPU slot):

    mpirun -np 2 -bind-to none -map-by slot -x PATH \\
        python localsgd_train/main.py --local_steps 8   # add --allow-run-as-root as root
    srun --mpi=pmix -n 8 python localsgd_train/main.py --local_steps 8
    hvdps compare --backends horovod,localsgd:8,ps      # side by side

Lines marked ``# Local SGD:`` are the only differences from single-process code.
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
from localsgd_train.backend import LocalSGDBackend

MAX_LOCAL_STEPS = 100_000


def make_parser():
    parser = build_parser(__doc__.splitlines()[0], prog="localsgd_train/main.py")
    g = parser.add_argument_group("local SGD")
    g.add_argument("--local_steps", type=int, default=8,
                   help="k: the steps each rank takes on its own between two averagings of the weights "
                        "(1: every step, the synchronous ring's updates)")
    parser.bound("local_steps", 1, MAX_LOCAL_STEPS)
    return parser


@cli(hard_exit=True)   # Local SGD: a failed rank leaves without MPI_Finalize, so mpirun ends the others
def main(argv=None):
    if launcher_rank() != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"   # Local SGD: one error line per job, not per rank
    args = make_parser().parse_args(argv)
    cfg = from_args(args)
    mpi_env_check("localsgd")
    check_train_dir(cfg)                         # every rank, before joining
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = num_examples(cfg)

    backend = LocalSGDBackend(args.local_steps).setup(cfg)   # Local SGD: join COMM_WORLD, share the cores
    # Local SGD: the all-reduce trainers' run (allreduce/sync_loop.py); no gradient is exchanged, the
    # weights are averaged after every k-th step (LocalSGDBackend.after_step)
    return train_allreduce(cfg, backend, num_train, extra_header={"local_steps": args.local_steps},
                           timeouts=(args.step_timeout, args.startup_timeout))


if __name__ == "__main__":
    sys.exit(main())
