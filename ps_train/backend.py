"""Parameter-server specifics: the common Backend interface plus what only PS needs.

Built on TensorFlow's own distributed runtime with between-graph replication
(tf.compat.v1): every task runs a gRPC ``tf.distribute.Server``; variables are
placed on the PS tasks by ``replica_device_setter`` (round-robin, after a large
variable is split into one shard per PS task: ps_train/graph.py); async mode applies each worker's gradients as they arrive, sync
mode wraps the optimizer in ``SyncReplicasOptimizer``. See docs/ps.md.

The global step counts updates applied on the PS (common.spec.plan): one update is
one worker batch (async) or R worker batches (sync, R = replicas_to_aggregate).
Members outside the interface (``server``, ``device_setter``,
``session_config``, ``wait_for_ps``, ``task_names``) are used by ps_train only.
"""
import re
import socket

from common.trainer.backend import Backend
from common.base.errors import UsageError
from common.launch.hosts import parse_address
from common.spec.plan import make_plan
from common.base.procs import wait_for_ports
from ps_train.cluster import check_aggregation, mode_name, replicas
from ps_train import stop


def ps_wire(sizes):
    """Parameter servers: a worker pushes its gradient and pulls the weights every batch (a PS
    task's share of an update is the PS method's own measure: ps_train/method.py, per_ps_bytes).
    An embedding table moves only the rows a batch looks up, both ways: the ids and the gathered
    rows out, the ids and the rows' gradients in (tf.IndexedSlices, duplicates included)."""
    per_batch = 2 * (sizes["dense_bytes"] + sizes["sparse_bytes"])
    rule = "PS: push gradient + pull weights per worker batch; a PS task carries 1/num_ps of it per batch in an update"
    if sizes["sparse_table_bytes"]:
        rule += "; embedding tables: only the looked-up rows and their ids, both ways"
    return {"bytes_per_step_per_worker": int(per_batch), "wire_rule": rule}


