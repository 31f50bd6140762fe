"""TensorFlow's cluster plumbing for every TF method: the cluster spec ({role: [host:port]}) as a
user writes it (JSON or YAML) or a launcher builds it from hosts, and TF_CONFIG as Kubeflow's TFJob
and the local launchers set it; parsed and validated in one place, so a typo comes back as
``source: problem``, never as a gRPC failure minutes later. The roles are TensorFlow's own
(``tf.train.ClusterSpec``: chief, ps, worker, evaluator)."""
import json

from common.base.errors import UsageError
from common.formats.schemas import parse_json
from common.launch.hosts import parse_address, read_listing
from tf_cluster.jobset import pod_tf_config
from common.base.numbers import whole

ROLES = ("chief", "ps", "worker", "evaluator")


def validate_cluster(cluster, source="cluster spec", need_ps=True):
    """A TF cluster dict {role: [host:port, ...]} with known roles and unique addresses;
    ``need_ps``: a parameter-server cluster (an all-reduce cluster has workers only)."""
    if not isinstance(cluster, dict) or not cluster:
        raise UsageError(f"{source}: expected an object mapping roles to host:port lists")
    seen = {}
    for role, addrs in cluster.items():
        if role not in ROLES:
            raise UsageError(f"{source}: unknown role {role!r} (valid: {', '.join(ROLES)})")
        if not isinstance(addrs, list) or not addrs:
            raise UsageError(f"{source}: role {role!r} needs a non-empty list of host:port")
        for i, addr in enumerate(addrs):
            where = f"{source}: {role}[{i}]"
            parse_address(addr, where)
            if addr in seen:
                raise UsageError(f"{where}: address {addr} also used by {seen[addr]}")
            seen[addr] = f"{role}[{i}]"
    if need_ps and "ps" not in cluster:
        raise UsageError(f"{source}: no 'ps' tasks listed")
    if "worker" not in cluster and "chief" not in cluster:
        raise UsageError(f"{source}: no 'worker' or 'chief' tasks listed")
    if len(cluster.get("chief", [])) > 1:
        raise UsageError(f"{source}: at most one chief, got {len(cluster['chief'])}")
    return {role: list(addrs) for role, addrs in cluster.items()}


def parse_cluster_spec(path):
    """JSON or YAML file: either ``{"cluster": {...}}`` (TF_CONFIG style) or the roles directly."""
    text = read_listing(path, "cluster spec")
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml
            data = yaml.safe_load(text)
        else:
            data = parse_json(text, path)
    except UsageError:
        raise
    except Exception as exc:  # json/yaml raise different types; one message
        raise UsageError(f"{path}: not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}: "
                         f"{str(exc).splitlines()[0]}")
    if isinstance(data, dict) and "cluster" in data:
        data = data["cluster"]
    return validate_cluster(data, path)


def parse_tf_config(text, source="TF_CONFIG", need_ps=True):
    """Kubeflow TFJob's TF_CONFIG -> (cluster, role, index)."""
    data = parse_json(text, source)
    if not isinstance(data, dict) or "cluster" not in data or "task" not in data:
        raise UsageError(f"{source} must have 'cluster' and 'task' keys")
    cluster = validate_cluster(data["cluster"], source, need_ps)
    task = data["task"]
    if not isinstance(task, dict) or "type" not in task:
        raise UsageError(f"{source}: task needs 'type' and 'index'")
    role, index = task["type"], task.get("index", 0)
    if not isinstance(role, str):
        raise UsageError(f"{source}: task type must be a string such as \"worker\", got {role!r}")
    if role not in cluster:
        raise UsageError(f"{source}: task type {role!r} is not in the cluster "
                         f"(roles: {', '.join(cluster)})")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cluster[role]):
        raise UsageError(f"{source}: task index {index!r} out of range for {role} "
                         f"(0..{len(cluster[role]) - 1})")
    return cluster, role, index


