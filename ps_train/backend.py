"""Parameter-server specifics, behind the common Backend interface.

Built on TensorFlow's own distributed runtime with between-graph replication
(tf.compat.v1): every task runs a gRPC ``tf.distribute.Server``; variables are
placed on the PS tasks by ``replica_device_setter`` (round-robin, so several PS
shard them); async mode applies each worker's gradients as they arrive,
sync mode wraps the optimizer in ``SyncReplicasOptimizer``.

Glossary used everywhere (metrics, logs, docs/ps.md):
  global step = number of updates applied to the variables on the PS.
  async: one update per worker batch  -> samples = global_step * batch
  sync:  one update per R worker batches (R = replicas_to_aggregate)
                                        -> samples = global_step * batch * R
"""
import json
import os
import socket
import time

from common.backend import Backend
from common.errors import RunError, UsageError
from common.hosts import parse_address, parse_cluster_spec, parse_tf_config, validate_cluster

JOBS = ("ps", "worker", "chief")


def add_ps_args(parser):
    g = parser.add_argument_group("parameter servers")
    g.add_argument("--job_name", default=None, help="ps, worker or chief (or from TF_CONFIG)")
    g.add_argument("--task_index", type=int, default=None, help="index within the job (or from TF_CONFIG)")
    g.add_argument("--ps_hosts", default=None, help="comma-separated host:port list")
    g.add_argument("--worker_hosts", default=None, help="comma-separated host:port list")
    g.add_argument("--chief_host", default=None, help="host:port of a separate chief task (optional)")
    g.add_argument("--cluster_spec", default=None, help="JSON/YAML file with the cluster (see hostfiles/)")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--sync", dest="sync", action="store_true", default=False,
                      help="synchronous updates (SyncReplicasOptimizer)")
    mode.add_argument("--async", dest="sync", action="store_false", help="asynchronous updates (default)")
    g.add_argument("--replicas_to_aggregate", type=int, default=0,
                   help="sync: gradients averaged per update (0: all workers)")
    g.add_argument("--startup_timeout", type=float, default=60.0,
                   help="seconds to wait for PS tasks / the chief's initialisation")
    g.add_argument("--step_timeout", type=float, default=60.0,
                   help="seconds one training step may block (a lost sync peer) before failing")
    return parser


def _host_list(text, flag):
    if text is None:
        return None
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise UsageError(f"{flag}: empty host in {text!r} (expected host:port,host:port)")
    for i, addr in enumerate(items):
        parse_address(addr, f"{flag}[{i}]")
    return items


def resolve_cluster(args, environ=None):
    """(cluster, job, index) from flags, --cluster_spec or TF_CONFIG; conflicts are errors."""
    environ = os.environ if environ is None else environ
    for name in ("startup_timeout", "step_timeout"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name} must be positive, got {getattr(args, name)}")
    if args.replicas_to_aggregate < 0:
        raise UsageError(f"--replicas_to_aggregate must be >= 0, got {args.replicas_to_aggregate}")
    flags = {"ps": _host_list(args.ps_hosts, "--ps_hosts"),
             "worker": _host_list(args.worker_hosts, "--worker_hosts"),
             "chief": _host_list(args.chief_host, "--chief_host")}
    flags = {k: v for k, v in flags.items() if v is not None}
    cluster, job, index, source = None, args.job_name, args.task_index, "flags"
    if args.cluster_spec:
        cluster, source = parse_cluster_spec(args.cluster_spec), args.cluster_spec
    tf_config = environ.get("TF_CONFIG", "").strip()
    if tf_config:
        tf_cluster, tf_job, tf_index = parse_tf_config(tf_config)
        if cluster is not None and cluster != tf_cluster:
            raise UsageError(f"TF_CONFIG cluster differs from {args.cluster_spec}; give only one")
        cluster, source = tf_cluster, "TF_CONFIG"
        if job is not None and job != tf_job:
            raise UsageError(f"--job_name={job} conflicts with TF_CONFIG task type {tf_job!r}")
        if index is not None and index != tf_index:
            raise UsageError(f"--task_index={index} conflicts with TF_CONFIG task index {tf_index}")
        job, index = tf_job, tf_index
    if cluster is None:
        if "ps" not in flags or ("worker" not in flags and "chief" not in flags):
            raise UsageError("no cluster given: pass --ps_hosts and --worker_hosts, --cluster_spec, "
                             "or set TF_CONFIG")
        cluster = validate_cluster(flags, "host flags")
    else:
        for role, addrs in flags.items():
            if cluster.get(role) != addrs:
                raise UsageError(f"--{role}_host{'s' if role != 'chief' else ''} {','.join(addrs)} "
                                 f"conflicts with {source} ({','.join(cluster.get(role, [])) or 'none'})")
    if job is None:
        raise UsageError(f"--job_name is required (valid: {', '.join(j for j in JOBS if j in cluster)})")
    if job not in JOBS:
        raise UsageError(f"unknown job name '{job}' (valid: {', '.join(JOBS)})")
    if job not in cluster:
        raise UsageError(f"job '{job}' has no hosts in the cluster (roles: {', '.join(cluster)})")
    index = 0 if index is None else index
    if not 0 <= index < len(cluster[job]):
        raise UsageError(f"--task_index {index} out of range for job '{job}' "
                         f"(0..{len(cluster[job]) - 1})")
    return cluster, job, index


