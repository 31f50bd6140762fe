"""The Horovod method's install step: Horovod 0.28.1 compiled against the TensorFlow installed, with
hvdps's patch, cached as a wheel, installed, and its build verified.

    python horovod_train/install.py --install  # installed already, or the wheel (cached or built now) installed
    python horovod_train/install.py --verify   # horovodrun --check-build: TensorFlow, MPI and Gloo built in
    python horovod_train/install.py            # prints the wheel's path (built now, or from the cache)
    python horovod_train/install.py --key      # prints the cache key only
    python horovod_train/install.py --record   # after installing the wheel and its runner patch: note the key in the venv
    python horovod_train/install.py --check    # exit 0 if the Horovod installed is the one --key names, runner patched

A method package whose method needs more than pip's dependencies has an ``install.py`` taking
``--install`` and ``--verify``: ``make setup`` runs every ``<name>_train/install.py`` with the venv's
interpreter after TensorFlow is installed (``--install``) and once hvdps is installed (``--verify``).
Horovod's last release predates TensorFlow 2.19 and Keras 3, so the sdist from PyPI
(checked against its SHA-256) gets ``patches/horovod-0.28.1.patch`` before it is compiled with
TensorFlow, MPI and Gloo (about 3 minutes on 2 cores here). The wheel is only valid for the TensorFlow,
Python and MPI it was compiled against, and for the patch: those four name its cache folder
(``$HVDPS_CACHE``, default ``~/.cache/hvdps`` as for the bind shim), so a later set-up on the same machine (another
clone, CI) installs it in seconds, and a change of any of them builds again.
``patches/horovod-0.28.1-runner.patch`` changes only horovodrun's Python (a failed process's exit code
instead of a traceback under ``--gloo``; what Horovod was built with read from its compiled library instead
of by importing TensorFlow, BENCHMARKS.md section 20): it is applied to the installed package, so a change to it
installs the cached wheel again and patches it, without compiling. Standard library only: it runs
before the project is installed.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

HOROVOD = "0.28.1"
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
HERE = os.path.dirname(os.path.abspath(__file__))
PATCH = os.path.join(os.path.dirname(HERE), "patches", f"horovod-{HOROVOD}.patch")
RUNNER_PATCH = os.path.join(os.path.dirname(HERE), "patches", f"horovod-{HOROVOD}-runner.patch")
BUILT_WITH = ("TensorFlow", "MPI", "Gloo")       # what horovodrun --check-build must list as built in
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


def installed_key():
    """What the installed package depends on: the wheel's key and the runner patch applied on it."""
    return f"{cache_key()}-runner{_sha256(RUNNER_PATCH)[:12]}"


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
    """Horovod imports with its compiled ops and was installed from the wheel of this key, with this
    runner patch: the same TensorFlow, Python, MPI and patches (a changed patch means a new wheel or
    a new install, not a stale one)."""
    try:
        with open(_recorded()) as f:
            if f.read().strip() != installed_key():
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


def wheel_path():
    """The wheel of this key: from the cache, or compiled now (said on stderr: it takes minutes)."""
    folder = cache_dir()
    wheel = cached_wheel(folder)
    if wheel is None:
        print(f"== compiling horovod {HOROVOD} with {os.path.relpath(PATCH)} against this TensorFlow "
              f"(about 3 minutes on 2 cores; cached in {folder})", file=sys.stderr)
        return build(folder)
    print(f"== horovod {HOROVOD} from the cache: {wheel}", file=sys.stderr)
    return wheel


def install():
    """The wheel of this key installed in place of any other Horovod, and its key recorded; nothing
    when the installed one is current."""
    if installed_is_current():
        return 0
    wheel = wheel_path()
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run([*pip, "uninstall", "-y", "horovod"], capture_output=True)
    done = subprocess.run([*pip, "install", wheel], capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"pip install {wheel}: {(done.stderr or done.stdout).strip()[-2000:]}")
    patch_runner()
    with open(_recorded(), "w") as f:
        f.write(installed_key() + "\n")
    return 0


def patch_runner():
    """The runner patch applied to the installed package (its files sit under site-packages as
    they do under the sdist's root)."""
    out = subprocess.run([sys.executable, "-c", "import horovod, os; print(os.path.dirname(os.path.dirname("
                          "horovod.__file__)))"], capture_output=True, text=True)
    site = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    if not site:
        raise BuildError("the installed horovod does not import: " + out.stderr.strip()[-2000:])
    done = subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", site, "-i", RUNNER_PATCH],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"patch -d {site} -i {os.path.relpath(RUNNER_PATCH)}: {(done.stdout + done.stderr).strip()[-2000:]}")


def verify():
    """horovodrun --check-build lists TensorFlow, MPI and Gloo as built in (its output kept in the
    venv as check-build.txt), or one error line naming what is missing."""
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    with open(os.path.join(sys.prefix, "check-build.txt"), "w") as f:
        f.write(text)
    if out.returncode != 0:
        print(text)
        print("error: horovodrun --check-build failed")
        return 1
    missing = [want for want in BUILT_WITH if not re.search(rf"\[X\] {want}\b", text)]
    if missing:
        print(text)
        print(f"error: horovod was built without {', '.join(missing)} support (see above); "
              f"run 'make clean-venv setup'")
        return 1
    print(f"== horovod build verified: {', '.join(BUILT_WITH[:-1])} and {BUILT_WITH[-1]}")
    return 0


def main(argv):
    try:
        if argv == ["--install"]:
            return install()
        if argv == ["--verify"]:
            return verify()
        if argv == ["--key"]:
            print(cache_key())
            return 0
        if argv == ["--check"]:
            return 0 if installed_is_current() else 1
        if argv == ["--record"]:
            with open(_recorded(), "w") as f:
                f.write(installed_key() + "\n")
            return 0
        if argv:
            print("error: usage: python horovod_train/install.py [--install | --verify | --key | --check | --record]")
            return 2
        print(wheel_path())
        return 0
    except (BuildError, OSError) as exc:
        print(f"error: building horovod: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
