"""What hvdps knows of TensorFlow's MultiWorkerMirroredStrategy (collected by hvdps/methods.py): one
task per worker started by this package's launcher, a ring costed with TensorFlow's own collective
all-reduce as comm.json measures it ("mwms*" rows), and the report's wording."""
from hvdps.launchers import TaskLauncher
from hvdps.cost.model import Network
from hvdps.cost.ring import Ring
from hvdps.methods import Axis, Method, Setting
from mwms_train.backend import IMPLEMENTATIONS, JIT_REFUSAL


class MWMSLauncher(TaskLauncher):
    """One task per worker, each told the cluster and its index (``python -m mwms_train.launch``,
    locally or --hosts through the remote shell); its all-reduce is TensorFlow's collective ops over gRPC."""
    module = "mwms_train.launch"

    def jit_refusal(self):
        return JIT_REFUSAL


METHODS = (
    Method("mwms", {"sync": "TF all-reduce (MWMS)"}, MWMSLauncher,
           Ring(dense_modes=(), network="mwms", measured=Network("mwms", "mwms", "TensorFlow's ring all-reduce")),
           overhead={"sync": "TensorFlow's collective all-reduce of the gradients (after back-propagation, in "
                             "apply_gradients) and waiting for the slower worker"},
           alone={"sync": "the strategy's machinery with no peer to exchange with (one worker: no all-reduce "
                          "traffic, no slower rank)"},
           settings=(Setting("implementation", str, "the collective all-reduce (CommunicationImplementation)",
                             choices=IMPLEMENTATIONS),
                     Setting("pack_size_mb", float, "gradients all-reduced in packs of this size "
                             "(CommunicationOptions.bytes_per_pack; 0: TensorFlow decides)", low=0, high=1 << 20)),
           space=(Axis("implementation", ("ring", "auto")), Axis("pack_size_mb", ("0", "4")))),
)
