"""The small interface each distribution backend implements, and its one factory.

Both trainers are written against this interface so the only difference a
reader sees between them is the backend object; nothing else in the code base
branches on the backend's name.
"""
import importlib

from common.errors import UsageError

BACKENDS = {
    "horovod": "horovod_train.backend:HorovodBackend",
    "ps": "ps_train.backend:PSBackend",
}


class Backend:
    """What a trainer needs from a distribution strategy.

    setup() joins the job and fills rank / world_size / is_chief; the other
    methods are the only distribution-specific operations a training loop does.
    """
    name = "base"
    mode = "sync"
    num_ps = 0

    def __init__(self):
        self.rank, self.world_size, self.is_chief = 0, 1, True

    def setup(self, cfg):
        raise NotImplementedError

    def wrap_optimizer(self, optimizer):
        raise NotImplementedError

    def sync_initial_state(self, model, optimizer):
        raise NotImplementedError

    def reduce_metric(self, value, name="metric", op="mean"):
        raise NotImplementedError

    def shutdown(self):
        pass

    @classmethod
    def launch_command(cls, workers, trainer_args, python, mode=None, num_ps=1):
        """argv that starts a whole job of this backend with ``workers`` training processes."""
        raise NotImplementedError

    @classmethod
    def modes(cls):
        return ("sync",)

    @classmethod
    def server_tasks(cls, num_ps):
        """Processes a job starts besides its workers (parameter servers); 0 for all-reduce."""
        return 0


def backend_class(name):
    """Backend class by name; an unknown name lists the valid ones."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend '{name}' (valid: {', '.join(sorted(BACKENDS))})")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def get_backend(name, **kwargs):
    return backend_class(name)(**kwargs)
