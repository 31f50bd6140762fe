"""Gossip SGD trainer (D-PSGD): each rank steps on its own gradient and averages its weights with its ring neighbours.

Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?" (NeurIPS 2017). Launch
it as any MPI program (one process per GPU or CPU slot):

    mpirun -np 4 -bind-to none -map-by slot -x PATH \\
        python gossip_train/main.py                  # add --allow-run-as-root as root
    srun --mpi=pmix -n 8 python gossip_train/main.py
    hvdps compare --backends mpi,gossip               # side by side

Lines marked ``# Gossip:`` are the only differences from single-process code.
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
from gossip_train.backend import GossipBackend, neighbours


def make_parser():
    return build_parser(__doc__.splitlines()[0], prog="gossip_train/main.py")


@cli(hard_exit=True)   # Gossip: a failed rank leaves without MPI_Finalize, so mpirun ends the others
def main(argv=None):
    if launcher_rank() != 0:
        os.environ["HVDPS_QUIET_ERRORS"] = "1"   # Gossip: one error line per job, not per rank
    args = make_parser().parse_args(argv)
    cfg = from_args(args)
    mpi_env_check("gossip")
    check_train_dir(cfg)                         # every rank, before joining
    if cfg.resume:
        check_resume_compatible(cfg, cfg.train_dir)
    num_train = num_examples(cfg)

    backend = GossipBackend().setup(cfg)         # Gossip: join COMM_WORLD, the ring as a graph topology
    # Gossip: the all-reduce trainers' run (allreduce/sync_loop.py); no gradient is exchanged, the weights
    # are mixed with the neighbours' after every step (GossipBackend.after_step)
    return train_allreduce(cfg, backend, num_train,
                           extra_header={"topology": "ring",
                                         "neighbours": len(neighbours(backend.rank, backend.world_size))},
                           timeouts=(args.step_timeout, args.startup_timeout))


if __name__ == "__main__":
    sys.exit(main())
