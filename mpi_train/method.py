"""What hvdps knows of the bare-MPI reference (collected by hvdps/methods.py): one mode, the same
mpirun line as Horovod's with this package's trainer, and a ring costed with the all-reduce network
Horovod's measurements fit (one MPI_Allreduce after back-propagation)."""
from hvdps.launchers import MPIRunLauncher
from mpi_train.backend import JIT_REFUSAL
from hvdps.cost.ring import Ring
from hvdps.methods import Method


class MPILauncher(MPIRunLauncher):
    """The bare-MPI reference (mpi_train): mpirun, this package's main."""
    main = ("mpi_train", "main.py")

    def jit_refusal(self):
        return JIT_REFUSAL


METHODS = (
    Method("mpi", {"sync": "bare MPI"}, MPILauncher, Ring(dense_modes=("sync",), polls=True),
           overhead={"sync": "the MPI_Allreduce of the gradients and waiting for the slower rank"},
           alone={"sync": "the MPI calls with no peer to exchange with (one worker: no traffic, no slower rank)"}),
)
