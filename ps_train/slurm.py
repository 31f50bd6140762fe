"""Run a command as this SLURM task's PS role: TF_CONFIG from TensorFlow's own SlurmClusterResolver.

    srun python -m ps_train.slurm --num_ps 1 [--chief] [--port 2222] -- python ps_train/main.py [flags]

The step's tasks, in node order with ports counted up on each node (``slurm_tf_config``), are dealt
to the roles in the resolver's order (by name): the chief first with ``--chief`` (TF2's
ParameterServerStrategy), then ``--num_ps`` PS tasks, the rest workers. It then execs the command with
``TF_CONFIG`` set, so the trainer reads it as on Kubeflow.

``slurm_tf_config`` is the part every TF_CONFIG trainer under SLURM shares (mwms_train/slurm.py makes
every task a worker with it). Inside a job step every task computes the same cluster from SLURM's
variables (the step's node list and tasks per node) and its own role from ``SLURM_PROCID``. The
resolver orders nodes by name, SLURM by its node list; where they differ (h10 sorts before h2) the
roles would not match the tasks, so that is refused. TensorFlow's resolver deals hosts out to GPUs:
with ``gpus_per_node`` 0 (a CPU node) it gives a node no task at all. The tasks here are given one
"slot" each instead (``gpus_per_task=1``, ``gpus_per_node`` = the most tasks on a node) with
``auto_set_gpu`` off, so CUDA_VISIBLE_DEVICES is left to SLURM (``--gpus-per-task``).
"""
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.config import Parser
from common.errors import UsageError, cli

STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def slurm_tf_config(jobs_for, port=2222, env=None):
    """TF_CONFIG (a JSON string) of the task SLURM's variables in ``env`` describe; ``jobs_for(total)``
    gives {job: task count} for the step's ``total`` tasks (or raises UsageError)."""
    env = os.environ if env is None else env
    missing = [v for v in STEP_VARIABLES if v not in env]
    if missing:
        raise UsageError(f"not inside a SLURM job step ({', '.join(missing)} not set): run it under srun")
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        SlurmClusterResolver, expand_hostlist, expand_tasks_per_node)
    hosts = expand_hostlist(env["SLURM_STEP_NODELIST"])
    per_node = expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    if hosts != sorted(hosts):
        raise UsageError(f"nodes {','.join(hosts)}: TensorFlow's SlurmClusterResolver orders them by name "
                         f"({','.join(sorted(hosts))}), SLURM does not; name nodes so the two orders agree "
                         f"(h01, h02, ...)")
    jobs = jobs_for(sum(per_node))
    saved = {k: os.environ.get(k) for k in STEP_VARIABLES}
    os.environ.update({k: env[k] for k in saved})       # the resolver reads os.environ only
    try:
        resolver = SlurmClusterResolver(jobs=jobs, port_base=port, gpus_per_node=max(per_node), gpus_per_task=1,
                                        tasks_per_node=dict(zip(hosts, per_node)), auto_set_gpu=False)
        cluster = resolver.cluster_spec().as_dict()
        role, index = resolver.get_task_info()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})


def exec_with_tf_config(config, command):
    """Print ``config`` (no command), or run ``command`` in place of this process with TF_CONFIG set,
    so the trainer reads it as on Kubeflow."""
    if not command:
        print(config)
        return 0
    os.environ["TF_CONFIG"] = config
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]}: {exc.strerror}")


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
