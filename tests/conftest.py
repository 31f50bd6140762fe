"""Shared test helpers: run real processes with a bound on time and no leftovers."""
import os
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def env(**extra):
    e = dict(os.environ)
    e.update({
        "PYTHONPATH": REPO + os.pathsep + e.get("PYTHONPATH", ""),
        "PATH": BIN + os.pathsep + e.get("PATH", ""),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_btl": "self,tcp",
        "OMPI_MCA_btl_tcp_if_include": "lo",
        "OMPI_MCA_oob_tcp_if_include": "lo",
        "PYTHONUNBUFFERED": "1",
    })
    e.update({k: str(v) for k, v in extra.items()})
    return e


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


def py(*args, **kw):
    return run([sys.executable, *args], **kw)


@pytest.fixture
def digits_cfg():
    from common.config import make_config
    return make_config(dataset="digits", model="mlp")
