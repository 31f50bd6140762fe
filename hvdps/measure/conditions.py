"""The conditions of an unhealthy run, as typed records parsed once from their flags: a slow worker
(``--straggler R:F``), a stalled one (``--stall R:EVERY:FOR``) and a slow link of hvdps emulate's
cluster (``--slow_link hN=RATE``), each with its run-folder suffix and its words; and which host of
the cluster a slow link names. What is done to a run is hvdps/measure/unhealthy.py's."""
import math
import re
from dataclasses import dataclass

from common.base.errors import UsageError
from common.base.numbers import integer, real
from hvdps.measure.cluster import parse_rate

MAX_FACTOR = 1000.0
MAX_MS = 3_600_000


class OnWorker:
    """A condition of worker ``rank``: only the runs that have that worker run with it."""

    def applies_to(self, workers):
        return self.rank < workers


@dataclass(frozen=True)
class Straggler(OnWorker):
    """Worker ``rank`` at 1/``factor`` of the CPU the others get (1: healthy)."""
    rank: int
    factor: float

    @property
    def label(self):
        return f"slow{self.rank}x{self.factor:g}"

    def describe(self):
        return f"worker {self.rank} at 1/{self.factor:g} CPU"


@dataclass(frozen=True)
class Stall(OnWorker):
    """Worker ``rank`` stopped for ``for_ms`` every ``every_ms``."""
    rank: int
    every_ms: float
    for_ms: float

    @property
    def label(self):
        return f"stall{self.rank}-{self.every_ms:g}-{self.for_ms:g}"

    def describe(self):
        return f"worker {self.rank} stopped {self.for_ms:g} ms every {self.every_ms:g} ms"


@dataclass(frozen=True)
class SlowLink:
    """Host ``port``'s (h1, h2, ...) link at ``rate`` (tc's syntax) in both directions."""
    port: str
    rate: str

    rank = None                     # a host's, not a worker's: every run has it

    @property
    def label(self):
        return f"link-{self.port}-{self.rate}"

    @property
    def rate_bps(self):
        return parse_rate(self.rate)

    def describe(self):
        return f"{self.port}'s link at {self.rate_bps / 1e6:g} Mbit/s"

    def applies_to(self, workers):
        return True


def _number(text, flag, what, lo, hi, whole=False):
    try:
        value = integer(text) if whole else real(text)
    except ValueError:
        raise UsageError(f"{flag}: {what} must be a{' whole' if whole else ''} number, got {text!r}")
    if not math.isfinite(value) or not lo <= value <= hi:
        raise UsageError(f"{flag}: {what} must be in [{lo:g}, {hi:g}], got {text!r}")
    return value


def parse_stragglers(text):
    """``R:F[,R:F...]`` -> [Straggler], in order, without repeats; F >= 1 (1 is a healthy run)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        rank, sep, factor = part.partition(":")
        if not sep or not rank.strip() or not factor.strip():
            raise UsageError(f"--straggler expects RANK:FACTOR like 1:4 (worker 1 at a quarter of the CPU), got {part!r}")
        s = Straggler(_number(rank.strip(), "--straggler", "the rank", 0, 1 << 20, whole=True),
                      _number(factor.strip(), "--straggler", "the slowdown factor", 1, MAX_FACTOR))
        if s not in out:
            out.append(s)
    return out


def parse_stall(text):
    """``R:EVERY:FOR`` (milliseconds) -> Stall; 0 < FOR < EVERY."""
    parts = [p.strip() for p in str(text).split(":")]
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"--stall expects RANK:EVERY_MS:FOR_MS like 1:2000:500, got {text!r}")
    rank = _number(parts[0], "--stall", "the rank", 0, 1 << 20, whole=True)
    every = _number(parts[1], "--stall", "EVERY_MS", 1, MAX_MS)
    stop = _number(parts[2], "--stall", "FOR_MS", 1, MAX_MS)
    if stop >= every:
        raise UsageError(f"--stall: FOR_MS ({stop:g}) must be shorter than EVERY_MS ({every:g})")
    return Stall(rank, every, stop)


def parse_slow_links(text):
    """``hN=RATE[,hN=RATE...]`` -> [SlowLink], in order, without repeats: each a run of every shape
    with host N's link at RATE (one slow link at a time; several rates draw a curve)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        host, sep, rate = part.partition("=")
        m = re.fullmatch(r"h([1-9][0-9]{0,2})", host.strip())
        if not sep or not m or not rate.strip():
            raise UsageError(f"--slow_link expects hN=RATE like h3=10mbit (host 3's link at 10 Mbit/s), got {part!r}")
        parse_rate(rate.strip(), "--slow_link")
        link = SlowLink(f"h{int(m.group(1))}", rate.strip().lower())
        if link not in out:
            out.append(link)
    return out


def conditions(stragglers=None, stall=None, slow_links=None):
    """Every cluster a comparison runs each shape on: healthy first (None), then each straggler
    factor (F = 1 is the healthy run itself), then the stall, then each slow link."""
    out = [None]
    out += [s for s in (stragglers or []) if s.factor != 1]
    if stall is not None:
        out.append(stall)
    out += list(slow_links or [])
    return out


def link_of(condition, links):
    """(host namespace, switch namespace, queue ms, the host's key in the cluster's records, its
    own rate in bits/s) of the host a slow link names; UsageError where the description cannot
    say (a cluster that is not hvdps emulate's, or a host it does not have)."""
    if links is None or not links.namespaces or not links.switch or not links.queue_ms:
        raise UsageError("--slow_link shapes one host's link of hvdps emulate's cluster (tc in the host's "
                         "namespace): run the comparison under hvdps emulate")
    keys = [k for k, port in links.ports.items() if port == condition.port]
    names = [ns for ns in links.namespaces.values() if ns.endswith(f"-{condition.port}")]
    if not keys or len(names) != 1:
        raise UsageError(f"--slow_link {condition.port}={condition.rate}: the cluster has no host "
                         f"{condition.port} (it has {', '.join(sorted(links.ports.values()))})")
    key = keys[0]
    return names[0], links.switch, links.queue_ms, key, (links.rates or {}).get(key, links.rate_bps)
