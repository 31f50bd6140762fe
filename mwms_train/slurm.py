"""Run a command as this SLURM task's MultiWorkerMirroredStrategy worker: TF_CONFIG from SlurmClusterResolver.

    srun python -m mwms_train.slurm [--port 2222] -- python mwms_train/main.py [flags]

Every task of the job step is a worker (tf_cluster/slurm.py's ``slurm_tf_config``: the step's nodes in
order, ports counted up on each node); the command runs in place of this process with ``TF_CONFIG`` set, as on Kubeflow.
"""
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.base.flags import Parser
from common.base.errors import UsageError, cli
from tf_cluster.slurm import exec_with_tf_config, slurm_tf_config


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = Parser(prog="python -m mwms_train.slurm", usage="python -m mwms_train.slurm [--port PORT] -- COMMAND...",
               description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=2222, help="port of each node's first task; the next tasks count up")
    args = p.parse_args(ours)
    if not 1 <= args.port <= 65000:
        raise UsageError(f"--port must be 1-65000, got {args.port}")
    return exec_with_tf_config(slurm_tf_config(lambda total: {"worker": total}, args.port), command)


if __name__ == "__main__":
    sys.exit(main())
