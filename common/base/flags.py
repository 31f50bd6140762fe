"""The one flag parser every entry point uses, and the rule every flag value meets.

Generic argparse machinery (no knowledge of any flag's meaning): one ``error:`` line and exit 2
for any bad value, full flag names only, underscores as the one spelling with the hyphenated form
accepted, and ranges declared beside the flag (``Parser.bound``).
"""
import argparse
import ipaddress
import math
import re
import shlex
import sys

from common.base.errors import UsageError
from common.base.numbers import integer, real, whole


def check_finite(name, value):
    """NaN and inf pass every ``<`` / ``>`` check, so they are refused by name first."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"--{name} must be a finite number, got {value}")


def shape(text):
    try:
        shape = tuple(integer(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected H,W,C such as 28,28,1, got '{text}'")
    return shape


def command_line(text):
    """A command line as a shell would split it (``--rsh 'ssh -p 2222'``): refused here when it
    cannot be split (an unterminated quote) or is empty, not later as a shlex traceback."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"cannot split '{text}' as a command line ({exc})")
    if not words:
        raise argparse.ArgumentTypeError("empty: expected a command such as 'ssh -p 2222'")
    return text


def interface_or_cidr(text):
    """A network interface name (``eth0``, at most 15 characters as Linux allows) or an IPv4/IPv6
    network in CIDR notation (``10.0.0.0/24``), as Open MPI's ``*_if_include`` takes."""
    if "/" in text or re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]+:[0-9a-fA-F:]*", text):
        try:
            return str(ipaddress.ip_network(text, strict=False))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"'{text}' is not a network in CIDR notation ({exc})")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", text):
        raise argparse.ArgumentTypeError(f"'{text}' is neither an interface name (up to 15 letters, digits, "
                                         f"'_.:-') nor a CIDR network such as 10.0.0.0/24")
    return text


def size(text):
    """H,W: an image's height and width, each from 1 to 65536."""
    parts = text.split(",")
    sizes = [whole(p.strip()) for p in parts]
    if len(parts) != 2 or not all(n is not None and 0 < n <= 1 << 16 for n in sizes):
        raise argparse.ArgumentTypeError(f"expected H,W (two sizes from 1 to 65536), got '{text}'")
    return tuple(sizes)


def megabytes(text):
    """A comma-separated list of sizes in MiB (``1,10,100``), each > 0 and at most 1 TiB -> bytes."""
    try:
        sizes = [real(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes in MiB such as 1,10,100, got '{text}'")
    if not all(math.isfinite(x) and 0 < x <= 2 ** 20 for x in sizes):
        raise argparse.ArgumentTypeError(f"each size must be in (0, 1048576] MiB, got '{text}'")
    return [(f"{x:g}MB", int(x * 2 ** 20)) for x in sizes]


def counts(text):
    """``1,2,4`` -> (1, 2, 4): positive counts, sorted and without repeats, each at most 1 << 20
    (a comparison's sizes: its workers, a method's tasks of one role)."""
    try:
        found = sorted({integer(x) for x in str(text).split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got '{text}'")
    if not found or found[0] < 1 or found[-1] > 1 << 20:
        raise argparse.ArgumentTypeError(f"expected counts from 1 to {1 << 20} like 1,2,4, got '{text}'")
    return tuple(found)


def usage_type(parse):
    """An argparse ``type`` of a parser that raises UsageError (one shared with a file's reader), so its
    message comes back as the flag's own ``error: argument --flag: ...`` line."""
    def typed(text):
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc))
    typed.__name__ = getattr(parse, "__name__", "value")
    return typed


def boolean(text):
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got '{text}'")


# What no flag of any entry point may be: numbers past these are typos or overflow, not settings
# (2**48 steps, bytes or seconds; a float above 1e15 is past every rate, size or time hvdps takes).
FLAG_INT_MAX = 2 ** 48
MAX_TIMEOUT_S = 7 * 24 * 3600      # a week: what any --*_timeout takes (TensorFlow: int64 milliseconds)
MIN_TIMEOUT_S = 1.0                # a bound on a step or a start-up: below it, the bound is the scheduler's
FLAG_FLOAT_MAX = 1e15


def check_flag_value(flag, value, low=0, high=None, positive=False):
    """The rule every parsed flag value meets, whatever the entry point: no empty or blank string
    (an empty --train_dir would mean "here", an empty --hosts "locally"), no NaN or infinity (they
    pass every < and > check), no number below ``low`` (0 unless the flag says) or past the
    bounds above. Per-flag meaning (a port's range, a known model name) is checked after this."""
    if isinstance(value, (list, tuple)):
        for v in value:
            check_flag_value(flag, v, low)
        return
    if isinstance(value, str):
        if not value.strip():
            raise UsageError(f"{flag} must not be empty")
        if "\0" in value:
            raise UsageError(f"{flag} must not contain a NUL byte")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{flag} must be a finite number, got {value}")
    if high is not None and not ((low < value if positive else low <= value) and value <= high):
        raise UsageError(f"{flag} must be in {'(' if positive else '['}{_n(low)}, {_n(high)}], got {value!r}")
    if positive and value <= 0:
        raise UsageError(f"{flag} must be positive, got {value!r}")
    if value < low:
        raise UsageError(f"{flag} must be >= {_n(low)}, got {value!r}")
    limit = FLAG_INT_MAX if isinstance(value, int) else FLAG_FLOAT_MAX
    if value > limit:
        raise UsageError(f"{flag} must be at most {_n(limit)}, got {value!r}")


def _n(x):
    """A bound as a user writes it: 604800, 4294967295, 1e-06, 0.5."""
    return str(x) if isinstance(x, int) else f"{x:g}"


class Parser(argparse.ArgumentParser):
    """argparse that fails with one ``error:`` line and exit 2 (no usage dump), takes flags only by
    their full names (``--model`` must not silently mean ``--model_name``), and holds every value
    to ``check_flag_value``: one validation for every entry point. A flag with a range of its own
    (below 0, or narrower) declares it with ``bound(dest, low, high)``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._bounds = {}
        # type=int and type=float read ASCII numbers only (common/base/numbers.py): argparse looks a
        # flag's type up here, in a registry its argument groups share, and names it in its line
        self.register("type", int, integer)
        self.register("type", float, real)

    def bound(self, dest, low=0, high=None, positive=False):
        self._bounds[dest] = (low, high, positive)

    def spelled(self, args):
        """``args`` with every hyphenated flag of this parser in its one spelling, underscores
        (``--dry-run`` is ``--dry_run``, ``--batch-size`` is ``--batch_size``): the trainers' names, as
        TensorFlow's own examples write them, with the other form kept working. Nothing after a
        bare ``--`` (another program's flags) is touched."""
        out = []
        for i, arg in enumerate(args):
            if arg == "--":
                return out + args[i:]
            if arg.startswith("--") and "-" in arg[2:].split("=", 1)[0]:
                name, eq, value = arg.partition("=")
                spelled = "--" + name[2:].replace("-", "_")
                if name not in self._option_string_actions and spelled in self._option_string_actions:
                    arg = spelled + eq + value
            out.append(arg)
        return out

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(self.spelled(sys.argv[1:] if args is None else list(args)), namespace)
        for action in self._actions:
            if not action.option_strings or action.dest in ("help", argparse.SUPPRESS):
                continue
            value = getattr(ns, action.dest, None)
            if value is not None and value is not action.default:
                check_flag_value(action.option_strings[0], value, *self._bounds.get(action.dest, (0, None, False)))
        return ns, rest

    def error(self, message):
        raise UsageError(message)
