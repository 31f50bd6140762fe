"""The interface every training loop and the bookkeeper (common/trainer/bookkeeper.py) call, and nothing more.

``Backend`` is what a method looks like to the shared life cycle: join the job, plan what an update
means, say what a step puts on the wire, leave. What the all-reduce methods add (gradient exchange,
broadcasts, metric reductions) is ``allreduce.backend.AllreduceBackend``; what a parameter-server
method adds lives in ps_train/. This module imports no backend: each main constructs its own, and
the application tier (``hvdps/``) asks the method registry for launchers.
"""
from common.base.errors import UsageError
from common.model.models import gradient_bytes


# A trainable variable larger than this is split over the PS tasks along its first axis, into
# ceil(bytes / MIN_SHARD_BYTES) shards, at most one per task, by the same rule under both PS APIs
# (TF1's min_max_variable_partitioner; TF2's MinSizePartitioner is built on it). Small enough
# that the MLP's 4 KB hidden bias is split too: left whole, it sits on top of one task's 1/k of the
# kernels (4 tasks: 79,872 bytes against 76,810 for an even split), and with k tasks that one task's
# link carries 4% more than n x M / k per round. Split, every task holds within 0.1% of M / k.
MIN_SHARD_BYTES = 1 << 10


class Backend:
    """A distribution method as a training loop sees it.

    ``setup()`` joins the job and fills rank / world_size / is_chief; ``plan()``
    says what one update means for this method; ``wrap_optimizer()`` is where
    gradients start to be exchanged; ``shutdown()`` leaves the job.
    """
    name = "base"
    mode = "sync"
    tasks = {}            # role -> count of the job's tasks besides its workers (a PS job's {"ps": 2})

    def __init__(self):
        self.rank, self.world_size, self.is_chief = 0, 1, True

    def setup(self, cfg):
        raise NotImplementedError

    def plan(self, cfg, num_examples):
        """The RunPlan (common.spec.plan) of this run: steps, updates and samples per update."""
        raise NotImplementedError

    def wrap_optimizer(self, optimizer):
        raise NotImplementedError

    def wire_bytes(self, sizes, plan):
        """What one step puts on the network, by this method's algorithm and the gradient's
        measured sizes (``common.model.models.gradient_sizes``): ``{"bytes_per_step_per_worker": ...,
        "wire_rule": "..."}``. One rule per method, in its own package (the ring's in
        allreduce/backend.py, the parameter servers' in ps_train/backend.py)."""
        return {}

    def jit_refusal(self):
        """Why this method's training step cannot be compiled by XLA (``--jit_compile``), in words for
        one error line that name the method (its launcher's ``jit_refusal`` says the same); None where
        it can. Every op of a jit-compiled step needs an XLA kernel, and an exchange inside the step
        (a custom op, a Python callback) may have none."""
        return None

    def gradient_bytes(self, model):
        """Bytes of one gradient as this method sends it (the summary's ``grad_bytes_per_step``)."""
        return gradient_bytes(model)

    def shutdown(self, code=0):
        """Leave the job; ``code`` is the trainer's result (the PS chief passes it on to the PS tasks)."""


def check_jit(cfg, backend):
    """``--jit_compile`` refused in one line where ``backend`` (a trainer's backend, or a method's
    launcher before any task starts) cannot compile its step (its ``jit_refusal``)."""
    why = backend.jit_refusal() if cfg.jit_compile else None
    if why:
        raise UsageError(f"--jit_compile: {why}")
