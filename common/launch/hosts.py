"""Hostfiles, cluster specs and TF_CONFIG: parsed and validated in one place.

Cluster admins hand-edit these files; a typo must come back as
``file:line: problem``, never as an MPI or gRPC failure minutes later.
"""
import json
import re

from common.base.errors import UsageError
from common.base.files import MiB, read_input
from common.formats.schemas import parse_json

ROLES = ("chief", "ps", "worker", "evaluator")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-\.]*[A-Za-z0-9])?$|^\[[0-9a-fA-F:]+\]$")


# Slots per host: far above any real host's cores or GPUs, far below what would make every
# per-slot list this module builds exhaust memory.
MAX_SLOTS = 4096


def _check_host(host, where):
    if not host or not _HOST_RE.match(host):
        raise UsageError(f"{where}: invalid host name {host!r}")


def parse_hostfile_text(text, source="<hostfile>"):
    """Open MPI / horovodrun hostfile -> list of (host, slots), in file order.

    Accepts ``host``, ``host slots=N`` and ``host slots=N max_slots=M``; a host
    without ``slots=`` counts one slot (Open MPI's default for hostfiles).
    """
    hosts, seen = [], set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        parts = line.split()
        host = parts[0]
        _check_host(host, where)
        given = {}
        for opt in parts[1:]:
            key, sep, value = opt.partition("=")
            if key not in ("slots", "max_slots", "max-slots") or not sep:
                raise UsageError(f"{where}: unknown option {opt!r} (expected slots=N)")
            key = key.replace("-", "_")
            if key in given:
                raise UsageError(f"{where}: {key} given twice")
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"{where}: {key} must be a positive integer, got {value!r}")
            if int(value) > MAX_SLOTS:
                raise UsageError(f"{where}: {key} must be at most {MAX_SLOTS}, got {value}")
            given[key] = int(value)
        slots = given.get("slots", 1)
        if slots > given.get("max_slots", slots):
            raise UsageError(f"{where}: slots={slots} is more than max_slots={given['max_slots']}")
        if host in seen:
            raise UsageError(f"{where}: host {host} listed twice")
        seen.add(host)
        hosts.append((host, slots))
    if not hosts:
        raise UsageError(f"{source}: no hosts listed")
    return hosts


def _read(path, what):
    raw = read_input(path, what, max_bytes=16 * MiB)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (cannot read {what})")


def parse_hostfile(path):
    return parse_hostfile_text(_read(path, "hostfile"), path)


def parse_host_list(text, source="-H"):
    """horovodrun's ``-H h1:2,h2:2`` -> [(host, slots)]."""
    hosts = []
    for item in [s.strip() for s in text.split(",")]:
        if not item:
            raise UsageError(f"{source}: empty entry in {text!r}")
        host, sep, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if not sep:
            host, slots = item, "1"
        _check_host(host, source)
        if not slots.isdigit() or int(slots) < 1:
            raise UsageError(f"{source}: slots for {host} must be a positive integer, got {slots!r}")
        if int(slots) > MAX_SLOTS:
            raise UsageError(f"{source}: slots for {host} must be at most {MAX_SLOTS}, got {slots}")
        hosts.append((host, int(slots)))
    return hosts


def parse_address(addr, where):
    """``host:port`` -> (host, port) with the port range checked."""
    if not isinstance(addr, str) or ":" not in addr:
        raise UsageError(f"{where}: expected host:port, got {addr!r}")
    host, _, port = addr.rpartition(":")
    _check_host(host, where)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{where}: port must be 1-65535, got {port!r}")
    return host, int(port)


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
    text = _read(path, "cluster spec")
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


def to_horovod_hosts(hosts):
    return ",".join(f"{h}:{s}" for h, s in hosts)


def to_mpi_hostfile(hosts):
    return "".join(f"{h} slots={s}\n" for h, s in hosts)


def to_cluster_spec(hosts, num_ps=1, port=2222, chief=True):
    """Inventory -> TF cluster: PS tasks on the first hosts, one task per slot, ports counted up."""
    tasks = [h for h, s in hosts for _ in range(s)]
    needed = num_ps + 1
    if len(tasks) < needed:
        raise UsageError(f"{len(tasks)} slots cannot hold {num_ps} PS and at least one worker")
    next_port = {}

    def addr(h):
        p = next_port.get(h, port)
        if p > 65535:
            raise UsageError(f"--port {port}: host {h} needs ports up to {p}, past 65535; choose a lower --port")
        next_port[h] = p + 1
        return f"{h}:{p}"

    cluster = {"ps": [addr(h) for h in tasks[:num_ps]]}
    rest = [addr(h) for h in tasks[num_ps:]]
    if chief:
        cluster["chief"], rest = rest[:1], rest[1:]
    if rest:
        cluster["worker"] = rest
    return cluster


def tf_configs(cluster):
    """One TF_CONFIG string per task, in launch order."""
    out = []
    for role in ("chief", "ps", "worker"):
        for i in range(len(cluster.get(role, []))):
            out.append((role, i, json.dumps({"cluster": cluster, "task": {"type": role, "index": i}})))
    return out
