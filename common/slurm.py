"""A SLURM task's TF_CONFIG, from TensorFlow's own SlurmClusterResolver (no backend imports).

Inside a job step every task computes the same cluster from SLURM's variables (the step's node
list and tasks per node) and its own role from ``SLURM_PROCID``: tasks in node order, each node's
tasks on ports PORT, PORT+1, ... (so several tasks share a node), dealt to the jobs in the
resolver's order (by name). The resolver orders nodes by name, SLURM by its node list; where they
differ (h10 sorts before h2) the roles would not match the tasks, so that is refused.

TensorFlow's resolver deals hosts out to GPUs: with ``gpus_per_node`` 0 (a CPU node) it gives a
node no task at all. The tasks here are given one "slot" each instead (``gpus_per_task=1``,
``gpus_per_node`` = the most tasks on a node) with ``auto_set_gpu`` off, so CUDA_VISIBLE_DEVICES
is left to SLURM (``--gpus-per-task``). Which jobs the tasks make is the caller's: the PS roles
(ps_train/slurm.py) or every task a worker (mwms_train/slurm.py).
"""
import json
import os

from common.errors import UsageError

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
