"""The registry of the distribution methods hvdps compares: it collects each method package's entry
(``<name>_train/method.py``: ``METHODS``) and is the only module the rest of hvdps asks about them.

A method is what ``--backends`` names (``horovod``, ``mpi``, ``mwms``, ``ps``, ``ps2``) with its modes
(``ps:sync``, ``horovod:sparse_as_dense``). Its entry, declared in its own package, holds all that
hvdps knows of it:

- the names and labels: its modes, the ones the bare name runs, the report's label per mode;
- its launcher (a subclass of hvdps/launchers.py's mpirun line or task launcher), locally and across hosts;
- its cost model: what each host's link carries per round (checked against the emulated
  cluster's counters), the exchange's alpha-beta time, and the step the projection expects, with
  the knobs of its implementation the projection takes as flags (``Option``, read off ``Tuning``);
- the report's wording for its distribution overhead, alone and with peers, and its waits;
- the fields its trainer adds to the shared records (``Method.records``: a Strict model per record
  type, read with them by common/formats/schemas.py's ``read_metrics``);
- what it measures of a run beyond the records every trainer writes (``Method.measures``, a frozen
  ``Method.measured``: its results.csv columns), and what the report says of that: a clause per run
  (``Method.details``), sections of its own (``Method.sections``); whether a logged step had every
  worker in, where its records count each worker's steps (``Method.all_in``);
- its install step, if pip's dependencies are not enough: ``<name>_train/install.py`` with ``--install``
  and ``--verify``, which ``make setup`` runs (Horovod compiled against the stack: horovod_train/install.py).

The per-worker wire rule the trainers record (``allreduce.backend.ring_wire`` / ``ps_train.backend.ps_wire``) and the
formulas here share their pieces (``allreduce.backend.ring_share``, ``hvdps.cost.schedule``), so each
formula is written once; this module holds the cost-model interface (``CostModel``) and the ring family the all-reduce methods share; the parameter servers' model is ps_train's own. Everything else asks this module (``get``, ``lookup``,
``parse_variants``) and never compares a method's name; an unknown name is refused with the
valid ones listed, as Model Garden's ``get_distribution_strategy`` does.
"""
import dataclasses
import functools
import importlib
import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, runtime_checkable

from allreduce.backend import ring_share
from common.base.errors import UsageError
from common.base.procs import REPO
from common.formats.schemas import RECORDS, Strict
from hvdps.cost import fits, schedule
from hvdps.launchers import Launcher


# ------------------------------------------------------------------ cost models
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

    def exchange_s(self, row, ring, ps): ...

    def step_terms(self, row, shard_bytes, layers, ring, ps, tuning): ...

    def projected_step(self, row, shard_bytes, layers, ring, ps, tuning): ...


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


# The network a ring is costed on unless it declares one of its own, and the one the projection's
# generic ring all-reduce rows use (fitted from Horovod's measured collectives, horovod_train/method.py).
RING_NETWORK = "allreduce"