class PSBackend(Backend):
    name = "ps"

    def __init__(self, cluster, job, index, sync=False, replicas_to_aggregate=0,
                 startup_timeout=60.0, step_timeout=60.0, backup_workers=0):
        super().__init__()
        self.cluster, self.job, self.index = cluster, job, index
        self.sync = sync
        self.mode = mode_name(sync, backup_workers)     # backupK: sync with K backup workers
        self.num_ps = len(cluster["ps"])
        self.tasks = {"ps": self.num_ps}
        self.replica_list = replicas(cluster)
        self.world_size = len(self.replica_list)
        check_aggregation(self.world_size, backup_workers, replicas_to_aggregate if sync else 0)
        if backup_workers:                       # K backups: an update waits for the first N - K
            replicas_to_aggregate = self.world_size - backup_workers
        self.replicas_to_aggregate = (replicas_to_aggregate or self.world_size) if sync else 1
        self.startup_timeout, self.step_timeout = startup_timeout, step_timeout
        self.is_ps = job == "ps"
        self.rank = self.replica_list.index((job, index)) if not self.is_ps else -1
        self.is_chief = self.rank == 0
        self.device = f"/job:{job}/task:{index}"
        self.address = cluster[job][index]
        self.chief_address = cluster[self.replica_list[0][0]][0]
        self.threads = 0
        self.bind_address = None       # None: every interface (tf_cluster/listen.py decides)
        self.server = None

    # ---------------------------------------------------------------- interface
    def setup(self, cfg):
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()        # PS: between-graph replication is graph mode
        self.threads = cfg.threads_per_worker
        _, port = parse_address(self.address, f"{self.job}:{self.index}")
        check_port_free(self.bind_address or "", port, f"{self.job}:{self.index}")
        try:
            self.server = tf.distribute.Server(tf.train.ClusterSpec(self.cluster), job_name=self.job,
                                               task_index=self.index, start=True,
                                               config=self.session_config())
        except tf.errors.OpError as exc:
            raise UsageError(f"{self.job}:{self.index} could not start its gRPC server: "
                             f"{exc.message.splitlines()[0]}")
        return self

    def plan(self, cfg, num_examples):
        """Budgets in samples: the same data as Horovod's, counted in PS updates."""
        return make_plan(cfg, num_examples, self.world_size, batches_per_update=self.replicas_to_aggregate)

    def wrap_optimizer(self, optimizer):
        if not self.sync:
            return optimizer
        import tensorflow as tf
        return tf.compat.v1.train.SyncReplicasOptimizer(   # PS: average R gradients per update
            optimizer, replicas_to_aggregate=self.replicas_to_aggregate,
            total_num_replicas=self.world_size)

    def wire_bytes(self, sizes, plan):
        return ps_wire(sizes)

    def shutdown(self, code=0):
        """The chief releases every PS task (ps_train/stop.py); other tasks just leave."""
        if self.is_chief and self.server is not None:
            stop.signal_done([("ps", i, addr) for i, addr in enumerate(self.cluster["ps"])], code)

    # ---------------------------------------------------------------- PS only
    def session_config(self):
        import tensorflow as tf
        cfg = tf.compat.v1.ConfigProto(allow_soft_placement=False)
        # Workers talk only to the PS tasks and themselves: a lost or slow peer
        # worker can then neither block session creation nor fail this task.
        cfg.device_filters.extend(["/job:ps", self.device])
        cfg.intra_op_parallelism_threads = self.threads
        cfg.inter_op_parallelism_threads = 2 if self.threads else 0
        return cfg

    def device_setter(self):
        import tensorflow as tf
        return tf.compat.v1.train.replica_device_setter(
            worker_device=self.device, cluster=tf.train.ClusterSpec(self.cluster))

    def wait_for_ps(self):
        """TensorFlow's session creation waits forever for a missing PS; this waits --startup_timeout."""
        wait_for_ports(self.cluster["ps"], self.startup_timeout, "parameter server")

    def task_names(self):
        """Training tasks by rank: ['worker:0', 'worker:1', ...] (the chief first if there is one)."""
        return [f"{job}:{i}" for job, i in self.replica_list]

    def task_addresses(self):
        """[(name, host:port)] of the training tasks, by rank."""
        return [(f"{job}:{i}", self.cluster[job][i]) for job, i in self.replica_list]


def check_port_free(address, port, who):
    """Fail fast and clearly on a taken port (gRPC's own message is a C++ log line)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
    except OSError as exc:
        raise UsageError(f"{who} cannot listen on port {port}: {exc.strerror}")


def describe_placement(variables, owner=None):
    """{variable: [device of each shard]}, the header's ``placement`` under both PS APIs, so a run
    shows where its variables live. ``owner`` maps a shard's id to the partitioned variable it is
    part of (TF2's partitioner; the classic graph places every variable whole). A shard is listed
    under the name it was partitioned from: TF2 names shards ``<name>/part_<i>`` while the
    ShardedVariable itself may carry only its class name, which every split variable would share."""
    out = {}
    for v in variables:
        name = v.name.split(":")[0]
        if (owner or {}).get(id(v)) is not None:
            name = re.sub(r"/part_\d+$", "", name)
        out.setdefault(name, []).append(v.device)
    return out


def shard_bytes(variables):
    """{"ps:i": bytes of the trainable variables (or shards) PS task i holds}: what that task's link
    carries per worker batch each way (a push of those gradients, a pull of those weights). Classic
    placement is round-robin over whole variables, so shards can be far from 1/num_ps each."""
    out = {}
    for v in variables:
        m = re.search(r"/job:ps/(?:replica:\d+/)?task:(\d+)", v.device or "")
        if m:
            key = f"ps:{m.group(1)}"
            out[key] = out.get(key, 0) + int(v.shape.num_elements()) * v.dtype.size
    return dict(sorted(out.items()))