def replicas(cluster):
    """Training tasks in shard order: the chief (if any) first, then the workers."""
    return [("chief", i) for i in range(len(cluster.get("chief", [])))] + \
           [("worker", i) for i in range(len(cluster.get("worker", [])))]


def wait_for_ports(addresses, timeout, what):
    """Block until every host:port accepts TCP, or fail after ``timeout`` seconds.

    TensorFlow's own session creation waits forever for a missing task; a probe
    first turns 'the PS never came up' into a bounded, named error.
    """
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending:
        addr = pending[0]
        host, port = addr.rsplit(":", 1)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pending.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RunError(f"{what} {addr} did not come up within {timeout:.0f}s "
                           f"(--startup_timeout); is it running and reachable?")
        time.sleep(0.2)


def _port_open(addr, timeout=0.5):
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


class PSBackend(Backend):
    name = "ps"

    def __init__(self, cluster, job, index, sync=False, replicas_to_aggregate=0,
                 startup_timeout=60.0, step_timeout=60.0):
        super().__init__()
        self.cluster, self.job, self.index = cluster, job, index
        self.sync = sync
        self.mode = "sync" if sync else "async"
        self.num_ps = len(cluster["ps"])
        self.replica_list = replicas(cluster)
        self.world_size = len(self.replica_list)
        if sync and not 0 <= replicas_to_aggregate <= self.world_size:
            raise UsageError(f"--replicas_to_aggregate {replicas_to_aggregate} must be 1..{self.world_size}")
        self.replicas_to_aggregate = (replicas_to_aggregate or self.world_size) if sync else 1
        self.startup_timeout, self.step_timeout = startup_timeout, step_timeout
        self.is_ps = job == "ps"
        self.rank = self.replica_list.index((job, index)) if not self.is_ps else -1
        self.is_chief = self.rank == 0
        self.device = f"/job:{job}/task:{index}"
        self.server = None

    # ------------------------------------------------------------ joining
    def setup(self, cfg=None):
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()        # PS: between-graph replication is graph mode
        host, port = parse_address(self.cluster[self.job][self.index], f"{self.job}:{self.index}")
        try:                                          # fail fast and clearly on a taken port
            with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("", port))
        except OSError as exc:
            raise UsageError(f"{self.job}:{self.index} cannot listen on port {port}: {exc.strerror}")
        try:
            self.server = tf.distribute.Server(tf.train.ClusterSpec(self.cluster), job_name=self.job,
                                               task_index=self.index, start=True,
                                               config=self.session_config())
        except tf.errors.OpError as exc:
            raise UsageError(f"{self.job}:{self.index} could not start its gRPC server: "
                             f"{exc.message.splitlines()[0]}")
        return self

    def session_config(self):
        import tensorflow as tf
        cfg = tf.compat.v1.ConfigProto(allow_soft_placement=False)
        # Workers talk only to the PS tasks and themselves: a lost or slow peer
        # worker can then neither block session creation nor fail this task.
        cfg.device_filters.extend(["/job:ps", self.device])
        cfg.intra_op_parallelism_threads = int(os.environ.get("HVDPS_THREADS", "0"))
        cfg.inter_op_parallelism_threads = 2 if cfg.intra_op_parallelism_threads else 0
        return cfg

    def device_setter(self):
        import tensorflow as tf
        return tf.compat.v1.train.replica_device_setter(
            worker_device=self.device, cluster=tf.train.ClusterSpec(self.cluster))

    # ------------------------------------------------------------ interface
    def wrap_optimizer(self, optimizer):
        if not self.sync:
            return optimizer
        import tensorflow as tf
        return tf.compat.v1.train.SyncReplicasOptimizer(   # PS: average R gradients per update
            optimizer, replicas_to_aggregate=self.replicas_to_aggregate,
            total_num_replicas=self.world_size)

    def sync_initial_state(self, model, optimizer):
        """Nothing to copy: one set of variables lives on the PS, initialised by the chief."""

    def reduce_metric(self, value, name="metric", op="mean"):
        """Metrics come from the chief's view of the shared variables; nothing to combine."""
        return value

    @classmethod
    def modes(cls):
        return ("async", "sync")

    @classmethod
    def server_tasks(cls, num_ps):
        return num_ps

    @classmethod
    def launch_command(cls, workers, trainer_args, python, mode="async", num_ps=1):
        return [python, "-u", "-m", "ps_train.launch", "--num_ps", str(num_ps), "--num_workers", str(workers),
                f"--{mode}", *trainer_args]

    def samples_per_update(self, batch_size):
        return batch_size * self.replicas_to_aggregate

    # ------------------------------------------------------------ lifecycle
    def done_queue(self, i):
        """The FIFOQueue on PS task ``i`` that carries the chief's 'training is over' signal.

        Using TensorFlow's own queue (shared by name across sessions) lets a PS
        leave its serving loop instead of blocking forever in ``server.join()``.
        Only that one queue may be in the graph: the session places every node.
        """
        import tensorflow as tf
        with tf.device(f"/job:ps/task:{i}"):
            return tf.queue.FIFOQueue(self.world_size + 1, tf.int32,
                                      shared_name=f"hvdps_done_{i}", name=f"hvdps_done_{i}")

    def serve_until_done(self):
        """PS main loop: serve variables until the chief signals the end.

        Also exits (with an error) if the chief's port stays closed for longer
        than --startup_timeout, so a PS launched by hand never outlives a
        crashed job for good.
        """
        import tensorflow as tf
        graph = tf.Graph()
        with graph.as_default():
            dequeue = self.done_queue(self.index).dequeue()
        cfg = tf.compat.v1.ConfigProto(device_filters=[self.device])
        opts = tf.compat.v1.RunOptions(timeout_in_ms=1000)
        chief_addr = self.cluster[self.replica_list[0][0]][0]
        last_seen = time.monotonic()
        with tf.compat.v1.Session(self.server.target, graph=graph, config=cfg) as sess:
            while True:
                try:
                    return int(sess.run(dequeue, options=opts))
                except tf.errors.DeadlineExceededError:
                    pass
                if _port_open(chief_addr):
                    last_seen = time.monotonic()
                elif time.monotonic() - last_seen > self.startup_timeout:
                    raise RunError(f"ps:{self.index}: chief {chief_addr} unreachable for "
                                   f"{self.startup_timeout:.0f}s; giving up")

    def signal_done(self, code=0, timeout=5.0):
        """Chief: tell every PS task to exit (best effort, bounded, one PS at a time)."""
        import tensorflow as tf
        opts = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout * 1000))
        for i, addr in enumerate(self.cluster["ps"]):
            if not _port_open(addr):
                continue   # already gone: nothing to tell, and a session to it would wait
            graph = tf.Graph()
            with graph.as_default():
                op = self.done_queue(i).enqueue(code)
            cfg = tf.compat.v1.ConfigProto(device_filters=[f"/job:ps/task:{i}", self.device])
            try:
                with tf.compat.v1.Session(self.server.target, graph=graph, config=cfg) as sess:
                    sess.run(op, options=opts)
            except tf.errors.OpError:
                pass

    def wait_for_ps(self):
        wait_for_ports(self.cluster["ps"], self.startup_timeout, "parameter server")


def make_v1_optimizer(cfg, learning_rate):
    """The tf.compat.v1 optimizer SyncReplicasOptimizer can wrap, same rule as the Keras one."""
    import tensorflow as tf
    if cfg.optimizer == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    if cfg.optimizer == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(learning_rate, cfg.momentum)
    return tf.compat.v1.train.AdamOptimizer(learning_rate)


def describe_placement(variables):
    """{variable name: device} -- logged so a run shows where its variables live."""
    return {v.op.name: v.device for v in variables}


def cluster_json(cluster):
    return json.dumps(cluster, sort_keys=True)