class Ring:
    """Ring all-reduce: every rank sends and receives 2(n-1)/n of each dense tensor per step,
    rank to rank (no server). ``dense_modes``: the modes that all-reduce embedding tables whole
    (otherwise their slices are all-gathered, which is not the ring's rule: no link prediction).
    ``wait_free``: the exchange starts while back-propagation runs (Horovod's background thread and
    fusion, played out by schedule.ring_step); otherwise one all-reduce after it. ``network``: the
    fit of latency and bandwidth the projection costs it with (hvdps/cost/projection.py: ``allreduce``,
    fitted from Horovod's measured collectives, or a family of its own such as TensorFlow's ring),
    where no flag or emulated cluster gives every method the same network; ``measured``: the
    ``Network`` comm.json's rows of this method fit (None: costed with another's). ``polls``: its ranks spin
    while they wait (Open MPI's progress loop, Horovod's background thread), so the busy share of the
    cores measures their waiting, not their work (hvdps/cost/heldout.py fits no cores floor for it).
    ``options``: the knobs of the implementation it declares (``Option``); a wait-free ring reads its
    fusion buffer and cycle off ``tuning`` (``fusion_bytes``, ``cycle_s``), which its method declares."""
    collective = True       # no server tasks; one worker alone exchanges nothing
    # the link each step term crosses (hvdps/cost/stragglers.py: "own", "server"); a ring's one term
    # moves at the pace of the slowest link among its ranks, the default for a term not named
    link_terms = {}
    arch = "ring"           # the projection's architecture this method is measured against
    # Every update is the all-ranks average of that step's gradients, so one exact ring is a drop-in
    # for another: the crossover's ring side is the fastest of them. A ring method that is not exact
    # (local SGD: weights averaged every k steps) is set against them instead, and the projection
    # draws it on rows of its own even where it shares the ring's network.
    exact = True

    def lockstep(self, mode):
        """Every rank computes at the same moment each step (they all wait for the all-reduce)."""
        return True

    def waits_for(self, mode, workers):
        """How many workers a step waits for (None: none, each at its own pace): a ring, every rank."""
        return workers

    def unwaited_step(self, mode, steps, terms=None):
        """Seconds a round of the n workers' steps takes where no step waits for the others
        (``waits_for`` None), each at its own ``steps`` (``terms``: each worker's step terms, for a
        method whose round also depends on what crosses one worker's link): n over their summed
        rates. A ring always waits; this is the rule every unwaited method shares."""
        return summed_rates_step(steps)

    def steps_per_exchange(self, mode):
        """How many steps one exchange serves: every step's gradient is all-reduced."""
        return 1

    def wait_points(self, mode, workers):
        """How many times a step a rank waits for its neighbour's data and then must act on it: the
        ring's 2(n - 1) transfers (reduce-scatter, then all-gather), once per exchange."""
        return 2 * (workers - 1) / self.steps_per_exchange(mode)

    def continues_without(self, mode, workers, terms):
        """Seconds of a step (``terms``: ``step_terms``) the other workers' exchange goes on while one
        worker is stopped: none in a ring, whose every transfer needs every rank."""
        return 0.0

    def __init__(self, dense_modes=("sync",), wait_free=False, how=None, network=None, polls=False,
                 measured=None, options=()):
        self.dense_modes, self.wait_free, self.network = tuple(dense_modes), wait_free, network or RING_NETWORK
        self.polls, self.measured, self.options = polls, measured, tuple(options)
        self.how = how or ("ring, wait-free schedule of the layers" if wait_free
                           else "ring Allreduce after back-propagation")

    def dense(self, mode):
        """Whether ``mode`` all-reduces embedding tables whole (else their slices are all-gathered)."""
        return mode in self.dense_modes

    @property
    def schedules(self):
        """A wait-free ring's step is played out layer by layer (its fusion buffer and cycle)."""
        return self.wait_free

    def schedule(self, layers, compute_s, n, net, tuning, **layout):
        """One step on ``net`` as the wait-free ring plays it out (schedule.ring_step): the layers'
        gradients packed into fusion buffers each background cycle, with the fusion buffer and cycle
        its method declares (``tuning.fusion_bytes``, ``tuning.cycle_s``)."""
        return schedule.ring_step(layers, compute_s, n, net.bandwidth, net.alpha, tuning.fusion_bytes, tuning.cycle_s)

    def predict_links(self, mode, roles, gradient, shard_bytes=None):
        """{host: {"in", "out"}} bytes per round: each host with a rank carries the ring's share of
        the dense gradient (tables whole) both ways; a job on one host crosses no link."""
        dense, sparse, table = (getattr(gradient, k) or 0 for k in ("dense_bytes", "sparse_bytes", "sparse_table_bytes"))
        if sparse and not self.dense(mode):
            return None
        hosts = {h: {"in": 0.0, "out": 0.0} for h in dict.fromkeys(roles.values())}
        ranks = [h for t, h in roles.items() if t.startswith("rank:")]
        ring = ring_share(len(ranks)) * (dense + table)
        used = set(ranks)
        for h in hosts:
            if h in used and len(used) > 1:
                hosts[h] = {"in": ring, "out": ring}
        return hosts

    def exchange_s(self, row, ring, ps):
        """The alpha-beta time of one step's exchange with the ring's fitted network."""
        grad, n = row.grad_bytes_per_step, row.workers or 1
        if not grad or n < 2 or not ring:
            return None
        return schedule.ring_allreduce_time(n, grad, ring.bandwidth, ring.alpha)

    def projected_step(self, row, shard_bytes, layers, ring, ps, tuning):
        terms = self.step_terms(row, shard_bytes, layers, ring, ps, tuning)
        return (None, None) if terms is None else (combine(row.compute_s, terms), self.how)

    def step_terms(self, row, shard_bytes, layers, ring, ps, tuning):
        """{term: (with compute, seconds)}: the step is the longest of compute (where counted) plus
        each term (``combine``). The ring has one: the exchange left after back-propagation."""
        n, compute, grad = row.workers, row.compute_s, row.grad_bytes_per_step
        if self.wait_free:
            return {"ring": (True, self.schedule(layers, compute, n, ring, tuning).step_s - compute)}
        if not grad:
            return None
        return {"ring": (True, schedule.ring_allreduce_time(n, grad, ring.bandwidth, ring.alpha))}


