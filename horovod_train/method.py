"""What hvdps knows of Horovod (the registry, hvdps/methods.py, collects this entry): its modes and
labels, the mpirun line that starts it, its cost model (a ring whose exchange starts during
back-propagation, Horovod's background thread and tensor fusion) and the report's wording."""
from hvdps.launchers import MPIRunLauncher
from hvdps.methods import Method, Network, Ring


class HorovodLauncher(MPIRunLauncher):
    """Horovod; the mode ``sparse_as_dense`` (only when asked for, 'horovod:sparse_as_dense')
    all-reduces embedding gradients as whole tables instead of all-gathering their slices."""
    main = ("horovod_train", "main.py")
    dense_mode = "sparse_as_dense"


_ALONE = "Horovod's machinery with no peer to exchange with (one worker: no all-reduce traffic, no slower rank)"

METHODS = (
    Method("horovod", {"sync": "Horovod", "sparse_as_dense": "Horovod (sparse as dense)"}, HorovodLauncher,
           # comm.json's "horovod*" rows fit the ring all-reduce every ring method is costed with
           Ring(dense_modes=("sparse_as_dense",), wait_free=True, polls=True,
                measured=Network("allreduce", "horovod", "ring all-reduce")),
           overhead={"sync": "Horovod's negotiation, fusion and ring all-reduce of the gradients, and "
                             "waiting for the slower rank",
                     "sparse_as_dense": "Horovod's negotiation, fusion and ring all-reduce of the gradients "
                                        "(embedding tables whole), and waiting for the slower rank"},
           default_modes=("sync",), alone={"sync": _ALONE, "sparse_as_dense": _ALONE}),
)
