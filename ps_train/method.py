"""What hvdps knows of the parameter-server methods this package trains (collected by
hvdps/methods.py): classic between-graph PS (``ps``, async and sync) and TensorFlow 2's
ParameterServerStrategy (``ps2``), both started by ``python -m ps_train.launch``, costed as
parameter servers, with the report's wording and the wait the sync trainer measures."""
from hvdps.launchers import TaskLauncher
from hvdps.methods import Method, ParameterServers


class PSLauncher(TaskLauncher):
    """``python -m ps_train.launch``: the PS tasks and the workers, here or across --hosts."""
    module = "ps_train.launch"
    placement = True
    graph_mode = True

    def server_tasks(self, num_ps):
        return num_ps

    def launcher_argv(self, workers, mode, num_ps):
        return ["--num_ps", str(num_ps), "--num_workers", str(workers), f"--{mode or 'async'}"]


class PS2Launcher(PSLauncher):
    """TensorFlow 2's ParameterServerStrategy: the same launcher with ``--ps_api v2``; asynchronous
    only, and one more process, the chief that coordinates (it does not train)."""
    graph_mode = False
    trainer_flags = ("--ps_api", "v2")

    def server_tasks(self, num_ps):
        return num_ps + 1

    def launcher_argv(self, workers, mode, num_ps):
        return [*super().launcher_argv(workers, mode, num_ps), *self.trainer_flags]


METHODS = (
    Method("ps", {"async": "PS async", "sync": "PS sync"}, PSLauncher, ParameterServers(),
           overhead={"async": "pushing gradients to and pulling weights from the parameter servers",
                     "sync": "the PS round trip and waiting for the slower workers' gradients before each update"},
           waits={"sync": ("waiting for the other workers' gradients and the update (measured at the token queue)",
                           "the PS round trip and the rest")},
           waits_alone=("the update on the PS before the token comes back (one worker: no one else to wait for)",
                        "the PS round trip and the rest")),
    Method("ps2", {"async": "PS v2 (TF2 strategy)"}, PS2Launcher, ParameterServers(),
           overhead={"async": "the coordinator's dispatch and the PS round trip"}),
)