# ------------------------------------------------------------------ the registry
@dataclass(frozen=True)
class Method:
    """One distribution method: see the module's docstring."""
    name: str
    labels: dict                     # mode -> the report's label; its keys are the modes, in order
    launcher: type                   # hvdps.launchers.Launcher subclass
    cost: object                     # a CostModel: Ring, ps_train's ParameterServers, or a subclass
    overhead: dict                   # mode -> what a step's distribution overhead consists of
    default_modes: tuple = ()        # what the bare name runs (empty: every mode)
    alone: dict = field(default_factory=dict)   # mode -> the overhead's name at one worker
    waits: dict = field(default_factory=dict)   # mode -> (the measured wait, the rest), n >= 2
    waits_alone: tuple = ()          # the same at one worker
    package: str = ""                # the package that declared it (set by the registry): its trainer's home
    # report sections of its own: functions (its runs' rows -> Markdown lines), each written once over
    # the runs of every method that declares it (hvdps/render/report.py: methods_sections)
    sections: tuple = ()
    # the fields its trainer adds to the shared records: {record type: a Strict model of them}
    # (common/formats/schemas.py: ``with_fields``), validated and typed when a run is read back
    records: dict = field(default_factory=dict)
    # what ``measures`` returns: a frozen dataclass whose fields are results.csv's columns of its own
    # (after the shared ones), None where it measures nothing more
    measured: type = None

    @property
    def modes(self):
        return tuple(self.labels)

    def label(self, mode):
        return self.labels.get(mode, f"{self.name} {mode}")

    def modes_help(self):
        """What ``--backends`` help says of its modes: each as NAME:MODE with the report's label."""
        text = "; ".join(f"{self.name}:{mode} {self.label(mode)}" for mode in self.modes)
        return text + (f"; the bare name runs {', '.join(self.default_modes)}" if self.default_modes else "")

    def parse_mode(self, text):
        """The mode ``--backends NAME:TEXT`` names, or a usage error listing the valid ones. A method
        whose mode is a value rather than a name (local SGD's k) overrides it."""
        if text not in self.modes:
            raise UsageError(f"backend {self.name} has no mode '{text}' (valid: {', '.join(self.modes)})")
        return text

    def measures(self, run_dir, curves, summary, interval):
        """What this method measures beyond the figures every trainer's records give: an instance of
        ``measured`` (the row's ``measured``), or None. From the run's records (``curves``: its
        typed header, steps and evaluations; its ``summary``, or None; each with ``records``' fields) and its folder, over
        the measured ``interval`` (Unix time, or None). The all-reduce methods measure nothing more;
        the parameter servers' entry reads its tasks' CPU, each worker's wait and the dropped
        gradients (ps_train/method.py)."""
        return None

    def shard_bytes(self, header):
        """{server task: model bytes it holds} as the run recorded it, for a method with server
        tasks whose cost model weighs each task's share (ps_train/method.py); None otherwise."""
        return None

    def details(self, row):
        """A clause the report adds to a run's explanation (``"; ..."``), of what only this method
        measures; nothing by default."""
        return ""

    def all_in(self, step):
        """Whether every worker had made a step by this logged ``step`` record: True unless the
        method's records count each worker's own (a late worker's first intervals are its job's
        start-up, not its pace: hvdps/measure/rows.py, steady_rate)."""
        return True

    def overhead_parts(self, mode, alone, measured_wait):
        """What the report calls the overhead: [name] or, where the run measured its wait for
        the other workers, [the wait, the rest]."""
        if measured_wait and mode in self.waits:
            return list(self.waits_alone if alone and self.waits_alone else self.waits[mode])
        return [(self.alone.get(mode) if alone else None) or self.overhead.get(mode, "distribution")]


