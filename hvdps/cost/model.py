"""The cost-model interface every method's entry declares (``Method.cost``: a ``CostModel``), the
pieces its models share (``combine``, ``summed_rates_step``), the networks comm.json fits
(``Network``) and the projection's flags a model declares for its own knobs (``Option``). The
registry (hvdps/methods.py) checks each entry against it; the families are the methods' own (the ring
the all-reduce methods share is hvdps/cost/ring.py, the parameter servers' ps_train/method.py)."""
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, runtime_checkable

from hvdps.cost import fits


@dataclass(frozen=True)
class Option:
    """A flag of ``hvdps project`` that a method's cost model declares (``CostModel.options``): a knob
    of that method's own implementation its schedule takes, such as Horovod's fusion buffer or the
    parameter servers' variable placement. hvdps/commands/project.py adds each to its one parser and
    the projection reads the values off one frozen ``Tuning``, so no application module names them.

    ``flag``: the flag's name (underscores) and value's type, default and help; ``field``: the
    ``Tuning`` field the cost code reads, the flag's value times ``scale`` (its unit: bytes, seconds,
    bytes/s), as ``cast``; ``low``/``high``/``choices``: its range, which the parser holds it to;
    ``says``: how the projection's text names the value (a format string, "" for not at all);
    ``network``: the network whose bandwidth the value caps (a transport slower than the link);
    ``check``: (value, the parsed flags) -> a usage error's text or None, for a rule between flags."""
    flag: str
    type: type
    default: object
    help: str
    field: str
    scale: float = 1
    cast: Optional[Callable] = None
    low: float = 0
    high: Optional[float] = None
    choices: tuple = ()
    says: str = ""
    network: Optional[str] = None
    check: Optional[Callable] = None

    def value(self, flag_value):
        """The ``Tuning`` field's value for the flag's value (None stays None: not given)."""
        if flag_value is None or not isinstance(flag_value, (int, float)) or isinstance(flag_value, bool):
            return flag_value
        scaled = flag_value * self.scale if self.scale != 1 else flag_value
        return (self.cast or self.type)(scaled)


@runtime_checkable
class CostModel(Protocol):
    """What the application asks a method's cost model (``Ring`` here, for the all-reduce methods;
    ps_train/method.py's ``ParameterServers``; a method may subclass either): whether it starts
    server tasks, the projection's architecture and network, whether its ranks spin while they wait,
    whether its workers step in lock-step and for how many of them a step waits (and where none
    does, how long a round of their steps at their own paces takes: ``unwaited_step``), how many steps one
    exchange serves, how many times a step a worker waits for others' data and must then act on it
    (hvdps/cost/stragglers.py: a spinning rank in a CPU quota pays its next period each time), how
    much of a step the other workers' exchange goes on while one worker is stopped, the bytes each
    host's link carries per round, the exchange's alpha-beta time, and the step as terms
    (``combine``) and as one figure with how it was reached, on the knobs of its implementation it
    declares (``options``, read off ``tuning``).

    A cost model that plays a step out layer by layer (``schedules``: a wait-free ring, parameter
    servers) has ``schedule(layers, compute_s, n, net, tuning, **layout)``, a ``schedule.Scheduled``
    with its knobs applied: the projection's generic rows of its architecture (``scheduler``)."""
    collective: bool
    arch: str
    network: str
    polls: bool
    link_terms: dict
    options: tuple

    def lockstep(self, mode): ...

    def waits_for(self, mode, workers): ...

    def unwaited_step(self, mode, steps, terms=None): ...

    def steps_per_exchange(self, mode): ...

    def wait_points(self, mode, workers): ...

    def continues_without(self, mode, workers, terms): ...

    def predict_links(self, mode, roles, gradient, shard_bytes=None): ...

    def split_roles(self, roles): ...

    def net(self, nets): ...

    def exchange_s(self, row, nets): ...

    def step_terms(self, row, shard_bytes, layers, nets, tuning): ...

    def projected_step(self, row, shard_bytes, layers, nets, tuning): ...


class Everywhere(dict):
    """One network for every exchange a step makes: the link one term of it crosses, whichever
    method's model costs it (hvdps/cost/stragglers.py: a worker's own link, the servers')."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def __missing__(self, key):
        return self.net

    def get(self, key, default=None):
        return self.net


def summed_rates_step(steps):
    """n workers that each step at their own pace, ``steps`` seconds: one round of n steps takes n over
    the sum of their rates (asynchronous workers: the job's rate is theirs added)."""
    return len(steps) / sum(1.0 / t for t in steps)


def combine(compute, terms, factors=None, compute_with=None):
    """A step from a cost model's terms: the longest of (compute, where the term waits for it) +
    factor x seconds. ``factors``: {term: factor} (hvdps/cost/heldout.py fits them; 1 otherwise);
    ``compute_with``: the compute the terms wait for, if not ``compute`` (contended compute)."""
    factors = factors or {}
    base = compute if compute_with is None else compute_with
    return max((base if waits else 0.0) + factors.get(name, 1.0) * seconds
               for name, (waits, seconds) in terms.items())


@dataclass(frozen=True)
class Network:
    """An exchange family comm.json measures on its own (benchmarks/comm_bandwidth.py): the cost
    models' network key, the prefix of its rows, what the projection calls it, and the rule its
    latency and bandwidth are fitted by (hvdps/cost/fits.py: ``ring``, ``push_pull``)."""
    network: str
    prefix: str
    what: str
    fit: Callable = fits.ring


