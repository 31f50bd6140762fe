"""Set-up's choice of TensorFlow stack (hvdps/stack.py) and its one line on a Python it cannot serve."""
import glob
import re
import os
import subprocess
import sys

import pytest

from hvdps.stack import STACKS, pick
from tests.conftest import REPO

NEW = ["tensorflow-cpu==2.18.1", "tf-keras==2.18.0"]
OLD = ["tensorflow-cpu==2.15.1"]


@pytest.mark.parametrize("choice, version, pins", [
    ("auto", (3, 9), NEW), ("auto", (3, 11), NEW), ("auto", (3, 12), NEW),
    ("2.15", (3, 9), OLD), ("2.15", (3, 11), OLD), ("2.18", (3, 12), NEW),
])
def test_stack_for_python(choice, version, pins):
    assert pick(choice, version) == pins


@pytest.mark.parametrize("choice, version, message", [
    ("auto", (3, 13), "Python 3.13 has no TensorFlow that Horovod 0.28.1 builds against"),
    ("auto", (3, 8), "Python 3.8 has no TensorFlow"),
    ("2.15", (3, 12), "TF=2.15: tensorflow-cpu==2.15.1 has wheels for Python 3.9-3.11, not 3.12"),
    ("2.21", (3, 11), "TF=2.21: expected auto or one of 2.15, 2.18"),
])
def test_stack_refused(choice, version, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        pick(choice, version)


def test_every_stack_names_tensorflow_first():
    """make setup installs the pins before Horovod is compiled against the first of them."""
    for pins, low, high in STACKS.values():
        assert pins[0].startswith("tensorflow-cpu==") and low <= high


def _make_setup(tmp_path, python, tf="auto"):
    return subprocess.run(["make", "--no-print-directory", "setup", f"PYTHON={python}", f"TF={tf}",
                           f"VENV={tmp_path / 'venv'}"], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.process
@pytest.mark.parametrize("python, tf, message", [
    ("/nonexistent/python3", "auto", "is not a Python 3 interpreter: run make PYTHON=python3.12"),
    (sys.executable, "2.21", "TF=2.21: expected auto or one of 2.15, 2.18"),
])
def test_make_setup_refuses_in_one_line(tmp_path, python, tf, message):
    r = _make_setup(tmp_path, python, tf)
    lines = [l for l in r.stdout.splitlines() + r.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", l)]
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r
    assert not (tmp_path / "venv").exists()


@pytest.mark.process
def test_make_setup_on_a_python_without_tensorflow_says_what_to_install(tmp_path):
    newer = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[3-9]*/bin/python3")) +
                   glob.glob("/usr/bin/python3.1[3-9]"))
    if not newer:
        pytest.skip("no Python 3.13 or newer on this machine")
    r = _make_setup(tmp_path, newer[0])
    lines = [l for l in r.stdout.splitlines() + r.stderr.splitlines() if not re.match(r"make(\[\d+\])?: ", l)]
    assert r.returncode != 0 and len(lines) == 1, r
    assert lines[0].startswith("error: Python 3.1") and "make PYTHON=python3.12" in lines[0], lines
    assert not (tmp_path / "venv").exists()