def method_packages(kind="method"):
    """{method package's short name: module} of the packages (``<name>_train``) that have
    ``<kind>.py``: the trainers (``main``), the local launchers (``launch``) and the registry's
    entries (``method``) are found by where they are, so a new method is a new package."""
    found = {}
    for entry in sorted(os.listdir(REPO)):
        if entry.endswith("_train") and os.path.isfile(os.path.join(REPO, entry, f"{kind}.py")):
            found[entry[:-len("_train")]] = f"{entry}.{kind}"
    return found


def check_entry(method, module):
    """A method entry as the application will use it, or a RuntimeError naming the module and what
    it lacks: the contract is checked when the registry loads, not where a report first reads it."""
    problems = []
    if not isinstance(method, Method):
        problems.append("is not a hvdps.methods.Method")
    else:
        if not method.labels:
            problems.append("declares no mode")
        if not (isinstance(method.launcher, type) and issubclass(method.launcher, Launcher)):
            problems.append("has no hvdps.launchers.Launcher subclass as its launcher")
        if not isinstance(method.cost, CostModel):
            problems.append("has no cost model (hvdps.methods.CostModel: " + ", ".join(
                n for n in ("collective", "arch", "network", "polls", "link_terms", "options", "lockstep", "waits_for",
                            "unwaited_step", "steps_per_exchange", "wait_points", "continues_without", "predict_links",
                            "exchange_s", "step_terms",
                            "projected_step") if not hasattr(method.cost, n)) + " missing)")
        if method.cost is not None and getattr(method.cost, "collective", False) and not hasattr(method.cost, "exact"):
            problems.append("is collective without saying whether it is an exact ring (Ring.exact)")
        for mode in method.modes:
            if method.parse_mode(mode) != mode or method.overhead_parts(mode, False, False)[0] in ("", "distribution"):
                problems.append(f"mode {mode!r} does not parse back to itself or has no overhead wording")
        for mode in method.default_modes:
            if mode not in method.modes:
                problems.append(f"default mode {mode!r} is not one of its modes")
        problems += [f"declares {o!r} as an option, not a hvdps.methods.Option"
                     for o in getattr(method.cost, "options", ()) if not isinstance(o, Option)]
        problems += _record_problems(method.records)
        if method.measured is not None and not (dataclasses.is_dataclass(method.measured)
                                                and method.measured.__dataclass_params__.frozen):
            problems.append("declares its measures as something other than a frozen dataclass")
    if problems:
        name = getattr(method, "name", repr(method))
        raise RuntimeError(f"{module}: method {name!r} " + "; ".join(problems))
    return method


def _record_problems(records):
    """What is wrong with a method's declared record fields: an unknown record type, a model that is
    not a schemas.Strict, or a field the shared record has (a method may add fields, not redefine them)."""
    problems = []
    for kind, model in records.items():
        if kind not in RECORDS:
            problems.append(f"adds fields to {kind!r}, not a record type ({', '.join(RECORDS)})")
        elif not (isinstance(model, type) and issubclass(model, Strict)):
            problems.append(f"declares its {kind} fields as something other than a schemas.Strict model")
        elif set(model.model_fields) & set(RECORDS[kind].model_fields):
            problems.append(f"redefines the {kind} record's own field(s) "
                            + ", ".join(sorted(set(model.model_fields) & set(RECORDS[kind].model_fields))))
    return problems


@functools.lru_cache(maxsize=None)
def _registry():
    """{name: Method} from every method package's ``METHODS`` (collected on first use: each package
    imports this module for ``Method`` and its cost model)."""
    found = {}
    for module in method_packages().values():
        for method in importlib.import_module(module).METHODS:
            if method.name in found:
                raise RuntimeError(f"two methods are called {method.name!r} ({module})")
            check_entry(method, module)
            found[method.name] = dataclasses.replace(method, package=module.split(".")[0])
    return found


def __getattr__(name):
    """``METHODS``: the registry, {name: Method}, in the packages' order."""
    if name == "METHODS":
        return _registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def record_fields():
    """{method: {record type: its fields' model}}: what each method's trainer adds to the shared
    records, for common/formats/schemas.py's ``read_metrics``."""
    return {name: m.records for name, m in _registry().items() if m.records}


