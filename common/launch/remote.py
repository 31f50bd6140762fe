"""Jobs on other hosts: which hosts, which role goes where, how a command gets there.

The hosts come in the forms cluster users already have: an Open MPI /
horovodrun hostfile, horovodrun's ``h1:2,h2:2``, or ``slurm`` (the nodes of the
allocation this runs in). Commands reach a host through a remote shell with
ssh's calling convention, ``AGENT HOST COMMAND`` (Open MPI's ``plm_rsh_agent``):
``ssh`` by default, ``srun`` inside an allocation, or any agent the user names.
Nothing here talks to a host except through that agent.
"""
import ipaddress
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

from common.base.errors import UsageError
from common.base.files import make_dirs, write_atomic
from common.launch.hosts import parse_host_list, parse_hostfile
from common.base.procs import REPO, run_bounded

SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
SRUN_AGENT = os.path.join(REPO, "hvdps", "measure", "srun_agent.sh")


def slurm_hosts(env=None):
    """The allocation's nodes and tasks per node, as SLURM states them (``2(x3),1`` expanded)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise UsageError("--hosts slurm: not inside a SLURM allocation (SLURM_JOB_NODELIST is not set)")
    try:
        names = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                               timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        raise UsageError(f"--hosts slurm: cannot expand SLURM_JOB_NODELIST={nodelist!r} with scontrol: {exc}")
    slots = []
    for part in (env.get("SLURM_TASKS_PER_NODE") or "").split(","):
        m = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", part.strip())
        if m:
            slots += [int(m.group(1))] * int(m.group(2) or 1)
    if len(slots) != len(names):
        slots = [1] * len(names)
    return list(zip(names, slots))


def resolve_hosts(text):
    """``--hosts`` -> [(host, slots)]: a hostfile path, ``h1:2,h2:2``, or ``slurm``."""
    if text == "slurm":
        return slurm_hosts()
    if os.path.sep in text or os.path.isfile(text):
        return parse_hostfile(text)
    hosts = parse_host_list(text, "--hosts")
    seen = set()
    for host, _ in hosts:
        if host.lower() in seen:           # host names are case-insensitive: LOCALHOST is localhost
            raise UsageError(f"--hosts: host {host} listed twice (give it more slots instead: {host}:N)")
        seen.add(host.lower())
    return hosts


def rsh_argv(rsh, hosts_text=None):
    """The remote-shell agent as argv: ``--rsh`` if given, srun's agent in an allocation, else ssh."""
    if rsh:
        argv = shlex.split(rsh)
        if not argv or not shutil.which(argv[0]):
            raise UsageError(f"--rsh {rsh!r}: {argv[0] if argv else 'empty'} is not an executable")
        return argv
    if hosts_text == "slurm":
        return [SRUN_AGENT]
    if not shutil.which("ssh"):
        raise UsageError("--hosts needs ssh on this machine (or name another agent with --rsh)")
    return list(SSH)


def take_slots(hosts, n, what="workers", where="in all"):
    """The first ``n`` slots, in host order: [(host, slots used)]."""
    out, left = [], n
    for host, slots in hosts:
        if left <= 0:
            break
        use = min(slots, left)
        out.append((host, use))
        left -= use
    if left > 0:
        total = sum(s for _, s in hosts)
        raise UsageError(f"--hosts has {total} slot(s) {where}, {n} {what} asked for")
    return out


# What a remote task needs of this machine's environment (the rest is the host's own).
FORWARDED_ENV = ("TF_CPP_MIN_LOG_LEVEL", "PYTHONUNBUFFERED", "OMPI_ALLOW_RUN_AS_ROOT",
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "TF_USE_LEGACY_KERAS")


