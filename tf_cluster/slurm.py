"""TF_CONFIG for a task of a SLURM job step, from TensorFlow's own SlurmClusterResolver: what every
TF_CONFIG trainer shares under SLURM (ps_train/slurm.py deals the roles to PS tasks and workers,
mwms_train/slurm.py makes every task a worker). Why the resolver is called as it is: ps_train/slurm.py.
"""
import json
import os

from common.base.errors import UsageError

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
