"""Hostfiles and host lists: parsed and validated in one place (TensorFlow's cluster specs and
TF_CONFIG are tf_cluster/spec.py's).

Cluster admins hand-edit these files; a typo must come back as
``file:line: problem``, never as an MPI or gRPC failure minutes later.
"""
import re

from common.base.errors import UsageError
from common.base.files import MiB, read_input
from common.base.numbers import whole

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
            if whole(value) is None or whole(value) < 1:
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


def read_listing(path, what):
    """A hand-edited listing (hostfile, cluster spec) as text: bounded, UTF-8, or one error line."""
    raw = read_input(path, what, max_bytes=16 * MiB)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (cannot read {what})")


def parse_hostfile(path):
    return parse_hostfile_text(read_listing(path, "hostfile"), path)


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
        if whole(slots) is None or whole(slots) < 1:
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
    if whole(port) is None or not 0 < whole(port) < 65536:
        raise UsageError(f"{where}: port must be 1-65535, got {port!r}")
    return host, int(port)


def to_horovod_hosts(hosts):
    return ",".join(f"{h}:{s}" for h, s in hosts)


def to_mpi_hostfile(hosts):
    return "".join(f"{h} slots={s}\n" for h, s in hosts)
