"""Which address a task's gRPC server listens on, and making TensorFlow honour it.

TensorFlow's gRPC runtime is unauthenticated (anyone who reaches a task's port
can read or overwrite the model) and its server always binds every interface.
hvdps binds the task's own address instead: loopback for local runs, the
configured address on a cluster. TensorFlow offers no option for that, so the
task re-executes itself once with a tiny preloaded library
(common/native/bind_to.c) that turns that one wildcard bind() into a bind()
to the chosen address.

``--bind auto`` (default): the address the cluster gives this task, if it is
an address of this machine; otherwise (a Kubernetes service name, say, which
resolves to a virtual IP) every interface, said in one line. ``--bind ADDR``
forces one; ``--bind 0.0.0.0`` (or ``::``) asks for every interface.
"""
import ipaddress
import os
import socket
import sys

from common.base.errors import UsageError
from common.launch.hosts import parse_address
from common.base.procs import shim_library

WILDCARDS = ("0.0.0.0", "::", "*")


def choose_address(host, bind):
    """(address to bind or None for every interface, note for the user or None)."""
    if bind not in (None, "", "auto"):
        if bind in WILDCARDS:
            return None, None
        try:
            ipaddress.ip_address(bind)
        except ValueError:
            raise UsageError(f"--bind {bind}: expected an IP address, 'auto' or 0.0.0.0")
        if not bindable(bind):
            raise UsageError(f"--bind {bind}: not an address of this machine")
        own = resolve(host.strip("[]"))
        if own and own != bind and (ipaddress.ip_address(own).is_loopback or bindable(own)):
            raise UsageError(f"--bind {bind}: the cluster gives this task {host} ({own}), also an address of this "
                             f"machine; its peers would connect there and find nothing listening")
        return bind, None
    ip = resolve(host.strip("[]"))
    if ip and (ipaddress.ip_address(ip).is_loopback or bindable(ip)):
        return ip, None
    return None, (f"{host} is not an address of this machine (a service name?): listening on every "
                  f"interface; restrict with --bind ADDR")


def resolve(host):
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (socket.gaierror, IndexError, UnicodeError):
        return None


def bindable(ip):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False


def restrict_listening(address, port, who):
    """Re-execute this process with the shim preloaded so its gRPC server binds ``address``.

    Returns only when nothing needs doing (wildcard asked for, or already in place).
    """
    if address is None:
        return
    if os.environ.get("HVDPS_BIND_ADDR") == address and os.environ.get("HVDPS_BIND_PORT") == str(port):
        return
    lib = shim_library()
    if lib is None:
        print(f"warning: {who}: no C compiler to build the bind shim: the gRPC server will listen on "
              f"every interface (run `make setup`)", file=sys.stderr, flush=True)
        return
    env = dict(os.environ, HVDPS_BIND_ADDR=address, HVDPS_BIND_PORT=str(port))
    env["LD_PRELOAD"] = " ".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def listen_only_on(backend, bind):
    """Bind this task's gRPC server to its own address (may re-execute the process)."""
    host, port = parse_address(backend.address, f"{backend.job}:{backend.index}")
    address, note = choose_address(host, bind)
    if note:
        print(f"{backend.job}:{backend.index}: {note}", flush=True)
    backend.bind_address = address
    restrict_listening(address, port, f"{backend.job}:{backend.index}")   # may re-execute this process
