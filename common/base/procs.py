"""Ports and child processes: the one copy of what every launcher and test needs.

TensorFlow waits forever for a task that never comes up, and Open MPI refuses
to start as root; both are turned here into bounded, explained behaviour.
"""
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from common.base.errors import RunError
from common.base.numbers import whole

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIM_SOURCE = os.path.join(REPO, "common", "native", "bind_to.c")
SHIM_BUILT = os.path.join(REPO, "common", "native", "libhvdps_bind.so")   # made by `make setup`


def split_address(addr):
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def port_open(addr, timeout=0.5):
    """True if something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection(split_address(addr), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_ports(addresses, timeout, what, flag="--startup_timeout"):
    """Block until every host:port accepts TCP, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    for addr in addresses:
        while not port_open(addr, timeout=1.0):
            if time.monotonic() > deadline:
                raise RunError(f"{what} {addr} did not come up within {timeout:g}s ({flag}); "
                               f"is it running and reachable?")
            time.sleep(0.2)


def free_ports(n, host="127.0.0.1"):
    """Ports the kernel says are free now; all held open together so they are distinct."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def child_env(base=None, **extra):
    """Environment for a process this project starts: repo importable, venv first on PATH,
    unbuffered output, TF's C++ start-up chatter off, Open MPI allowed to run as root."""
    env = dict(os.environ if base is None else base)
    env.update({
        "PYTHONPATH": REPO + os.pathsep + env.get("PYTHONPATH", ""),
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        "PYTHONUNBUFFERED": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    })
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def shim_library():
    """Path of the compiled shim: the one `make setup` built, else one compiled now into
    the user's cache (needs a C compiler); None if neither is possible."""
    if os.path.exists(SHIM_BUILT):
        return SHIM_BUILT
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not os.path.exists(SHIM_SOURCE):
        return None
    digest = hashlib.sha256(open(SHIM_SOURCE, "rb").read()).hexdigest()[:12]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "hvdps")
    path = os.path.join(cache, f"libhvdps_bind-{digest}.so")
    if not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        if subprocess.call([cc, "-shared", "-fPIC", "-O2", "-o", tmp, SHIM_SOURCE, "-ldl"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) != 0:
            return None
        os.replace(tmp, path)
    return path


def loopback_only_env():
    """Environment that keeps every listening socket of a process tree on loopback.

    For the local runs this project starts itself (mpirun's PMIx tool listener,
    for one, binds every interface whatever its interface settings say).
    Empty when the shim cannot be had (then docs/clusters.md's caveat, "What listens on the network", applies).
    """
    lib = shim_library()
    if lib is None:
        return {}
    preload = " ".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, "HVDPS_BIND_ADDR": "127.0.0.1", "HVDPS_BIND_PORT": "any"}


# Launchers set one of these before Python starts, so the rank is known before
# hvd.init() -- needed to silence the duplicate error lines of ranks 1..n-1.
_RANK_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def under_launcher():
    """True when mpirun, horovodrun or srun started this process."""
    return any(whole(os.environ.get(name, "")) is not None for name in _RANK_ENV)


def launcher_rank(environ=None, default=0):
    """This process's rank as its launcher set it (or ``environ``'s: another process's); ``default``
    where no launcher did."""
    environ = os.environ if environ is None else environ
    for name in _RANK_ENV:
        if whole(environ.get(name, "")) is not None:
            return whole(environ[name])
    return default


def exists(pid):
    """True while process ``pid`` exists (a zombie too): what a name holding a pid is checked by."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def host_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory(meminfo="/proc/meminfo"):
    """Bytes the kernel could give new processes now without swapping (MemAvailable); None where
    it does not say."""
    try:
        with open(meminfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "MemAvailable":
                    number, unit = (value.split() + [""])[:2]
                    return int(number) * (1024 if unit == "kB" else 1)
    except (OSError, ValueError):
        return None
    return None


def run_bounded(argv, timeout, **kw):
    """``subprocess.run`` that ends within ``timeout`` with everything it started: the command runs
    in a process group of its own, which is killed whole on time-out (a remote shell's own children
    included, and with them the pipes they hold, which would keep ``communicate`` waiting). Returns
    the CompletedProcess, or raises ``subprocess.TimeoutExpired`` once the group is gone."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         text=True, start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        try:
            p.communicate(timeout=5)
        except subprocess.TimeoutExpired:     # a child that left the group still holds a pipe
            for stream in (p.stdout, p.stderr):
                stream.close()
            p.wait()
        raise subprocess.TimeoutExpired(argv, timeout)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)    # whatever the command left behind in its group
        except (ProcessLookupError, PermissionError):
            pass
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


@contextlib.contextmanager
def native_stderr_quiet():
    """File descriptor 2 to nowhere while TensorFlow starts in this process: its C++ start-up lines
    (absl's, written before TF_CPP_MIN_LOG_LEVEL applies: "failed call to cuInit: ... CUDA error" on
    a machine without a GPU) would otherwise end a command's output. What goes wrong comes back as
    an exception, said after the descriptor is restored."""
    sys.stderr.flush()
    saved, sink = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(sink)
