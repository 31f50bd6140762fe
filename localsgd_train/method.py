"""What hvdps knows of local SGD (collected by hvdps/methods.py): its mode is a value, k, the steps
between two averagings of the weights (``--backends localsgd:8``); it starts on the same mpirun
line as the other MPI trainers with this package's trainer; it is costed as a ring that runs once
every k steps; and the report says what its overhead is and that it is not an exact all-reduce."""
from dataclasses import dataclass

from common.base.errors import UsageError
from hvdps.cost import schedule
from hvdps.launchers import MPIRunLauncher
from hvdps.cost.ring import Ring
from hvdps.methods import Axis, Method
from localsgd_train.main import MAX_LOCAL_STEPS
from common.base.numbers import whole

DEFAULT_K = "8"


def local_steps(mode):
    """k of a run's mode ('8'), or 1 for a mode that is not a number (a run recorded otherwise)."""
    return max(whole(str(mode)) or 1, 1)


class LocalSGDLauncher(MPIRunLauncher):
    """mpirun with this package's trainer, told its k by the mode."""
    main = ("localsgd_train", "main.py")

    def mode_argv(self, mode):
        return ["--local_steps", str(local_steps(mode or DEFAULT_K))]


class LocalSGDRing(Ring):
    """The ring all-reduce of the weights (the gradient's size) once every k steps: 1/k of the ring's
    bytes and time per step, after the compute (nothing of it overlaps back-propagation)."""
    exact = False

    def __init__(self):
        super().__init__(polls=True, how="ring Allreduce of the weights every k steps")

    def dense(self, mode):
        return True                        # the weights are averaged, embedding tables whole

    def predict_links(self, mode, roles, gradient, shard_bytes=None):
        hosts = super().predict_links(mode, roles, gradient, shard_bytes)
        k = self.steps_per_exchange(mode)
        return None if hosts is None else {h: {d: b / k for d, b in io.items()} for h, io in hosts.items()}

    def exchange_s(self, row, nets):
        t = super().exchange_s(row, nets)
        return None if t is None else t / self.steps_per_exchange(row.mode)

    def steps_per_exchange(self, mode):
        """k: the weights are averaged once every k steps."""
        return local_steps(mode)

    def step_terms(self, row, shard_bytes, layers, nets, tuning):
        grad, n, ring = row.grad_bytes_per_step, row.workers, self.net(nets)
        if not grad:
            return None
        t = schedule.ring_allreduce_time(n, grad, ring.bandwidth, ring.alpha) / self.steps_per_exchange(row.mode)
        return {"weight average": (True, t)}


@dataclass(frozen=True)
class LocalSGD(Method):
    """A method whose mode is a number: ``parse_mode`` takes any k in range, and the label and
    overhead wording name it."""

    def parse_mode(self, text):
        if whole(text) is None or not 1 <= whole(text) <= MAX_LOCAL_STEPS:
            raise UsageError(f"backend {self.name}'s mode is k, the steps between two averagings of the weights: "
                             f"a whole number from 1 to {MAX_LOCAL_STEPS} (e.g. {self.name}:{DEFAULT_K}), got '{text}'")
        return str(int(text))

    def label(self, mode):
        return f"local SGD (k={local_steps(mode)})"

    def modes_help(self):
        return (f"{self.name}:K local SGD, the weights averaged every K steps, K from 1 to {MAX_LOCAL_STEPS}; "
                f"the bare name runs K={DEFAULT_K}")

    def overhead_parts(self, mode, alone, measured_wait):
        if alone:
            return ["the MPI calls with no peer to average with (one worker: no traffic, no slower rank)"]
        return [f"averaging the weights with one MPI_Allreduce every {local_steps(mode)} steps and waiting "
                "for the slower rank there"]


METHODS = (
    LocalSGD("localsgd", {DEFAULT_K: f"local SGD (k={DEFAULT_K})"}, LocalSGDLauncher, LocalSGDRing(),
             overhead={DEFAULT_K: f"averaging the weights with one MPI_Allreduce every {DEFAULT_K} steps"},
             space=(Axis("mode", (DEFAULT_K, "2", "32"), arithmetic=True),)),
)
