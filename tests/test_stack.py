"""Set-up's choice of TensorFlow stack (hvdps/install/stack.py) and its one line on a Python it cannot serve."""
import glob
import re
import os
import subprocess
import sys

import pytest

from hvdps.install.stack import STACKS, pick
from tests.conftest import REPO, run

NEWEST = ["tensorflow==2.21.0", "tf-keras==2.21.0", "numpy>=2,<3", "ml_dtypes<0.7"]
NEW = ["tensorflow==2.18.1", "tf-keras==2.18.0", "numpy<2"]
OLD = ["tensorflow==2.15.1", "numpy<2"]


@pytest.mark.parametrize("choice, version, pins", [
    ("auto", (3, 9), NEW), ("auto", (3, 10), NEWEST), ("auto", (3, 11), NEWEST), ("auto", (3, 12), NEWEST),
    ("auto", (3, 13), NEWEST), ("2.21", (3, 11), NEWEST), ("2.18", (3, 11), NEW), ("2.18", (3, 12), NEW),
    ("2.15", (3, 9), OLD), ("2.15", (3, 11), OLD),
])
def test_stack_for_python(choice, version, pins):
    assert pick(choice, version) == pins


@pytest.mark.parametrize("choice, version, message", [
    ("auto", (3, 14), "Python 3.14 has no TensorFlow stack here"),
    ("auto", (3, 8), "Python 3.8 has no TensorFlow stack here"),
    ("2.15", (3, 12), "TF=2.15: tensorflow==2.15.1 has wheels for Python 3.9-3.11, not 3.12"),
    ("2.18", (3, 13), "TF=2.18: tensorflow==2.18.1 has wheels for Python 3.9-3.12, not 3.13"),
    ("2.21", (3, 9), "TF=2.21: tensorflow==2.21.0 has wheels for Python 3.10-3.13, not 3.9"),
    ("2.20", (3, 11), "TF=2.20: expected auto or one of 2.15, 2.18, 2.21"),
])
def test_stack_refused(choice, version, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        pick(choice, version)


def test_every_stack_names_tensorflow_first():
    """make setup installs the pins before Horovod is compiled against the first of them; never
    tensorflow-cpu, whose files tf-keras's own dependency (tensorflow) would overwrite."""
    for pins, low, high in STACKS.values():
        assert pins[0].startswith("tensorflow==") and low <= high
        assert not any(p.startswith("tensorflow-cpu") for p in pins)


def test_the_environment_holds_its_stacks_pins():
    """Set-up installs the stack's pins, then hvdps and the test tools: nothing installed after them
    may move one (ml_dtypes 0.7 would add 0.8 s of CPU to every process's start: BENCHMARKS.md,
    section 22)."""
    from importlib.metadata import version
    from packaging.requirements import Requirement
    tf = version("tensorflow")
    (pins,) = [pins for pins, _, _ in STACKS.values() if pins[0] == f"tensorflow=={tf}"]
    for pin in pins:
        req = Requirement(pin)
        assert req.specifier.contains(version(req.name), prereleases=True), (pin, version(req.name))


def _make_setup(tmp_path, python, tf="auto"):
    return subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}", f"TF={tf}",
                           f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.process
