"""Who is who in a parameter-server job: host flags, --cluster_spec or TF_CONFIG, checked.

The three sources a cluster admin may use are merged here, and any
disagreement between them is a one-line usage error rather than a task that
waits forever for a peer at the wrong address.
"""
import os

from common.base.errors import UsageError
from common.launch.hosts import parse_address
from tf_cluster.spec import parse_cluster_spec, parse_tf_config, tf_config_of, validate_cluster
from common.base.numbers import whole

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
    g.add_argument("--backup_workers", type=int, default=0,
                   help="sync: K backup workers (Chen et al. 2016): each update averages the first N - K of the "
                        "N workers' gradients and drops the late ones as stale; --replicas_to_aggregate N - K")
    g.add_argument("--ps_api", choices=("v1", "v2"), default="v1",
                   help="v1: TensorFlow 1's between-graph replication, async or --sync (default); v2: TensorFlow "
                        "2's ParameterServerStrategy + ClusterCoordinator, async only, needs a chief task "
                        "(the coordinator)")
    g.add_argument("--bind", default="auto",
                   help="address this task's gRPC server listens on: auto = its own cluster address when that "
                        "is an address of this machine (loopback for local runs), else every interface; an IP; "
                        "or 0.0.0.0 for every interface. TensorFlow's gRPC has no authentication: keep it narrow")
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


BACKUP = "backup"              # the mode of sync training with K backup workers: backupK


def mode_name(sync, backup_workers=0):
    """A classic PS job's mode as its records and the comparison name it: async, sync, or backupK
    (sync with K backup workers)."""
    return f"{BACKUP}{backup_workers}" if sync and backup_workers else "sync" if sync else "async"


def backups(mode):
    """K of a ``backupK`` mode; 0 for any other."""
    return (whole(mode[len(BACKUP):]) or 0) if mode and mode.startswith(BACKUP) else 0


def base_mode(mode):
    """The trainer's own switch of a mode: ``backupK`` trains with --sync."""
    return "sync" if backups(mode) else mode


def check_precision(ps_api, precision):
    """TensorFlow 2's ParameterServerStrategy cannot take ``--precision mixed_float16``: Keras'
    LossScaleOptimizer refuses every strategy whose variables are not one copy per replica (it would
    unscale a gradient once per worker, not once per variable), and float16 without a loss scale
    loses the small gradients. One line before any task starts (the trainer, its launcher and hvdps
    compare ask this)."""
    if ps_api == "v2" and precision == "mixed_float16":
        raise UsageError("--precision mixed_float16 cannot run under TensorFlow 2's ParameterServerStrategy "
                         "(ps2): Keras' LossScaleOptimizer takes only strategies with a copy of every variable per "
                         "replica; use --precision mixed_bfloat16 (no loss scale needed), or the classic PS (ps, "
                         "--ps_api v1), whose loss scale lives on the PS")


def jit_refusal(ps_api):
    """Why a PS job cannot compile its step with XLA: the step reads and updates variables that live on
    the PS tasks, and an XLA cluster runs on one device with its resources on that device."""
    if ps_api == "v2":
        return ("TensorFlow 2's ParameterServerStrategy (ps2) keeps the variables on the PS tasks, and an "
                "XLA-compiled function takes only resources of its own device: each worker's step reads "
                "and updates the PS tasks' variables remotely")
    return ("the classic PS (ps) trains a TF1 graph whose variables and updates are placed on the PS "
            "tasks; XLA compiles one device's ops (tf.function(jit_compile=True) is TF2's), and the "
            "step's reads and updates are on other tasks' devices")


def check_ps_flags(args):
    """The PS flags that do not depend on the cluster (the launcher checks them once, too)."""
    check_precision(args.ps_api, getattr(args, "precision", "float32"))
    why = jit_refusal(args.ps_api) if getattr(args, "jit_compile", False) else None
    if why:
        raise UsageError(f"--jit_compile: {why}")
    given = next((f for f in ("sync", "replicas_to_aggregate", "backup_workers") if getattr(args, f)), None)
    if args.ps_api == "v2" and given:
        raise UsageError(f"--{given} needs --ps_api v1: TensorFlow 2's ParameterServerStrategy is asynchronous only")
    for flag in ("replicas_to_aggregate", "backup_workers"):
        if getattr(args, flag) and not args.sync:
            raise UsageError(f"--{flag} applies to synchronous training: add --sync")
        if getattr(args, flag) < 0:
            raise UsageError(f"--{flag} must be >= 0, got {getattr(args, flag)}")
    if args.replicas_to_aggregate and args.backup_workers:
        raise UsageError("--backup_workers K means --replicas_to_aggregate N - K: give one of them")


def check_aggregation(workers, backup_workers=0, replicas_to_aggregate=0, spell=None):
    """Sync training's counts against the job's ``workers``: backup workers leave a gradient to wait
    for, and an update aggregates 1..N of them. The trainer's rule at its start, which the launcher
    and the plan apply first; ``spell(k)``: how the line names K backups (the flag, or a plan's mode)."""
    spell = spell or (lambda k: f"--backup_workers {k}")
    if backup_workers and backup_workers >= workers:
        raise UsageError(f"{spell(backup_workers)} leaves no gradient to wait for: " +
                         (f"at most {spell(workers - 1)} with {workers} workers" if workers > 1 else
                          "1 worker has none to spare"))
    if not 0 <= replicas_to_aggregate <= workers:
        raise UsageError(f"--replicas_to_aggregate {replicas_to_aggregate} must be 1..{workers}")


def resolve_cluster(args, environ=None):
    """(cluster, job, index) from flags, --cluster_spec or TF_CONFIG; conflicts are errors."""
    environ = os.environ if environ is None else environ
    check_ps_flags(args)
    flags = {"ps": _host_list(args.ps_hosts, "--ps_hosts"),
             "worker": _host_list(args.worker_hosts, "--worker_hosts"),
             "chief": _host_list(args.chief_host, "--chief_host")}
    flags = {k: v for k, v in flags.items() if v is not None}
    cluster, job, index, source = None, args.job_name, args.task_index, "flags"
    if args.cluster_spec:
        cluster, source = parse_cluster_spec(args.cluster_spec), args.cluster_spec
    tf_config = tf_config_of(environ)            # its own, or its JobSet pod's (tf_cluster/jobset.py)
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
