"""One planned run of a comparison (or of a tune's trial): its identity on a cluster, made into its
method's launcher's exact command, the trainer flags and its own settings, its folder, and its tasks'
hosts across hosts."""
import os

from hvdps.measure.runs import PlannedRun
from hvdps.methods import get_launcher, settings_argv


def roles_of(launcher, remote, identity):
    """{task: host} of one run across hosts, as its method's launcher places them (Launcher.roles)."""
    return launcher.roles(list(remote.hosts), identity.workers, identity.tasks, remote.placement)


def plan_run(identity, condition, folder, trainer_args, cores, remote=None):
    """One run of ``identity`` on the cluster ``condition`` (None healthy), in ``folder``/its name: its
    launcher's exact command with the trainer flags and its own settings (hvdps tune's trials too)."""
    n, launcher = identity.workers, get_launcher(identity.method)
    processes = launcher.processes(n, identity.tasks)
    run_dir = os.path.join(folder, identity.name)
    argv = [*trainer_args, *settings_argv(identity.method, identity.settings), "--train_dir", run_dir]
    cmd = launcher.command(n, argv, mode=identity.mode, tasks=identity.tasks, remote=remote)
    return PlannedRun(identity.method, identity.mode, n, run_dir, name=identity.name, cmd=tuple(cmd),
                      env=launcher.env(remote), oversubscribed=processes > cores and not remote,
                      roles=roles_of(launcher, remote, identity) if remote else None,
                      condition=condition, tasks=processes, identity=identity)
