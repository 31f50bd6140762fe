"""Run a command as this SLURM task's PS role: TF_CONFIG from TensorFlow's own SlurmClusterResolver.

    srun python -m ps_train.slurm --num_ps 1 [--chief] [--port 2222] -- python ps_train/main.py [flags]

The step's tasks, in node order with ports counted up on each node (``slurm_tf_config``), are dealt
to the roles in the resolver's order (by name): the chief first with ``--chief`` (TF2's
ParameterServerStrategy), then ``--num_ps`` PS tasks, the rest workers. It then execs the command with
``TF_CONFIG`` set, so the trainer reads it as on Kubeflow.

``tf_cluster.slurm.slurm_tf_config`` is the part every TF_CONFIG trainer under SLURM shares
(mwms_train/slurm.py makes every task a worker with it). Inside a job step every task computes the same cluster from SLURM's
variables (the step's node list and tasks per node) and its own role from ``SLURM_PROCID``. The
resolver orders nodes by name, SLURM by its node list; where they differ (h10 sorts before h2) the
roles would not match the tasks, so that is refused. TensorFlow's resolver deals hosts out to GPUs:
with ``gpus_per_node`` 0 (a CPU node) it gives a node no task at all. The tasks here are given one
"slot" each instead (``gpus_per_task=1``, ``gpus_per_node`` = the most tasks on a node) with
``auto_set_gpu`` off, so CUDA_VISIBLE_DEVICES is left to SLURM (``--gpus-per-task``).
"""
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.base.flags import Parser
from common.base.errors import UsageError, cli
from tf_cluster.slurm import exec_with_tf_config, slurm_tf_config

def tf_config(num_ps, chief=False, port=2222, env=None):
    """TF_CONFIG (a JSON string) of the task SLURM's variables in ``env`` describe."""
    def jobs(total):
        workers = total - num_ps - (1 if chief else 0)
        if num_ps < 1 or workers < 1:
            raise UsageError(f"{total} task(s) in this step: need --num_ps ({num_ps})"
                             f"{' + the chief' if chief else ''} + at least one worker")
        return {"ps": num_ps, "worker": workers, **({"chief": 1} if chief else {})}
    return slurm_tf_config(jobs, port, env)


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = Parser(prog="python -m ps_train.slurm", usage="python -m ps_train.slurm --num_ps N [--chief] -- COMMAND...",
               description=__doc__.splitlines()[0])
    p.add_argument("--num_ps", type=int, default=1, help="PS tasks: the step's first tasks")
    p.add_argument("--chief", action="store_true", help="a chief task after the PS tasks (--ps_api v2)")
    p.add_argument("--port", type=int, default=2222, help="port of each node's first task; the next tasks count up")
    args = p.parse_args(ours)
    if not 1 <= args.port <= 65000:
        raise UsageError(f"--port must be 1-65000, got {args.port}")
    return exec_with_tf_config(tf_config(args.num_ps, args.chief, args.port), command)


if __name__ == "__main__":
    sys.exit(main())