@pytest.mark.parametrize("python, tf, message", [
    ("/nonexistent/python3", "auto", "is not a Python 3 interpreter: run make PYTHON=python3.12"),
    (sys.executable, "2.20", "TF=2.20: expected auto or one of 2.15, 2.18, 2.21"),
])
def test_make_setup_refuses_in_one_line(tmp_path, python, tf, message):
    r = _make_setup(tmp_path, python, tf)
    lines = [l for l in r.stdout.splitlines() + r.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", l)]
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r
    assert not (tmp_path / "venv").exists()


@pytest.mark.process
def test_make_setup_on_a_python_without_tensorflow_says_what_to_install(tmp_path):
    """A Python no stack has wheels for: 3.8 (pyenv's, or a venv made with uv or Debian's)."""
    older = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3")) +
                   glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[4-9]*/bin/python3")) +
                   glob.glob("/usr/bin/python3.8") + glob.glob("/usr/bin/python3.1[4-9]"))
    if not older:
        pytest.skip("no Python 3.8 or 3.14+ on this machine")
    r = _make_setup(tmp_path, older[0])
    lines = [l for l in r.stdout.splitlines() + r.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", l)]
    assert r.returncode != 0 and len(lines) == 1, r
    assert re.match(r"error: Python 3\.(8|1[4-9]) has no TensorFlow stack", lines[0]) and "make PYTHON=python3.12" in lines[0], lines
    assert not (tmp_path / "venv").exists()


def test_horovod_wheel_cache_key_names_what_it_was_compiled_against(monkeypatch, tmp_path):
    """A change of TensorFlow, Python, MPI or the patch is another folder: a stale wheel is never reused."""
    from horovod_train import install as hb
    monkeypatch.setattr(hb, "tensorflow_version", lambda: "2.21.0")
    monkeypatch.setattr(hb, "mpi_version", lambda: "4.1.4")
    monkeypatch.setenv("HVDPS_CACHE", str(tmp_path))
    key = hb.cache_key()
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    assert key.startswith(f"horovod-0.28.1-tf2.21.0-{py}-ompi4.1.4-patch") and len(key.rsplit("patch", 1)[1]) == 12
    assert hb.cache_dir() == os.path.join(str(tmp_path), "horovod-wheels", key)
    monkeypatch.setattr(hb, "tensorflow_version", lambda: "2.18.1")
    assert hb.cache_key() != key


def test_horovod_wheel_from_the_cache_is_not_built_again(monkeypatch, tmp_path, capsys):
    from horovod_train import install as hb
    monkeypatch.setattr(hb, "tensorflow_version", lambda: "2.21.0")
    monkeypatch.setattr(hb, "mpi_version", lambda: "4.1.4")
    monkeypatch.setenv("HVDPS_CACHE", str(tmp_path))
    monkeypatch.setattr(hb, "build", lambda folder: pytest.fail("built although cached"))
    os.makedirs(hb.cache_dir())
    wheel = os.path.join(hb.cache_dir(), "horovod-0.28.1-cp311-cp311-linux_x86_64.whl")
    open(wheel, "w").close()
    assert hb.main([]) == 0 and capsys.readouterr().out.strip() == wheel


def test_horovod_patch_hunks_name_their_tensorflow_change():
    """Every hunk of the patch adds a line that says which TensorFlow change it answers."""
    from horovod_train.install import PATCH
    text = open(PATCH).read()
    hunks = text.split("\n@@ ")[1:]
    assert len(hunks) >= 6
    for hunk in hunks:
        added = [l for l in hunk.splitlines() if l.startswith("+") and not l.startswith("+++")]
        assert any("hvdps patch" in l and "TF" in l for l in added), hunk


def test_horovod_runner_patch_is_applied_to_the_install_not_the_wheel(monkeypatch, tmp_path):
    """horovodrun's Python changes without a compile: the wheel's key leaves the runner patch out,
    the installed key holds both, and every hunk of the runner patch says why it is there."""
    from horovod_train import install as hb
    monkeypatch.setattr(hb, "tensorflow_version", lambda: "2.21.0")
    monkeypatch.setattr(hb, "mpi_version", lambda: "4.1.4")
    wheel_key, installed = hb.cache_key(), hb.installed_key()
    assert installed.startswith(wheel_key + "-runner") and len(installed.rsplit("runner", 1)[1]) == 12
    changed = tmp_path / "runner.patch"
    changed.write_text(open(hb.RUNNER_PATCH).read() + "\n")
    monkeypatch.setattr(hb, "RUNNER_PATCH", str(changed))
    assert hb.cache_key() == wheel_key and hb.installed_key() != installed
    text = open(hb.RUNNER_PATCH).read()
    assert {l.split()[1] for l in text.splitlines() if l.startswith("+++ ")} == {
        "b/horovod/runner/gloo_run.py", "b/horovod/runner/launch.py", "b/horovod/common/util.py"}
    for hunk in text.split("\n@@ ")[1:]:
        added = [l for l in hunk.splitlines() if l.startswith("+") and not l.startswith("+++")]
        assert any("JobFailedError" in l or "_built_flags" in l for l in added), hunk
    assert text.count("hvdps patch") == 3


FLAGS = ("mpi_built", "gloo_built", "nccl_built", "ddl_built", "ccl_built")
READ_LIGHT = f"""
import sys
from horovod.common.util import _built_flags
ext = _built_flags("tensorflow")
print([bool(getattr(ext, f)()) for f in {FLAGS}], "tensorflow" in sys.modules)
"""
READ_BY_IMPORT = f"""
import horovod.tensorflow as ext
print([bool(getattr(ext, f)()) for f in {FLAGS}])
"""


@pytest.mark.process
def test_horovodrun_reads_what_horovod_was_built_with_without_importing_tensorflow():
    """The runner patch's _built_flags: horovodrun's controller check (MPI or Gloo, every launch) reads
    the flags from Horovod's compiled TensorFlow library with TensorFlow's libraries loaded, not
    TensorFlow's Python package (each in a process of its own: the two do not mix), and reads what
    importing horovod.tensorflow reads."""
    light, by_import = (run([sys.executable, "-c", code], timeout=120) for code in (READ_LIGHT, READ_BY_IMPORT))
    assert light.returncode == by_import.returncode == 0, (light.stderr[-2000:], by_import.stderr[-2000:])
    *flags, imported = light.stdout.split("\n")[-2].rsplit(" ", 1)
    assert imported == "False", light.stdout                       # TensorFlow's Python package was not loaded
    assert " ".join(flags) == by_import.stdout.split("\n")[-2], (light.stdout, by_import.stdout)
    assert " ".join(flags).startswith("[True, True, "), flags        # MPI and Gloo: set-up's BUILT_WITH


def test_horovod_build_refuses_unknown_flags(capsys):
    from horovod_train.install import main
    assert main(["--bogus"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("error: usage:")
