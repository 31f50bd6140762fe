"""Horovod 0.28.1 compiled against the TensorFlow installed, with hvdps's patch, cached as a wheel.

    python hvdps/install/horovod_build.py            # prints the wheel's path (built now, or from the cache)
    python hvdps/install/horovod_build.py --key      # prints the cache key only
    python hvdps/install/horovod_build.py --record   # after installing the wheel: note its key in the venv
    python hvdps/install/horovod_build.py --check    # exit 0 if the Horovod installed is the one --key names

``make setup`` runs this with the venv's interpreter after TensorFlow is installed, then installs the
wheel it prints. Horovod's last release predates TensorFlow 2.19 and Keras 3, so the sdist from PyPI
(checked against its SHA-256) gets ``patches/horovod-0.28.1.patch`` before it is compiled with
TensorFlow, MPI and Gloo (about 3 minutes on 2 cores here). The wheel is only valid for the TensorFlow,
Python and MPI it was compiled against, and for the patch: those four name its cache folder
(``$HVDPS_CACHE``, default ``~/.cache/hvdps`` as for the bind shim), so a later set-up on the same machine (another
clone, CI) installs it in seconds, and a change of any of them builds again. Standard library only:
it runs before the project is installed.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

HOROVOD = "0.28.1"
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
HERE = os.path.dirname(os.path.abspath(__file__))
PATCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "patches", f"horovod-{HOROVOD}.patch")
BUILD_ENV = {"HOROVOD_WITH_TENSORFLOW": "1", "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
             "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1", "MAKEFLAGS": "-j2"}


class BuildError(Exception):
    pass


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tensorflow_version():
    out = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                         capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError("TensorFlow does not import in this environment: install the stack first (make setup)")
    return out.stdout.strip().splitlines()[-1]


def mpi_version():
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        raise BuildError("mpirun is not on the PATH: install Open MPI (Debian: libopenmpi-dev openmpi-bin)")
    first = (out.stdout.strip().splitlines() or ["unknown"])[0]     # "mpirun (Open MPI) 4.1.4"
    return first.split()[-1] if "Open MPI" in first else first.replace(" ", "_")


def cache_key():
    """What the compiled wheel depends on: Horovod, TensorFlow, Python, MPI and the patch."""
    py = f"{sys.version_info[0]}{sys.version_info[1]}"
    return (f"horovod-{HOROVOD}-tf{tensorflow_version()}-py{py}-ompi{mpi_version()}"
            f"-patch{_sha256(PATCH)[:12]}")


def cache_dir():
    root = os.environ.get("HVDPS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hvdps")
    return os.path.join(root, "horovod-wheels", cache_key())


def cached_wheel(folder):
    wheels = sorted(f for f in os.listdir(folder) if f.endswith(".whl")) if os.path.isdir(folder) else []
    return os.path.join(folder, wheels[0]) if wheels else None


def _run(cmd, cwd, log, env=None):
    with open(log, "a") as out:
        code = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        with open(log) as f:
            tail = f.read()[-4000:]
        raise BuildError(f"{' '.join(cmd[:3])} ... failed (exit {code}); the log's end:\n{tail}")


def build(folder):
    """Download, check, patch and compile the sdist; the wheel lands in ``folder`` whole or not at all."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hvdps-horovod-", dir=parent) as tmp:
        log = os.path.join(tmp, "build.log")
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
              f"horovod=={HOROVOD}", "-d", tmp], tmp, log)
        sdist = os.path.join(tmp, f"horovod-{HOROVOD}.tar.gz")
        if not os.path.exists(sdist) or _sha256(sdist) != SDIST_SHA256:
            raise BuildError(f"the horovod {HOROVOD} sdist from the index is not the one the patch was written "
                             f"for (SHA-256 {SDIST_SHA256[:12]}...)")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        src = os.path.join(tmp, f"horovod-{HOROVOD}")
        _run(["patch", "-p1", "--forward", "--batch", "-i", PATCH], src, log)
        env = {**os.environ, **BUILD_ENV,
               "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
        wheels = os.path.join(tmp, "wheel")
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", wheels, src],
             src, log, env=env)
        shutil.copy(log, os.path.join(wheels, "build.log"))
        try:
            os.rename(wheels, folder)        # atomic: a cache folder always holds a whole wheel
        except OSError:
            if cached_wheel(folder) is None:  # else another set-up cached the same wheel meanwhile
                raise
    return cached_wheel(folder)


def _recorded():
    return os.path.join(sys.prefix, ".hvdps-horovod-key")


def installed_is_current():
    """Horovod imports with its compiled ops and was installed from the wheel of this key: the same
    TensorFlow, Python, MPI and patch (a changed patch means a new wheel, not a stale install)."""
    try:
        with open(_recorded()) as f:
            if f.read().strip() != cache_key():
                return False
    except OSError:
        return False
    code = ("import json, os, horovod, tensorflow as tf\n"
            "meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), 'metadata.json')))\n"
            "assert meta.get('tensorflow') == tf.__version__\n"
            "import horovod.tensorflow\nfrom horovod.tensorflow.util import var_ref\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return out.returncode == 0


def main(argv):
    try:
        if argv == ["--key"]:
            print(cache_key())
            return 0
        if argv == ["--check"]:
            return 0 if installed_is_current() else 1
        if argv == ["--record"]:
            with open(_recorded(), "w") as f:
                f.write(cache_key() + "\n")
            return 0
        if argv:
            print("error: usage: python hvdps/install/horovod_build.py [--key | --check | --record]")
            return 2
        folder = cache_dir()
        wheel = cached_wheel(folder)
        if wheel is None:
            print(f"== compiling horovod {HOROVOD} with {os.path.relpath(PATCH)} against this TensorFlow "
                  f"(about 3 minutes on 2 cores; cached in {folder})", file=sys.stderr)
            wheel = build(folder)
        else:
            print(f"== horovod {HOROVOD} from the cache: {wheel}", file=sys.stderr)
        print(wheel)
        return 0
    except (BuildError, OSError) as exc:
        print(f"error: building horovod: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
