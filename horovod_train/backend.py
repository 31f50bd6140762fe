"""Horovod specifics: the common Backend interface plus what only all-reduce needs.

Everything that knows about ``hvd`` lives here: joining the job, giving each
rank its GPU or its share of the CPU cores, wrapping the optimizer/tape for ring
all-reduce, broadcasting rank 0's state and averaging metrics: the members of
``allreduce.backend.AllreduceBackend``, plus ``refresh`` for elastic runs.
"""
import glob
import importlib.util
import math
import mmap
import os

import numpy as np

from allreduce.backend import AllreduceBackend, place_rank, ring_wire, yield_when_idle
from allreduce.deadline import GRACE
from common.base.files import make_dirs, write_atomic
from common.spec.plan import make_plan
from common.base.errors import UsageError
from common.base.flags import check_finite
from common.formats.schemas import read_text
from allreduce.roster import Roster
from common.model.models import gradient_bytes

def add_horovod_args(parser):
    g = parser.add_argument_group("Horovod")
    g.add_argument("--loop", choices=("custom", "fit"), default="custom",
                   help="custom tf.function loop with DistributedGradientTape, or Keras fit with "
                        "DistributedOptimizer")
    g.add_argument("--fp16_allreduce", action="store_true", help="compress gradients to fp16 on the wire")
    g.add_argument("--num_groups", type=int, default=0,
                   help="submit the gradients as this many grouped all-reduces (Horovod's num_groups; "
                        "1: one negotiation for all of them); 0: one all-reduce per tensor, fused by the "
                        "background thread")
    g.add_argument("--sparse_as_dense", action="store_true",
                   help="all-reduce embedding gradients as dense tensors (the whole table) instead of "
                        "all-gathering their slices (Horovod's default for tf.IndexedSlices)")
    g.add_argument("--fusion_threshold_mb", type=float, default=None, help="HOROVOD_FUSION_THRESHOLD")
    g.add_argument("--cycle_time_ms", type=float, default=None, help="HOROVOD_CYCLE_TIME")
    g.add_argument("--timeline", default=None, help="HOROVOD_TIMELINE file (written by rank 0's coordinator)")
    g.add_argument("--autotune", action="store_true", help="HOROVOD_AUTOTUNE=1")
    g.add_argument("--elastic", action="store_true",
                   help="elastic training under horovodrun --min-np/--max-np --host-discovery-script "
                        "(horovod_train/elastic.py)")
    g.add_argument("--commit_steps", type=int, default=10,
                   help="--elastic: commit the state every N updates (a lost rank rolls back to the last commit)")
    return parser


# Horovod's XLA ops (horovod/tensorflow/xla_mpi_ops.cc, registered when HOROVOD_ENABLE_XLA_OPS=1):
# the custom call an XLA-compiled step runs its all-reduce through. Horovod compiles that file only
# with CUDA or ROCm (it runs on the GPU's stream), so a CPU build's library lacks the symbol.
XLA_CUSTOM_CALL = b"CallbackHVDAllreduce"


