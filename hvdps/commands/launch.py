"""hvdps launch NAME for a method whose whole job is one mpirun line (Horovod, bare MPI, local SGD):
the line hvdps compare starts it with, on this machine, run in this process's place.

    hvdps launch horovod --num_workers 2 --epochs 5 --train_dir runs/hvd
    hvdps launch localsgd --num_workers 2 --local_steps 8 --train_dir runs/lsgd
    hvdps launch mpi --num_workers 2 --dry_run --train_dir runs/mpi     # print the line instead

Every flag after the launcher's own goes to the trainer as it is (``hvdps train NAME --help`` lists
them), checked first by the trainer's own parser and config (its package's ``main.make_parser``), so
a bad flag is one line before any rank starts. Across hosts the launch line is the user's own
(``mpirun -H``, ``horovodrun -H``, ``srun``: docs/methods.md) or ``hvdps compare --hosts``.
"""
import importlib
import os
import shlex
import sys

from common.base.errors import UsageError, cli
from common.base.flags import Parser
from common.base.procs import child_env
from common.spec.config import from_args
from hvdps.methods import get_launcher

MAX_WORKERS = 1024


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        raise UsageError("hvdps launch: a method is needed")
    name, rest = argv[0], argv[1:]
    launcher = get_launcher(name)
    p = Parser(prog=f"hvdps launch {name}", description=__doc__.splitlines()[0])
    p.add_argument("--num_workers", type=int, default=2, help="ranks to start (mpirun -np)")
    p.add_argument("--pin_workers", action="store_true",
                   help="one core and one TensorFlow thread per rank (mpirun -bind-to core)")
    p.add_argument("--dry_run", action="store_true", help="print the mpirun line instead of running it")
    p.add_argument("--hosts", default=None, help="refused: this runs here (see above for across hosts)")
    p.bound("num_workers", 1, MAX_WORKERS)
    args, trainer_argv = p.parse_known_args(rest)
    if args.hosts is not None:
        raise UsageError(f"hvdps launch {name} starts its ranks on this machine; across hosts run mpirun -H "
                         f"{args.hosts} ... (docs/methods.md) or hvdps compare --hosts {args.hosts}")
    trainer = importlib.import_module(f"{launcher.main[0]}.main")
    from_args(trainer.make_parser().parse_args(trainer_argv))   # the trainer's own refusals, before any rank
    cmd = launcher.command(args.num_workers, trainer_argv, pin_cores=args.pin_workers)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    env = child_env()
    env.update(launcher.env())
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, env)     # mpirun in this process's place: signals and exit code are its own


if __name__ == "__main__":
    sys.exit(main())
