"""The TensorFlow stacks set-up installs, and which one fits this Python (standard library only).

    python hvdps/stack.py [auto|2.15|2.18]    # prints the pip requirements, or one error line and exit 1
    python hvdps/stack.py --built             # exit 0 if Horovod was compiled against the TensorFlow installed

``make setup`` runs this with the interpreter the venv is made from, before anything is installed,
so it imports nothing of the project. Horovod 0.28.1 (its last release) is compiled against the
TensorFlow installed first; it builds against 2.18 at the newest: from 2.19 on the wheels no longer
ship ``tensorflow/compiler/xla/client/xla_builder.h``, which its ``xla_mpi_ops.cc`` includes, and
hvdps does not patch Horovod. From 2.16 on ``tf.keras`` is Keras 3, which ``horovod.tensorflow.keras``
cannot drive: those stacks add ``tf-keras`` (Keras 2), selected by ``TF_USE_LEGACY_KERAS=1``, which
``common/__init__.py`` sets before anything imports TensorFlow.
"""
import sys

# name -> (pip requirements, the Pythons its wheels exist for, inclusive)
STACKS = {
    "2.15": (["tensorflow-cpu==2.15.1"], (3, 9), (3, 11)),
    "2.18": (["tensorflow-cpu==2.18.1", "tf-keras==2.18.0"], (3, 9), (3, 12)),
}
# auto: the stack the suite was run on for each Python (BENCHMARKS.md, "The TensorFlow stack")
DEFAULT = {(3, 9): "2.18", (3, 10): "2.18", (3, 11): "2.18", (3, 12): "2.18"}


def _name(v):
    return f"{v[0]}.{v[1]}"


def pick(choice, version):
    """The requirements for ``choice`` (a stack name or 'auto') on Python ``version``, or ValueError."""
    version = tuple(version[:2])
    if choice == "auto":
        if version not in DEFAULT:
            works = sorted(DEFAULT)
            raise ValueError(
                f"Python {_name(version)} has no TensorFlow that Horovod 0.28.1 builds against (it builds up to "
                f"TensorFlow 2.18, whose wheels cover Python {_name(works[0])}-{_name(works[-1])}): install "
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


def horovod_built_against_installed_tf():
    """Horovod imports and its metadata.json names the TensorFlow installed now (else: rebuild it)."""
    import json
    import os
    import horovod
    import tensorflow as tf
    meta = json.load(open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")))
    if meta.get("tensorflow") != tf.__version__:
        return False
    import horovod.tensorflow  # noqa: F401  (loads the compiled ops)
    return True


def main(argv):
    if argv == ["--built"]:
        try:
            return 0 if horovod_built_against_installed_tf() else 1
        except Exception:
            return 1
    try:
        print(" ".join(pick(argv[0] if argv else "auto", sys.version_info)))
    except ValueError as exc:
        print(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