def xla_ops_built():
    """Whether this Horovod's TensorFlow library holds its XLA ops, read from the library's bytes
    (importing it would import TensorFlow): a GPU build's has ``XLA_CUSTOM_CALL``."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    for root in spec.submodule_search_locations:
        for path in glob.glob(os.path.join(root, "tensorflow", "mpi_lib*.so")):
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if data.find(XLA_CUSTOM_CALL) >= 0:
                    return True
    return False


def jit_refusal():
    """Why Horovod cannot compile its step here (None where its XLA ops are built)."""
    if xla_ops_built():
        return None
    return ("Horovod as built here has no XLA ops (HOROVOD_ENABLE_XLA_OPS): Horovod builds them only with CUDA or "
            "ROCm (horovod/tensorflow/xla_mpi_ops.cc runs on the GPU's stream), and without them its "
            "all-reduce op has no XLA kernel (a GPU build's ops would take --jit_compile: not run here)")


def tuning_env(args):
    """Flags -> the environment variables Horovod reads at init (explicit env wins if flag unset)."""
    if args.commit_steps < 1:
        raise UsageError(f"--commit_steps must be >= 1, got {args.commit_steps}")
    if args.num_groups < 0:
        raise UsageError(f"--num_groups must be >= 0, got {args.num_groups}")
    for name in ("fusion_threshold_mb", "cycle_time_ms"):
        value = getattr(args, name)
        if value is not None:
            check_finite(name, value)
        if value is not None and value < 0:
            raise UsageError(f"--{name} must be >= 0, got {value}")
    env = {}
    if args.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = str(args.cycle_time_ms)
    if args.timeline:
        env["HOROVOD_TIMELINE"] = os.path.abspath(args.timeline)
    if args.autotune:
        env["HOROVOD_AUTOTUNE"] = "1"
    # horovodrun --gloo-timeout-seconds: yours wins. An elastic job keeps Horovod's: no step deadline
    # there, Gloo's bound is what finds a hung peer before the survivors roll back (docs/faults.md)
    if "HOROVOD_GLOO_TIMEOUT_SECONDS" not in os.environ and not args.elastic:
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(gloo_timeout_s(args.step_timeout, args.startup_timeout))
    return env


GLOO_MARGIN_S = 10     # past the longest bound and its grace: the rank that names the cause has spoken and exited


def gloo_timeout_s(step_timeout, startup_timeout):
    """Gloo's own bound on each of its operations, which Horovod reads at init (default 30 s): set
    past the step deadline's longest bound (the first step's --step_timeout + --startup_timeout, and
    the grace before a waiting rank speaks), so that under ``horovodrun --gloo`` a stopped or stalled
    rank is named by the deadline (allreduce/deadline.py) rather than ending the job on Gloo's
    receive timeout, a line that names no rank. Under MPI's controller Horovod does not read it."""
    return math.ceil(step_timeout + startup_timeout + GRACE) + GLOO_MARGIN_S


