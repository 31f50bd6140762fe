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
formula is written once. The cost-model interface (``CostModel``) is hvdps/cost/model.py's, the ring family the
all-reduce methods share hvdps/cost/ring.py's, the parameter servers' model ps_train's own: this module only
collects the entries. Everything else asks this module (``get``, ``lookup``,
``parse_variants``) and never compares a method's name; an unknown name is refused with the
valid ones listed, as Model Garden's ``get_distribution_strategy`` does.
"""
import dataclasses
import functools
import importlib
import os
from dataclasses import dataclass, field

from common.base.errors import UsageError
from common.base.flags import counts
from common.base.procs import REPO
from common.formats.schemas import RECORDS, Strict
from hvdps.cost.model import CostModel, Option
from hvdps.launchers import Launcher
from hvdps.measure.identity import settings_text
from common.base.numbers import whole


# ------------------------------------------------------------------ the registry
@dataclass(frozen=True)
class Setting:
    """A knob of a method's own that a comparison runs it at (``--backends NAME[SETTING=VALUE]``): its
    trainer's flag of the same name, its type and range. ``kind``: float, int, bool (a flag given or
    not) or str (one of ``choices``); ``low``/``high``: its range. A setting and the projection's
    ``Option`` of the same knob (Horovod's cycle time) share its name."""
    name: str
    kind: type
    help: str
    low: float = None
    high: float = None
    choices: tuple = ()

    def range_text(self):
        """How the refusals list it: ``NAME LOW..HIGH``, ``NAME true|false``, ``NAME a|b``."""
        if self.kind is bool:
            return f"{self.name} true|false"
        if self.choices:
            return f"{self.name} {'|'.join(self.choices)}"
        ends = [str(int(x)) if float(x).is_integer() else f"{x:g}" for x in (self.low, self.high)]
        return f"{self.name} {ends[0]}..{ends[1]}"

    def parse(self, text):
        """The value ``text`` gives, in its one spelling (``0.10`` is ``0.1``, ``yes`` is ``true``),
        or None where it is not a value of this setting."""
        text = text.strip()
        if self.kind is bool:
            return {"true": "true", "1": "true", "yes": "true", "false": "false", "0": "false",
                    "no": "false"}.get(text.lower())
        if self.choices:
            return text if text in self.choices else None
        try:
            value = self.kind(text)
        except ValueError:
            return None
        if value != value or not self.low <= value <= self.high:      # NaN, or out of range
            return None
        return f"{value:g}" if self.kind is float else str(value)

    def argv(self, value):
        """The trainer flags a parsed value stands for: ``--NAME VALUE``, a bool's flag alone when true."""
        if self.kind is bool:
            return [f"--{self.name}"] if value == "true" else []
        return [f"--{self.name}", value]


@dataclass(frozen=True)
class Axis:
    """One dimension of what ``hvdps tune`` searches of a method (``Method.space``): ``name``, "mode"
    (its modes), one of its settings or one of its launcher's task flags (a PS count); ``values``: the
    candidates, each in the spelling ``--backends`` takes, the method's default first (a task flag's
    default is the flag's own: ``values`` then lists the others); ``arithmetic``: whether its values
    train differently (async updates, backup workers, local SGD's k, fp16 gradients), so its candidates
    are judged by time to the target accuracy rather than by throughput alone."""
    name: str
    values: tuple
    arithmetic: bool = False


@dataclass(frozen=True)
class Variant:
    """One entry of ``--backends``, parsed: the method, one of its modes, its settings ((name, value),
    ...: in the method's declaration order, each in its one spelling) and, where the entry sizes them,
    its tasks besides the workers (a PS entry's task count; None: the task flags choose)."""
    method: str
    mode: str
    settings: tuple = ()
    tasks: tuple = None

    @property
    def pair(self):
        return self.method, self.mode


def settings_argv(name, settings):
    """The trainer flags that method ``name``'s parsed ``settings`` ((setting, value), ...) stand for."""
    declared = {s.name: s for s in get(name).settings}
    return [a for setting, value in settings for a in declared[setting].argv(value)]


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
    # the call a run's measured exchange (its summary's exchange_s, where its trainer times one) was
    # timed inside, as the report names it
    exchange_timed: str = "MPI_Allreduce"
    # its own knobs a comparison may run it at (``Setting``: --backends NAME[SETTING=VALUE])
    settings: tuple = ()
    # what hvdps tune searches of it (``Axis``: its modes, settings and task counts), () for its defaults only
    space: tuple = ()

    @property
    def modes(self):
        return tuple(self.labels)

    def label(self, mode):
        return self.labels.get(mode, f"{self.name} {mode}")

    def modes_help(self):
        """What ``--backends`` help says of its modes: each as NAME:MODE with the report's label."""
        text = "; ".join(f"{self.name}:{mode} {self.label(mode)}" for mode in self.modes)
        return text + (f"; the bare name runs {', '.join(self.default_modes)}" if self.default_modes else "")

    def settings_help(self):
        """What ``--backends`` help and its refusals say of its settings (and the task flags its
        brackets also take): ``NAME LOW..HIGH, ...``; "" where it has none."""
        ranges = [s.range_text() for s in self.settings] + [f"{f.dest} 1..4096" for f in self.launcher.task_flags]
        return ", ".join(ranges)

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
            problems.append("has no cost model (hvdps.cost.model.CostModel: " + ", ".join(
                n for n in ("collective", "arch", "network", "polls", "link_terms", "options", "lockstep", "waits_for",
                            "unwaited_step", "steps_per_exchange", "wait_points", "continues_without", "predict_links",
                            "exchange_s", "step_terms",
                            "projected_step", "net", "split_roles") if not hasattr(method.cost, n)) + " missing)")
        if method.cost is not None and getattr(method.cost, "collective", False) and not hasattr(method.cost, "exact"):
            problems.append("is collective without saying whether it is an exact ring (Ring.exact)")
        for mode in method.modes:
            if method.parse_mode(mode) != mode or method.overhead_parts(mode, False, False)[0] in ("", "distribution"):
                problems.append(f"mode {mode!r} does not parse back to itself or has no overhead wording")
        for mode in method.default_modes:
            if mode not in method.modes:
                problems.append(f"default mode {mode!r} is not one of its modes")
        problems += [f"declares {o!r} as an option, not a hvdps.cost.model.Option"
                     for o in getattr(method.cost, "options", ()) if not isinstance(o, Option)]
        problems += _record_problems(method.records)
        problems += _space_problems(method)
        if method.measured is not None and not (dataclasses.is_dataclass(method.measured)
                                                and method.measured.__dataclass_params__.frozen):
            problems.append("declares its measures as something other than a frozen dataclass")
    if problems:
        name = getattr(method, "name", repr(method))
        raise RuntimeError(f"{module}: method {name!r} " + "; ".join(problems))
    return method


def axis_value(method, axis, value):
    """A tuning axis' ``value`` in its one spelling, or None where it is not a value of that axis:
    a mode as the method parses it, a setting's value, a task flag's count (1..4096)."""
    if axis == "mode":
        try:
            return method.parse_mode(value)
        except UsageError:
            return None
    setting = next((s for s in method.settings if s.name == axis), None)
    if setting is not None:
        return setting.parse(value)
    if axis in {f.dest for f in method.launcher.task_flags}:
        n = whole(value)
        return str(n) if n is not None and 1 <= n <= 4096 else None
    return None


def axis_names(method):
    """The names a tuning axis of ``method`` may have: "mode", its settings, its task flags."""
    return ("mode", *(s.name for s in method.settings), *(f.dest for f in method.launcher.task_flags))


def _space_problems(method):
    """What is wrong with a method's declared tuning space: an axis it cannot take, a value that is not its."""
    problems = []
    for axis in method.space:
        if not isinstance(axis, Axis) or axis.name not in axis_names(method):
            problems.append(f"declares a tuning axis {getattr(axis, 'name', axis)!r} that is not a mode, "
                            f"setting or task flag of its own")
            continue
        bad = [v for v in axis.values if axis_value(method, axis.name, v) != v]
        if bad or not axis.values:
            problems.append(f"tuning axis {axis.name!r} has values that are not its own spelling: {bad}")
    return problems


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


def tuning_at(row, tuning):
    """The ``Tuning`` a run was costed at: ``tuning`` with each option of its method's cost model that
    one of the run's own settings names (a setting and an option of one knob share its name: Horovod's
    cycle time) at the run's value, so that ``hvdps project --from`` costs each run at the
    settings it ran at (``row``: a RunRow or StepShape; its ``settings``, ((name, value), ...))."""
    method, settings = row.method, getattr(row, "settings", ())
    if method is None or not settings:
        return tuning
    by_flag = {o.flag: o for o in method.cost.options}
    values = {}
    for name, value in settings:
        option = by_flag.get(name)
        if option is not None:
            typed = value == "true" if option.type is bool else option.type(value)
            values[option.field] = option.value(typed)
    return dataclasses.replace(tuning, **values) if values else tuning


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


def schedulers():
    """The cost models whose generic rows the projection draws, one per panel (``panel``: the first
    method's in the registry's order that plays a step out layer by layer, ``schedules``)."""
    found = {}
    for m in _registry().values():
        if getattr(m.cost, "schedules", False):
            found.setdefault(m.cost.panel, m.cost)
    return list(found.values())


def panel_of(cost):
    """The generic model of ``cost``'s panel: the one whose exchange a run's measured overlap is set on."""
    return next((s for s in schedulers() if s.panel == cost.panel), None)


def server_network():
    """The network the projection's generic parameter-server rows are costed on, as the methods
    with server tasks declare it (the ring's is ``RING_NETWORK``)."""
    return next((m.cost.network for m in _registry().values() if not m.cost.collective), None)


@functools.lru_cache(maxsize=None)
def task_flags():
    """Every ``TaskFlag`` the methods' launchers declare (hvdps/launchers.py), once each by its flag:
    two methods may share one (the parameter servers' two APIs' count), not declare it twice,
    differently."""
    out = {}
    for method in _registry().values():
        for flag in method.launcher.task_flags:
            if out.setdefault(flag.dest, flag) != flag:
                raise RuntimeError(f"{method.package}: task flag --{flag.dest} is declared twice, differently")
    return tuple(out.values())


def add_task_flags(group):
    """The methods' task flags on a command's parser (hvdps compare, hvdps k8s), each a list of counts
    parsed where it is read (``common.base.flags.counts``)."""
    for flag in task_flags():
        group.add_argument(f"--{flag.dest}", type=counts, default=flag.default, help=flag.help)


def task_flag_dests():
    """The task flags' names on a parsed command line: what is not passed on to the trainers."""
    return tuple(flag.dest for flag in task_flags())


def fewer_tasks():
    """What a refusal for too many tasks suggests: fewer workers or fewer of each method's tasks."""
    return " or ".join(["fewer --workers", *(f"--{flag.dest}" for flag in task_flags())])


def tasks_said(backend, tasks):
    """A run's tasks besides its workers as the report says them, by its method's task flags' labels
    ("2 PS"), the role's own name where no flag labels it; "" for a run of workers only."""
    method = lookup(backend)
    labels = {flag.role: flag.label for flag in (method.launcher.task_flags if method else ())}
    return ", ".join(f"{n} {labels.get(role, role)}" for role, n in tasks)


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


def label(backend, mode, settings=()):
    """The report's name of a run's method and mode, and of its own settings where it has any
    (``Horovod [NAME=VALUE]``)."""
    method = lookup(backend)
    name = method.label(mode) if method else f"{backend} {mode}"
    return name + (f" [{settings_text(settings)}]" if settings else "")


def split_entries(text):
    """``--backends``' entries: its commas outside brackets (``NAME[A=1,B=2],OTHER``)."""
    entries, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise UsageError(f"--backends {text!r}: brackets do not pair (NAME[:MODE][SETTING=VALUE,...])")
        if ch == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    if depth:
        raise UsageError(f"--backends {text!r}: a '[' is not closed (NAME[:MODE][SETTING=VALUE,...])")
    return [e.strip() for e in [*entries, text[start:]] if e.strip()]


def parse_settings(method, item, text):
    """(settings, tasks) of one entry's bracket ``text``: each SETTING=VALUE a setting the method
    declares, or one of its task flags (sizing a role of its tasks); a usage error listing them else."""
    declared = {s.name: s for s in method.settings}
    task_roles = {f.dest: f.role for f in method.launcher.task_flags}
    listed = (f"{method.name}'s settings: {method.settings_help()}" if method.settings_help()
              else f"{method.name} has no settings")
    values, tasks = {}, {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, value = (x.strip() for x in part.partition("="))
        if name in task_roles:
            parsed = value if eq and whole(value) is not None and 1 <= whole(value) <= 4096 else None
        else:
            parsed = declared[name].parse(value) if name in declared and eq else None
        if name not in declared and name not in task_roles:
            raise UsageError(f"--backends {item}: {method.name} has no setting {name!r} ({listed})")
        if name in values or name in tasks:
            raise UsageError(f"--backends {item}: {name} is given twice ({listed})")
        if parsed is None:
            raise UsageError(f"--backends {item}: {part!r} is not a value of {name} ({listed})")
        if name in task_roles:
            tasks[name] = int(parsed)
        else:
            values[name] = parsed
    settings = tuple((s.name, values[s.name]) for s in method.settings if s.name in values)
    given = tuple((task_roles[d], tasks[d]) for d in task_roles if d in tasks)
    return settings, (given or None)


def parse_variants(text):
    """'horovod,ps,ps2' -> [Variant], PS in both modes; 'ps:sync' picks one mode,
    'horovod:sparse_as_dense' Horovod's dense all-reduce of embedding gradients; 'NAME[SETTING=VALUE]'
    a method at one of its own settings (``Method.settings``), 'ps:sync[TASKS=2]' with two tasks of a role (ps_train/method.py)."""
    out = []
    for item in split_entries(text):
        head, bracket, rest = item.partition("[")
        if bracket and not rest.endswith("]"):
            raise UsageError(f"--backends {item}: settings go last, in one pair of brackets (NAME[:MODE][SETTING=VALUE,...])")
        name, _, mode = head.strip().partition(":")
        method = get(name)                         # unknown names list the valid ones
        mode = method.parse_mode(mode) if mode else mode
        settings, tasks = parse_settings(method, item, rest[:-1]) if bracket else ((), None)
        for variant in [Variant(name, m, settings, tasks) for m in ([mode] if mode else method.default_modes or method.modes)]:
            if variant in out:          # 'ps,ps:sync' or 'mwms,mwms': a run planned twice would overwrite itself
                raise UsageError(f"--backends names {entry_text(variant)} twice ('{item}' repeats it)")
            out.append(variant)
    if not out:
        raise UsageError("--backends is empty")
    return out


def entry_text(variant):
    """A Variant as --backends writes it: ``ps:sync``, ``NAME:MODE[SETTING=VALUE]``."""
    inside = [f"{k}={v}" for k, v in variant.settings]
    if variant.tasks:
        flags = {f.role: f.dest for f in get(variant.method).launcher.task_flags}
        inside += [f"{flags[role]}={n}" for role, n in variant.tasks]
    return f"{variant.method}:{variant.mode}" + (f"[{','.join(inside)}]" if inside else "")
