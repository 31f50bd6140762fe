"""One way to fail: a single ``error: ...`` line and a meaningful exit code.

Users launch these scripts under horovodrun/mpirun/Kubernetes, where a Python
traceback from every rank buries the real cause. Everything a user can get wrong
raises :class:`UsageError`; :func:`cli` turns it into one line and exit 2.
"""
import atexit
import faulthandler
import functools
import gc
import os
import re
import sys
import time

EXIT_USAGE = 2
EXIT_FAILURE = 1


def one_line(text):
    """``text`` with every character that is not printable (a newline, a tab, an escape) written as
    its escape: a value read from a file or a flag and quoted in a message cannot break its one line."""
    text = str(text)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class _OneLineError(Exception):
    """An error whose message is one line whatever the values it quotes: ``error: ...`` is the line a
    user (and every launcher's log) reads, so a quoted value holding a newline must not split it."""

    def __init__(self, message="", *rest):
        super().__init__(one_line(message), *rest)


class UsageError(_OneLineError):
    """Bad flags, config, paths or input files: the user can fix it."""


class RunError(_OneLineError):
    """The run itself failed (lost peer, timeout): not a usage problem."""


class InputError(RunError):
    """The data failed while a run read it (a damaged record, a label past the classes): printed by
    whichever worker read it, chief or not, since only that worker knows the file and record."""


def shown(text):
    """Text read from a user's file (a key, a feature's name) as an error line shows it: as written
    when printable, quoted when not, so that a name holding a newline cannot break the one line."""
    text = str(text)
    return text if text.isprintable() and text.strip() == text and text else repr(text)


def describe(exc):
    """One readable line for an exception, TensorFlow's included.

    TF messages carry a function-node prefix, a temporary file name and an op
    tag around the cause: '{{function_node ...}} /x/tmp123; No space left on
    device [Op:SaveV2]' -> 'No space left on device'.
    """
    text = getattr(exc, "message", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    failed = re.search(r"assertion failed: \[(.+?)\]\s*$", text, re.M)
    if failed:                         # tf.debugging.Assert's message: what the graph said, wherever it ran
        return failed.group(1).replace("\\'", "'").replace('\\"', '"')     # as TensorFlow printed it, unescaped
    lines = text.strip().splitlines()
    text = lines[0]
    if text.startswith("Graph execution error"):    # TF's graph-mode wrapper: the cause is a later line
        causes = [line.strip() for line in lines[1:] if "; " in line and not line.strip().startswith(("File ", "[["))]
        # else (TensorFlow 2.21: "Detected at node ...", indented frames, "Node: '...'", then the cause
        # on a line of its own, then "[[{{node ...}}]]") the first unindented line that is none of those
        plain = [line.strip() for line in lines[1:] if line.strip() and not line[:1].isspace()
                 and not line.startswith(("Detected at node", "Node: ", "File ", "[[", "Original stack trace",
                                          "<stack traces unavailable>"))]   # a remote task's, in TF 2.21
        text = causes[-1] if causes else plain[0] if plain else text
    if re.search(r"\d+ root error\(s\) found", text):   # TF's aggregate: the first cause, "(0) KIND: ..."
        first = next((m for m in (re.match(r"\s*\(0\)\s*(.+)", line) for line in lines[1:]) if m), None)
        text = first.group(1) if first else text
    text = re.sub(r"^\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\](\s*name:\s*\S*)?$", "", text)
    return text.rsplit("; ", 1)[-1].strip() or type(exc).__name__


def say_first(exc, force=False):
    """Print a usage or run error's one line now, before a teardown that follows it (a PS chief
    releasing its tasks), so that a crash in the teardown cannot lose the line; ``cli`` then does not
    print it again. Other exceptions are left to ``cli``. ``force``: also on a rank whose errors are
    silenced (the one rank that names a lost peer: allreduce/roster.py)."""
    quiet = os.environ.get("HVDPS_QUIET_ERRORS") == "1" and not isinstance(exc, InputError) and not force
    if isinstance(exc, (UsageError, RunError)) and not quiet and not getattr(exc, "said", False):
        print(f"error: {exc}", file=sys.stderr, flush=True)
        exc.said = True


def fail(message, code=EXIT_USAGE, quiet=False, hard_exit=False, said=False):
    if said:
        pass                           # say_first printed the line already
    elif not quiet:
        print(f"error: {message}", file=sys.stderr, flush=True)
    else:
        # A silenced rank gives rank 0 a moment to print the one error line:
        # launchers kill the whole job as soon as the first rank exits.
        time.sleep(3)
    if hard_exit:   # skip interpreter teardown: TF gRPC servers cannot be stopped
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


def whole_lines():
    """One write per line on stdout and stderr.

    horovodrun sets PYTHONUNBUFFERED, so ``print(a, b)`` reaches the pipe as three writes, and
    Open MPI's ``--tag-output`` (which horovodrun uses) tags every chunk it reads: a line comes
    out as ``[1,0]<stdout>:step 10[1,0]<stdout>:``. Line buffering without write-through
    hands the launcher each line whole."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError, OSError):
            pass        # replaced or closed streams (pytest's capture) keep their own buffering


def quick_exit_teardown():
    """At interpreter exit, after every atexit handler registered later (Horovod's shutdown, which runs
    first), move every object the cyclic collector tracks to its permanent generation.

    Python's finalization collects cycles over every object still alive, and a process that imported
    TensorFlow holds millions: about 1 s of CPU per process on this machine kind, after the run has
    written everything. Frozen objects are still freed by reference count as the modules are cleared,
    files and sockets included; only the search for cycles among them is skipped, as the operating
    system reclaims the memory anyway. Registered once per process as the entry point starts, before
    the trainers import TensorFlow or Horovod, so it runs after their handlers (atexit runs the last
    registered first); wherever it runs among them it only skips that search."""
    if not getattr(quick_exit_teardown, "registered", False):
        atexit.register(gc.freeze)
        quick_exit_teardown.registered = True


def cli(fn=None, *, hard_exit=False):
    """Decorate a ``main()`` so user errors end as one line, not a traceback.

    ``HVDPS_QUIET_ERRORS`` lets a backend silence non-chief ranks so that a
    4-rank job prints the error once, while still exiting non-zero everywhere.
    """
    if fn is None:
        return functools.partial(cli, hard_exit=hard_exit)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        quiet = lambda: os.environ.get("HVDPS_QUIET_ERRORS") == "1"   # read late: main() may set it
        # Results, checkpoints and events (TensorFlow's included) come out 0644 / 0755 at most,
        # or stricter if the umask says so: never group- or world-writable on a shared file system.
        os.umask(os.umask(0) | 0o022)
        whole_lines()
        quick_exit_teardown()
        # A crash in native code (TensorFlow's, MPI's) leaves the Python stack of every thread on
        # stderr, in the run's log, instead of only the launcher's "killed by SIGSEGV"
        try:
            faulthandler.enable()
        except (ValueError, OSError, AttributeError):
            pass                       # a replaced stderr (pytest's capture) has no file descriptor
        said = lambda exc: getattr(exc, "said", False)     # say_first printed it already
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            fail(str(exc), EXIT_USAGE, quiet(), hard_exit, said(exc))
        except InputError as exc:
            fail(str(exc), EXIT_FAILURE, False, hard_exit, said(exc))
        except RunError as exc:
            fail(str(exc), EXIT_FAILURE, quiet(), hard_exit, said(exc))
        except KeyboardInterrupt:
            fail("interrupted", 130, quiet(), hard_exit)
    return wrapper
