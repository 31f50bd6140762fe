"""Numbers as hvdps reads them, from a flag, the environment, a file or a name: ASCII digits only.

Python's ``int()``, ``float()`` and ``str.isdigit()`` take any Unicode digit: ``"²".isdigit()`` is True
and ``int("²")`` raises, while ``int("٣")`` is 3 and ``int("1_000")`` is 1000. A count, an index, a
port, a pid or a rate is written in ASCII by every launcher, scheduler, kernel file and Kubernetes
variable hvdps reads, so anything else is refused where it enters: by these readers, each caller
naming where the text came from in its one line.
"""
import re

_WHOLE = re.compile(r"[0-9]+")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


def whole(text):
    """``text`` as an int when it is ASCII digits and nothing else (no sign, space or underscore), else
    None: what a rank, an index, a count or a pid read from outside is taken as."""
    return int(text) if isinstance(text, str) and _WHOLE.fullmatch(text) else None


def integer(text):
    """An optionally signed ASCII integer, else ValueError (an argparse ``type``: its flag's one line)."""
    if not isinstance(text, str) or not _INTEGER.fullmatch(text.strip()):
        raise ValueError(f"not an integer: {text!r}")
    return int(text)


def real(text):
    """A decimal number in ASCII (``0.5``, ``1e-3``, ``inf``, ``nan``: the flag's rule refuses the last two),
    else ValueError."""
    if not isinstance(text, str) or not _REAL.fullmatch(text.strip()):
        raise ValueError(f"not a number: {text!r}")
    return float(text)