def role_counts(text):
    """``ps=2,chief=1`` -> (("ps", 2), ("chief", 1)): tasks of TensorFlow's roles besides the workers,
    in the order given, each count from 1 to 4096; refused with the valid roles named."""
    out = {}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        role, eq, count = part.partition("=")
        if role not in ROLES or role == "worker":
            raise UsageError(f"{part!r}: expected ROLE=N with ROLE one of {', '.join(r for r in ROLES if r != 'worker')}"
                             " (the rest of the slots are workers)")
        n = whole(count)
        if not (eq and n is not None and 1 <= n <= 4096) or role in out:
            raise UsageError(f"{part!r}: expected {role}=N once, N from 1 to 4096")
        out[role] = n
    return tuple(out.items())


def to_cluster_spec(hosts, roles=(("ps", 1), ("chief", 1)), port=2222):
    """Inventory -> TF cluster: the tasks of each of ``roles`` ((role, count), in order) on the first
    slots, one task per slot, then a worker on every slot left; ports counted up on each host."""
    tasks = [h for h, s in hosts for _ in range(s)]
    needed = sum(n for _, n in roles) + 1
    if len(tasks) < needed:
        asked = ", ".join(f"{n} {role}" for role, n in roles)
        raise UsageError(f"{len(tasks)} slots cannot hold {asked} and at least one worker")
    next_port = {}

    def addr(h):
        p = next_port.get(h, port)
        if p > 65535:
            raise UsageError(f"--port {port}: host {h} needs ports up to {p}, past 65535; choose a lower --port")
        next_port[h] = p + 1
        return f"{h}:{p}"

    cluster, rest = {}, [addr(h) for h in tasks]
    for role, n in roles:
        cluster[role], rest = rest[:n], rest[n:]
    cluster["worker"] = rest
    return cluster


def tf_configs(cluster):
    """One TF_CONFIG string per task, in launch order."""
    out = []
    for role in ("chief", "ps", "worker"):
        for i in range(len(cluster.get(role, []))):
            out.append((role, i, json.dumps({"cluster": cluster, "task": {"type": role, "index": i}})))
    return out


def cluster_addresses(roles, port):
    """Roles on hosts -> {role: [host:port]}, ports counted up from ``port`` on each host."""
    next_port, out = {}, {}
    for role in ("ps", "worker", "chief"):
        for host in roles.get(role, []):
            p = next_port.get(host, port)
            if p > 65535:
                raise UsageError(f"--port {port}: host {host} needs ports past 65535")
            next_port[host] = p + 1
            fmt = f"[{host}]" if ":" in host and not host.startswith("[") else host
            out.setdefault(role, []).append(f"{fmt}:{p}")
    return out


def tf_config_of(environ):
    """The TF_CONFIG a task process has: its own variable, else the one its JobSet pod's variables
    describe (tf_cluster/jobset.py); "" for neither."""
    text = (environ.get("TF_CONFIG") or "").strip()
    if text:
        return text
    return pod_tf_config(environ) or ""


def task_of(environ, argv):
    """(role, index) a TensorFlow task process was given, from its TF_CONFIG or its command line's
    ``--job_name``/``--task_index`` (a task with an index and no role is a worker, as an all-reduce
    cluster's are); None for a process that is not a task (a launcher, a shell)."""
    try:
        text = tf_config_of(environ)
    except UsageError:
        return None
    if text:
        try:
            task = json.loads(text).get("task") or {}
            return str(task["type"]), int(task["index"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
    flags = {}
    for i, arg in enumerate(argv):
        for name in ("--job_name", "--task_index"):
            if arg.startswith(name + "="):
                flags[name] = arg.split("=", 1)[1]
            elif arg == name and i + 1 < len(argv):
                flags[name] = argv[i + 1]
    index = whole(flags.get("--task_index", ""))
    if index is None:
        return None
    return flags.get("--job_name", "worker"), index