class HorovodBackend(AllreduceBackend):
    name = "horovod"
    mode = "sync"

    def __init__(self, fp16_allreduce=False, env=None, num_groups=0, sparse_as_dense=False):
        super().__init__()
        self.fp16 = fp16_allreduce
        self.sparse_as_dense = sparse_as_dense
        if sparse_as_dense:                  # a comparison row of its own (hvdps compare 'horovod:sparse_as_dense')
            self.mode = "sparse_as_dense"
        self.num_groups = num_groups
        self.env = env or {}
        self.hvd = None
        self.threads = None

    def jit_refusal(self):
        return jit_refusal()

    def setup(self, cfg):
        os.environ.update(self.env)
        if cfg.jit_compile:                              # Horovod: its XLA ops, registered when it loads
            os.environ["HOROVOD_ENABLE_XLA_OPS"] = "1"
        yield_when_idle()                                # MPI: a waiting rank gives its core back
        import horovod.tensorflow.keras as hvd
        hvd.init()                                       # Horovod: join the ring
        self.hvd = hvd
        self.rank, self.world_size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.is_chief = self.rank == 0
        self.threads = place_rank(cfg, self.local_rank, self.local_size)   # Horovod: a GPU or a core share
        return self

    def roster(self):
        import horovod.tensorflow as hvd_tf
        return Roster.gather(self.rank, hvd_tf.allgather_object)      # Horovod: each rank's host and pid

    def refresh(self):
        """Re-read rank and size: an elastic job changes them on every reset."""
        self.rank, self.world_size = self.hvd.rank(), self.hvd.size()
        self.local_rank, self.local_size = self.hvd.local_rank(), self.hvd.local_size()
        self.is_chief = self.rank == 0

    def plan(self, cfg, num_examples):
        """One step = one update averaging one batch from every rank."""
        return make_plan(cfg, num_examples, self.world_size, batches_per_update=self.world_size)

    @property
    def compression(self):
        return self.hvd.Compression.fp16 if self.fp16 else self.hvd.Compression.none

    def wrap_optimizer(self, optimizer):
        return self.hvd.DistributedOptimizer(optimizer, compression=self.compression, num_groups=self.num_groups,
                                             sparse_as_dense=self.sparse_as_dense)

    def wire_bytes(self, sizes, plan):
        return ring_wire(sizes, self.world_size, sparse="dense" if self.sparse_as_dense else "allgather",
                         scale=0.5 if self.fp16 else 1.0)

    def gradient_bytes(self, model):
        return gradient_bytes(model) // (2 if self.fp16 else 1)   # fp16 on the wire

    def shutdown(self, code=0):
        if self.hvd is not None:
            self.hvd.shutdown()

    def wrap_tape(self, tape):
        import horovod.tensorflow as hvd_tf
        import tensorflow as tf
        tape = hvd_tf.DistributedGradientTape(tape, compression=self.compression, num_groups=self.num_groups,
                                              sparse_as_dense=self.sparse_as_dense)
        # AutoGraph would transpile Horovod's own Python (the tape, _allreduce_grads, _allreduce_cond)
        # when the step is traced: 1.5 s of every run's first step on this machine, against 0.1 s
        # for the whole step without it. That code builds its graph explicitly (tf.cond), so it is
        # called as it is; the model's call is still converted.
        tape.gradient = tf.autograph.experimental.do_not_convert(tape.gradient)
        return tape

    def broadcast_state(self, model, optimizer):
        """Rank 0's weights and optimizer state (slots, iteration count) on every rank.

        The slots must already exist on every rank (``create_slots``): a
        broadcast of variables that only rank 0 has waits forever.
        """
        import horovod.tensorflow as hvd_tf
        hvd_tf.broadcast_variables(model.variables, root_rank=0)
        hvd_tf.broadcast_variables(optimizer.variables(), root_rank=0)

    def keras_callbacks(self):
        return [self.hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                self.hvd.callbacks.MetricAverageCallback()]

    def allreduce(self, value, name="metric", op="mean"):
        import horovod.tensorflow as hvd_tf
        hop = {"mean": hvd_tf.Average, "sum": hvd_tf.Sum, "max": hvd_tf.Max, "min": hvd_tf.Min}[op]
        arr = np.asarray(value, dtype=np.float64)
        out = hvd_tf.allreduce(arr, op=hop, name=f"hvdps.{name}")
        return out.numpy()

    def broadcast_object(self, obj):
        import horovod.tensorflow as hvd_tf
        return hvd_tf.broadcast_object(obj, root_rank=0)

    def max_divergence(self, model):
        """Largest |w_rank - w_rank0| over the trainable weights and ranks: 0 when the ranks agree.

        Only what the all-reduce keeps equal: non-trainable state (BatchNormalization's
        moving statistics) is each rank's own, from its own batches, as under Horovod's
        DistributedOptimizer; rank 0's is what checkpoints and weights.npz hold."""
        import horovod.tensorflow as hvd_tf
        worst = 0.0
        for i, w in enumerate(model.trainable_weights):
            ref = hvd_tf.broadcast(w, root_rank=0, name=f"hvdps.div.{i}")
            worst = max(worst, float(np.max(np.abs(w.numpy() - ref.numpy()))) if w.shape.num_elements() else 0.0)
        return float(self.allreduce(worst, "divergence", op="max"))


def elastic_job_id():
    """The rendezvous of the horovodrun invocation this process belongs to (None outside elastic runs)."""
    addr, port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    return f"{addr}:{port}" if addr and port else None


def joining_elastic_job(train_dir):
    """True if ``train_dir`` already belongs to the elastic job this process joins."""
    job = elastic_job_id()
    path = os.path.join(train_dir, "elastic_job")
    return job is not None and os.path.lexists(path) and read_text(path, "the elastic job id").strip() == job


def mark_elastic_job(train_dir):
    job = elastic_job_id()
    if job:
        make_dirs(train_dir)
        write_atomic(os.path.join(train_dir, "elastic_job"), job + "\n")