def remote_command(argv, env=None, tether=True):
    """One shell line that runs ``argv`` on the host the way it runs here: same folder, the repo
    importable, the same Python; tethered to the connection (common/launch/tether.py)."""
    env = os.environ if env is None else env
    assignments = [f"PYTHONPATH={REPO}"] + [f"{k}={env[k]}" for k in FORWARDED_ENV if env.get(k)]
    tail = [sys.executable, "-u", "-m", "common.launch.tether", *argv] if tether else list(argv)
    return f"cd {shlex.quote(REPO)} && exec env {' '.join(shlex.quote(a) for a in assignments)} {shlex.join(tail)}"


def check_hosts(hosts, agent, out_dir, timeout=30):
    """Before anything starts: every host runs a command through the agent, sees this repository
    and this Python at the same paths, and sees the run directory (shared filesystem).
    One line naming the first host that fails."""
    make_dirs(out_dir)
    token = write_atomic(os.path.join(out_dir, f".hvdps-host-check-{os.getpid()}"), "hvdps\n")
    try:
        probe = (f"test -d {shlex.quote(REPO)} || {{ echo 'no {REPO} (hosts need the same paths)'; exit 3; }}; "
                 f"test -x {shlex.quote(sys.executable)} || {{ echo 'no {sys.executable}'; exit 3; }}; "
                 f"test -f {shlex.quote(token)} || {{ echo 'cannot see {out_dir} (the run directory must be on a "
                 f"filesystem every host shares)'; exit 3; }}; echo hvdps-ok")
        for host in dict.fromkeys(h for h, _ in hosts):
            try:
                r = run_bounded([*agent, host, probe], timeout)
            except subprocess.TimeoutExpired:
                raise UsageError(f"host {host}: no answer through {agent[0]} within {timeout}s")
            if "hvdps-ok" not in r.stdout:
                said = (r.stdout.strip() or r.stderr.strip() or f"exit code {r.returncode}").splitlines()[-1]
                raise UsageError(f"host {host}: {said}" + ("" if r.returncode == 3 else
                                 f" (cannot run commands through {agent[0]}; passwordless ssh set up?)"))
    finally:
        os.unlink(token)


def _address_of(host):
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        try:
            return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
        except (socket.gaierror, IndexError, UnicodeError):
            raise UsageError(f"host {host}: cannot resolve its address; name the network with --network_interface")


def _ip(argv):
    return subprocess.run(["ip", "-o", *argv], capture_output=True, text=True, timeout=10).stdout


def local_network_of(host):
    """The network of this machine's interface that reaches ``host``: the route's device
    (``ip route get``) and that device's IPv4 network. A host that is this machine routes through
    ``lo`` even when it is named by its cluster address; then the network is that of the interface
    holding the address (never 127.0.0.0/8, which would keep Open MPI's daemons from calling back
    from the other hosts). Only a loopback address gives the loopback network."""
    addr = _address_of(host)
    try:
        dev = re.search(r"\bdev (\S+)", _ip(["route", "get", addr])).group(1)
        if dev == "lo":
            if ipaddress.ip_address(addr).is_loopback:
                return "127.0.0.0/8"
            held = re.search(rf"\binet ({re.escape(addr)}/\d+)", _ip(["-4", "addr", "show"]))
            return str(ipaddress.ip_interface(held.group(1)).network)
        cidr = re.search(r"inet (\S+)", _ip(["-4", "addr", "show", "dev", dev])).group(1)
    except (OSError, subprocess.SubprocessError, AttributeError):
        raise UsageError(f"host {host}: cannot tell which network reaches it; name it with --network_interface")
    return str(ipaddress.ip_interface(cidr).network)


def mpi_network(hosts):
    """The network Open MPI's traffic is kept on for a job on ``hosts`` [(host, slots)]: the one
    that reaches the first host other than this machine (the launching machine is usually one of
    the hosts: a head node, the first node of a batch job), else this machine's own."""
    nets = [local_network_of(h) for h, _ in hosts]
    return next((n for n in nets if n != "127.0.0.0/8"), nets[0])
