"""Shared test helpers: run real processes with a bound on time and no leftovers."""
import os
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def env(**extra):
    """The project's child environment (common.procs), with Open MPI kept on loopback."""
    from common.procs import child_env
    return child_env(OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                     OMPI_MCA_oob_tcp_if_include="lo", **extra)


def run(argv, timeout=300, **kw):
    """Run a command in its own process group; on timeout kill the whole group and fail."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=kw.pop("env", env()), cwd=kw.pop("cwd", REPO), **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"timed out after {timeout}s: {' '.join(argv)}\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)   # anything the command left behind
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def descendants(root):
    """PIDs of every process below ``root`` (launchers put workers in groups of their own)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def py(*args, **kw):
    return run([sys.executable, *args], **kw)


@pytest.fixture
def digits_cfg():
    from common.config import make_config
    return make_config(dataset="digits", model="mlp")
