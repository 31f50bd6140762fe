"""The interface both trainers use, and nothing more.

Each trainer calls exactly these members on its backend; everything else a
method needs (Horovod's tape wrapper and broadcasts, the PS device setter and
gRPC server) lives in that backend's own package and is marked ``# Horovod:``
or ``# PS:`` where its main calls it. This module imports no backend: each
main constructs its own, and the application tier (``hvdps/``) maps backend
names to launchers.
"""


class Backend:
    """A distribution method as a training loop sees it.

    ``setup()`` joins the job and fills rank / world_size / is_chief; ``plan()``
    says what one update means for this method; ``wrap_optimizer()`` is where
    gradients start to be exchanged; ``shutdown()`` leaves the job.
    """
    name = "base"
    mode = "sync"
    num_ps = 0

    def __init__(self):
        self.rank, self.world_size, self.is_chief = 0, 1, True

    def setup(self, cfg):
        raise NotImplementedError

    def plan(self, cfg, num_examples):
        """The RunPlan (common.plan) of this run: steps, updates and samples per update."""
        raise NotImplementedError

    def wrap_optimizer(self, optimizer):
        raise NotImplementedError

    def shutdown(self, code=0):
        """Leave the job; ``code`` is the trainer's result (the PS chief passes it on to the PS tasks)."""
