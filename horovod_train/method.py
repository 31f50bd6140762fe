"""What hvdps knows of Horovod (the registry, hvdps/methods.py, collects this entry): its modes and
labels, the mpirun line that starts it, its cost model (a ring whose exchange starts during
back-propagation, Horovod's background thread and tensor fusion, with the projection's flags for
Horovod's cycle time and fusion buffer) and the report's wording."""
from horovod_train.backend import jit_refusal
from hvdps.launchers import MPIRunLauncher
from hvdps.cost.model import Network, Option
from hvdps.cost.ring import Ring
from hvdps.methods import Axis, Method, Setting


class HorovodLauncher(MPIRunLauncher):
    """Horovod; the mode ``sparse_as_dense`` (only when asked for, 'horovod:sparse_as_dense')
    all-reduces embedding gradients as whole tables instead of all-gathering their slices."""
    main = ("horovod_train", "main.py")
    dense_mode = "sparse_as_dense"

    def jit_refusal(self):
        return jit_refusal()


# What the projection's wait-free schedule (hvdps/cost/schedule.py: ring_step) takes of Horovod: the
# background thread's cycle and the fusion buffer, at Horovod's own defaults since 0.21.
OPTIONS = (
    Option("cycle_time_ms", float, 1.0, "Horovod's HOROVOD_CYCLE_TIME (default 1, Horovod >= 0.21; 5 before)",
           field="cycle_s", scale=1e-3, says="Horovod cycle {:g} ms"),
    Option("fusion_threshold_mb", float, 128.0,
           "Horovod's fusion buffer in MiB (default 128, Horovod >= 0.21; 64 before)",
           field="fusion_bytes", scale=1 << 20, cast=int, says="fusion {:g} MiB"),
)

# What a comparison may run Horovod at (--backends 'horovod[cycle_time_ms=0.1]'): its trainer's own flags.
SETTINGS = (
    Setting("cycle_time_ms", float, "the background thread's cycle, HOROVOD_CYCLE_TIME (Horovod's default 1 ms)",
            low=0, high=1000),
    Setting("fusion_threshold_mb", float, "the fusion buffer, HOROVOD_FUSION_THRESHOLD (Horovod's default 128 MiB)",
            low=0, high=4096),
    Setting("fp16_allreduce", bool, "the gradients as fp16 on the wire (hvd.Compression.fp16)"),
    Setting("num_groups", int, "the gradients as this many grouped all-reduces (0: one per tensor, fused)",
            low=0, high=1024),
)

# What hvdps tune searches (the default first): the cycle against steps of a millisecond, the fusion
# buffer against a large model's layers, fp16 on the wire (which trains differently), grouping.
SPACE = (Axis("cycle_time_ms", ("1", "0.1", "5")), Axis("fusion_threshold_mb", ("128", "8")),
         Axis("fp16_allreduce", ("false", "true"), arithmetic=True), Axis("num_groups", ("0", "1")))

_ALONE = "Horovod's machinery with no peer to exchange with (one worker: no all-reduce traffic, no slower rank)"

METHODS = (
    Method("horovod", {"sync": "Horovod", "sparse_as_dense": "Horovod (sparse as dense)"}, HorovodLauncher,
           # comm.json's "horovod*" rows fit the ring all-reduce every ring method is costed with
           Ring(dense_modes=("sparse_as_dense",), wait_free=True, polls=True,
                measured=Network("allreduce", "horovod", "ring all-reduce"), options=OPTIONS),
           overhead={"sync": "Horovod's negotiation, fusion and ring all-reduce of the gradients, and "
                             "waiting for the slower rank",
                     "sparse_as_dense": "Horovod's negotiation, fusion and ring all-reduce of the gradients "
                                        "(embedding tables whole), and waiting for the slower rank"},
           default_modes=("sync",), alone={"sync": _ALONE, "sparse_as_dense": _ALONE}, settings=SETTINGS,
           space=SPACE),
)
