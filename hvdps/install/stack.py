"""The TensorFlow stacks set-up installs, and which one fits this Python (standard library only).

    python hvdps/install/stack.py [auto|2.21|2.18|2.15]   # prints the pip requirements, or one error line and exit 1

``make setup`` runs this with the interpreter the venv is made from, before anything is installed,
so it imports nothing of the project. Horovod 0.28.1 (its last release) is then compiled against
the TensorFlow installed, with hvdps's patch (patches/horovod-0.28.1.patch, horovod_train/install.py),
which carries it to TensorFlow 2.19-2.21 and to Keras 3 variables in DistributedGradientTape.
From 2.16 on ``tf.keras`` is Keras 3; those stacks add ``tf-keras`` (Keras 2), which the trainers'
built-in models and ``horovod.tensorflow.keras`` drive, selected by ``TF_USE_LEGACY_KERAS=1``
(``common/__init__.py``); a plug-in written with ``import keras`` trains as Keras 3 (docs/plugins.md).
Every stack installs ``tensorflow``, not ``tensorflow-cpu``: ``tf-keras`` depends on the former, and
the two in one environment overwrite each other's files. The full wheel runs on the CPU as well.
"""
import sys

# name -> (pip requirements, the Pythons its wheels exist for, inclusive). ml_dtypes, which TensorFlow
# imports first thing in every process, is held below 0.7: its 0.7.0 takes 0.7-0.9 s of CPU to import
# against 0.01 s for 0.6.0, paid by every rank and task (a short trainer's CPU: 0.81x with 0.6.0,
# BENCHMARKS.md, section 22). 2.21 accepts 0.5.1 to 1.0; the other stacks take what their TensorFlow pins.
STACKS = {
    "2.15": (["tensorflow==2.15.1", "numpy<2"], (3, 9), (3, 11)),
    "2.18": (["tensorflow==2.18.1", "tf-keras==2.18.0", "numpy<2"], (3, 9), (3, 12)),
    "2.21": (["tensorflow==2.21.0", "tf-keras==2.21.0", "numpy>=2,<3", "ml_dtypes<0.7"], (3, 10), (3, 13)),
}
# auto: the newest stack with wheels for the Python (BENCHMARKS.md, "The TensorFlow stack")
DEFAULT = {(3, 9): "2.18", (3, 10): "2.21", (3, 11): "2.21", (3, 12): "2.21", (3, 13): "2.21"}


def _name(v):
    return f"{v[0]}.{v[1]}"


def pick(choice, version):
    """The requirements for ``choice`` (a stack name or 'auto') on Python ``version``, or ValueError."""
    version = tuple(version[:2])
    if choice == "auto":
        if version not in DEFAULT:
            works = sorted(DEFAULT)
            raise ValueError(
                f"Python {_name(version)} has no TensorFlow stack here (TensorFlow 2.21's wheels cover "
                f"Python {_name((3, 10))}-{_name(works[-1])}, 2.18's {_name(works[0])}-3.12): install "
                f"python3.12 or python3.11 (Debian 12: apt-get install python3.11-venv; elsewhere: uv python "
                f"install 3.12 or pyenv) and run make PYTHON=python3.12")
        choice = DEFAULT[version]
    if choice not in STACKS:
        raise ValueError(f"TF={choice}: expected auto or one of {', '.join(STACKS)}")
    pins, low, high = STACKS[choice]
    if not low <= version <= high:
        raise ValueError(f"TF={choice}: {pins[0]} has wheels for Python {_name(low)}-{_name(high)}, not "
                         f"{_name(version)}: pick another TF= or run make PYTHON=python{_name(high)}")
    return pins


def main(argv):
    try:
        print(" ".join(pick(argv[0] if argv else "auto", sys.version_info)))
    except ValueError as exc:
        print(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