def measured_columns():
    """results.csv's columns of the methods' own measures, after the shared ones: each declared
    field once, in the registry's order."""
    out = []
    for method in _registry().values():
        if method.measured is not None:
            out += [f.name for f in dataclasses.fields(method.measured) if f.name not in out]
    return tuple(out)


def networks_measured():
    """{network: Network}: the exchange families comm.json measures, as the methods' cost models
    declare them (``measured``; hvdps/cost/projection.py fits each by its rule)."""
    out = {}
    for method in _registry().values():
        net = getattr(method.cost, "measured", None)
        if net is not None:
            out.setdefault(net.network, net)
    return out


@functools.lru_cache(maxsize=None)
def options():
    """Every ``Option`` the methods' cost models declare, once each, in the registry's order; two
    methods may share one (the parameter servers' two APIs), but not declare two under one name."""
    out = {}
    for method in _registry().values():
        for option in method.cost.options:
            for key in ("flag", "field"):
                twin = next((o for o in out.values() if getattr(o, key) == getattr(option, key)), option)
                if twin != option:
                    raise RuntimeError(f"{method.package}: option {key} {getattr(option, key)!r} is "
                                       f"declared twice, differently")
            out[option.flag] = option
    return tuple(out.values())


@functools.lru_cache(maxsize=None)
def _tuning_type():
    """The frozen record of every declared option's value, one field each (``Option.field``)."""
    return dataclasses.make_dataclass(
        "Tuning", [(o.field, object, field(default=o.value(o.default))) for o in options()], frozen=True,
        namespace={"__doc__": "The values of the methods' declared options (``options``), in their cost "
                              "models' units: what a projection is tuned to."})


def tuning(**values):
    """A ``Tuning``: every option at its default, but for the fields in ``values`` (in their units)."""
    return _tuning_type()(**values)


def tuning_of(args):
    """The ``Tuning`` the parsed flags ``args`` give (each option's flag, read off ``args``), or a usage
    error where an option's rule between flags (``Option.check``) fails."""
    values = {}
    for option in options():
        given = getattr(args, option.flag, option.default)
        problem = option.check(given, args) if option.check and given is not None else None
        if problem:
            raise UsageError(problem)
        values[option.field] = option.value(given)
    return tuning(**values)


def scheduler(collective):
    """The cost model that plays out the projection's generic rows of an architecture, a ring
    (``collective``) or parameter servers: the first method's, in the registry's order, that plays a
    step out layer by layer (``schedules``); None if no method does."""
    return next((m.cost for m in _registry().values()
                 if m.cost.collective == collective and getattr(m.cost, "schedules", False)), None)


def server_network():
    """The network the projection's generic parameter-server rows are costed on, as the methods
    with server tasks declare it (the ring's is ``RING_NETWORK``)."""
    return next((m.cost.network for m in _registry().values() if not m.cost.collective), None)


def lookup(name):
    """The method called ``name``, or None (a run recorded by a method this version does not know)."""
    return _registry().get(name)


def get(name):
    """The method called ``name``; an unknown name is a usage error listing the valid ones."""
    registry = _registry()
    if name not in registry:
        raise UsageError(f"unknown backend '{name}' (valid: {', '.join(sorted(registry))})")
    return registry[name]


def get_launcher(name, **options):
    """The launcher of method ``name`` (options: the launcher's, e.g. ``mpi_yield``)."""
    return get(name).launcher(**options)


def label(backend, mode):
    """The report's name of a run's method and mode."""
    method = lookup(backend)
    return method.label(mode) if method else f"{backend} {mode}"


def parse_variants(text):
    """'horovod,ps,ps2' -> [(backend, mode)], PS in both modes; 'ps:sync' picks one mode,
    'horovod:sparse_as_dense' Horovod's dense all-reduce of embedding gradients."""
    out = []
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        name, _, mode = item.partition(":")
        method = get(name)                         # unknown names list the valid ones
        mode = method.parse_mode(mode) if mode else mode
        for variant in [(name, m) for m in ([mode] if mode else method.default_modes or method.modes)]:
            if variant in out:          # 'ps,ps:sync' or 'mwms,mwms': a run planned twice would overwrite itself
                raise UsageError(f"--backends names {variant[0]}:{variant[1]} twice ('{item}' repeats it)")
            out.append(variant)
    if not out:
        raise UsageError("--backends is empty")
    return out
