"""The method registry (hvdps/methods.py): one entry per method, and nobody else branching on names."""
import ast
import re
import glob
import os

import pytest

from common.formats.schemas import Gradient

from common.base.errors import UsageError
from hvdps import launchers, methods
from hvdps.cost.model import Everywhere
from hvdps.cost.ring import Ring
from tests.conftest import REPO, VALID_BACKENDS

NAMES = set(methods.METHODS)
MODES = {mode for m in methods.METHODS.values() for mode in m.modes}
# what a branch on a method could compare instead of its name: the report's labels, the cost model's
# architecture ("ring", "PS k=1")
LABELS = {label for m in methods.METHODS.values() for label in m.labels.values()} | \
    {m.cost.arch for m in methods.METHODS.values()}


@pytest.mark.parametrize("text, expected", [
    ("horovod", [("horovod", "sync")]),
    ("horovod:sparse_as_dense", [("horovod", "sparse_as_dense")]),
    ("ps", [("ps", "async"), ("ps", "sync")]),
    ("ps:sync, mpi", [("ps", "sync"), ("mpi", "sync")]),
    ("ps2", [("ps2", "async")]),
    ("ps:backup1,ps:backup02", [("ps", "backup1"), ("ps", "backup2")]),     # sync PS with K backup workers
])
def test_variants(text, expected):
    assert [v.pair for v in methods.parse_variants(text)] == expected


@pytest.mark.parametrize("text, message", [
    ("mxnet", re.escape(f"unknown backend 'mxnet' (valid: {VALID_BACKENDS})")),
    ("ps:bulk", r"backend ps has no mode 'bulk' \(valid: async, sync\)"),
    (",", r"--backends is empty"),
    ("mwms,mwms", r"--backends names mwms:sync twice \('mwms' repeats it\)"),       # planned twice: refused
    ("ps,ps:sync", r"--backends names ps:sync twice \('ps:sync' repeats it\)"),     # 'ps' already runs both
    ("horovod:sparse_as_dense,horovod:sparse_as_dense", r"names horovod:sparse_as_dense twice"),
    ("ps:backup", r"backend ps:backupK: K backup workers, a whole number from 1 to 1024"),
    ("ps:backup-1", r"backend ps:backupK"),
    ("ps2:backup1", r"backend ps2 has no mode 'backup1' \(valid: async\)"),           # TF2's PS: async only
])
def test_bad_variants_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        methods.parse_variants(text)


@pytest.mark.parametrize("text, settings, tasks", [
    ("horovod[cycle_time_ms=0.10]", (("cycle_time_ms", "0.1"),), None),           # one spelling of a value
    ("horovod[fusion_threshold_mb=0, cycle_time_ms=5]",                           # declaration order kept
     (("cycle_time_ms", "5"), ("fusion_threshold_mb", "0")), None),
    ("horovod[fp16_allreduce=yes]", (("fp16_allreduce", "true"),), None),
    ("mwms[implementation=ring]", (("implementation", "ring"),), None),
    ("ps:sync[num_ps=2]", (), (("ps", 2),)),                                        # a task flag sizes a role
    ("horovod[]", (), None),
])
def test_variant_settings(text, settings, tasks):
    [variant] = methods.parse_variants(text)
    assert (variant.settings, variant.tasks) == (settings, tasks)
    assert methods.parse_variants(methods.entry_text(variant)) == [variant]         # written as it is read


@pytest.mark.parametrize("settings, argv", [
    ((("cycle_time_ms", "0.1"),), ["--cycle_time_ms", "0.1"]),
    ((("fp16_allreduce", "true"),), ["--fp16_allreduce"]),
    ((("fp16_allreduce", "false"),), []),
])
def test_settings_argv(settings, argv):
    assert methods.settings_argv("horovod", settings) == argv


def test_settings_are_trainer_flags():
    """Every declared setting is a flag its trainer parses: a setting the trainer refused would fail
    only after a comparison's runs started."""
    import importlib
    for m in methods.METHODS.values():
        dests = {a.dest for a in importlib.import_module(f"{m.package}.main").make_parser()._actions}
        assert {s.name for s in m.settings} <= dests, m.name


@pytest.mark.parametrize("text, message", [
    ("horovod[cycle=1]", r"horovod has no setting 'cycle' \(horovod's settings: cycle_time_ms 0\.\.1000"),
    ("horovod[cycle_time_ms=-1]", r"'cycle_time_ms=-1' is not a value of cycle_time_ms"),
    ("horovod[cycle_time_ms=nan]", r"is not a value of cycle_time_ms"),
    ("horovod[cycle_time_ms]", r"'cycle_time_ms' is not a value of cycle_time_ms"),
    ("horovod[cycle_time_ms=1,cycle_time_ms=2]", r"cycle_time_ms is given twice"),
    ("mwms[implementation=mpi]", r"is not a value of implementation"),
    ("mpi[cycle_time_ms=1]", r"mpi has no setting"),
    ("horovod[cycle_time_ms=1", r"a '\[' is not closed"),
    ("horovod]", r"brackets do not pair"),
    ("horovod[cycle_time_ms=1]:sync", r"settings go last"),
    ("ps:sync[num_ps=0]", r"'num_ps=0' is not a value of num_ps"),
    ("horovod,horovod[]", r"names horovod:sync twice"),
])
def test_bad_settings_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        methods.parse_variants(text)


def test_a_setting_is_in_the_run_name():
    """Two runs of one method at two settings get two folders and two DNS-safe object names."""
    from hvdps.measure.identity import RunId
    from tf_cluster.jobset import DNS_LABEL
    names = {RunId("mlp", v.method, v.mode, 2, settings=v.settings).name
             for v in methods.parse_variants("horovod,horovod[cycle_time_ms=0.1],horovod[fp16_allreduce=true]")}
    assert names == {"horovod-sync-w2", "horovod-sync-w2-cycle-time-ms-0p1", "horovod-sync-w2-fp16-allreduce-true"}
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) and len(n) <= DNS_LABEL for n in names)


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_entry_is_whole(name):
    """Each mode of each method has a label and overhead wording; the launcher launches and the
    cost model answers for every mode; collective methods start no server tasks."""
    m = methods.get(name)
    assert m.modes and set(m.default_modes or m.modes) <= set(m.modes)
    assert issubclass(m.launcher, launchers.Launcher)
    for mode in m.modes:
        assert m.label(mode) != f"{name} {mode}" and m.overhead[mode]
        assert m.overhead_parts(mode, alone=False, measured_wait=False)[0]
    launcher = m.launcher()
    assert (launcher.processes(2, launcher.default_tasks()) == 2) == m.cost.collective
    # hvdps compare --help lists it from its own declaration, every mode or the mode's form by name
    from hvdps.commands.compare import backends_help
    said = m.modes_help()
    assert f"{name} ({said}" in backends_help() and m.settings_help() in backends_help()
    assert all(f"{name}:{mode} " in said for mode in m.modes) or f"{name}:K " in said, said


class _NoCost:
    collective = True


class _Fields(methods.Strict):
    rounds: int = 0


class _Clash(methods.Strict):
    loss: str = ""


@pytest.mark.parametrize("entry, problem", [
    (lambda m: "not an entry", "is not a hvdps.methods.Method"),
    (lambda m: methods.dataclasses.replace(m, labels={}), "declares no mode"),
    (lambda m: methods.dataclasses.replace(m, launcher=object), "has no hvdps.launchers.Launcher subclass"),
    (lambda m: methods.dataclasses.replace(m, cost=_NoCost()), "arch, network, polls, link_terms, options, lockstep, waits_for, unwaited_step, steps_per_exchange, wait_points, continues_without, predict_links"),
    (lambda m: methods.dataclasses.replace(m, cost=Ring(options=("--cycle_time_ms",))),
     "declares '--cycle_time_ms' as an option, not a hvdps.cost.model.Option"),
    (lambda m: methods.dataclasses.replace(m, overhead={}), "mode 'sync' does not parse back to itself or has no "
                                                            "overhead wording"),
    (lambda m: methods.dataclasses.replace(m, default_modes=("fast",)), "default mode 'fast' is not one of its modes"),
    # the fields it adds to the shared records, and its own measures
    (lambda m: methods.dataclasses.replace(m, records={"stats": _Fields}), "adds fields to 'stats', not a record type"),
    (lambda m: methods.dataclasses.replace(m, records={"step": dict}), "its step fields as something other than"),
    (lambda m: methods.dataclasses.replace(m, records={"step": _Clash}), "redefines the step record's own field(s) loss"),
    (lambda m: methods.dataclasses.replace(m, measured=dict), "its measures as something other than a frozen"),
])
def test_the_registry_refuses_an_incomplete_entry(entry, problem):
    """The contract is checked as the registry loads a package: an entry that lacks a part is named
    with its module, before a comparison or a report would trip on it."""
    good = methods.get("mpi")
    assert methods.check_entry(good, "mpi_train.method") is good
    with pytest.raises(RuntimeError) as e:
        methods.check_entry(entry(good), "x_train.method")
    assert str(e.value).startswith("x_train.method: method ") and problem in str(e.value), str(e.value)


@pytest.mark.parametrize("backend, mode, roles, expect", [
    # a 2-rank ring across two hosts: each carries 2(n-1)/n = 1 x the gradient both ways
    ("mpi", "sync", {"rank:0": "a", "rank:1": "b"}, {"a": 1000.0, "b": 1000.0}),
    ("horovod", "sync", {"rank:0": "a", "rank:1": "a"}, {"a": 0.0}),        # one host: no link crossed
    # one PS on its own host, two workers: the PS link carries both workers' M each way
    ("ps", "sync", {"ps:0": "p", "worker:0": "a", "worker:1": "b"}, {"p": 2000.0, "a": 1000.0, "b": 1000.0}),
])
def test_link_prediction_per_method(backend, mode, roles, expect):
    got = methods.get(backend).cost.predict_links(mode, roles, Gradient(dense_bytes=1000))
    assert {h: v["in"] for h, v in got.items()} == expect
    assert all(v["in"] == v["out"] for v in got.values())


def test_unknown_method_in_a_report_keeps_its_own_name():
    """Runs recorded by a method this version does not know still get a row, under their own name."""
    assert methods.lookup("byteps") is None and methods.label("byteps", "sync") == "byteps sync"


@pytest.mark.parametrize("argv, fields", [
    ([], {"cycle_s": 1e-3, "fusion_bytes": 128 << 20, "placement": "split", "towers": 1, "ps_bandwidth": None}),
    (["--cycle_time_ms", "5", "--fusion_threshold_mb", "64"], {"cycle_s": 5e-3, "fusion_bytes": 64 << 20}),
    (["--ps_sharding", "greedy", "--ps_gpus_per_worker", "4", "--gpus_per_server", "8"],
     {"placement": "greedy", "towers": 4}),
    (["--ps_bandwidth_gbps", "6.4"], {"ps_bandwidth": 0.8e9}),
])
def test_a_methods_knobs_are_flags_of_the_projection_in_their_units(argv, fields):
    """Each method's cost model declares its knobs (``Option``); hvdps project parses them with its one
    parser, and the cost code reads them off one frozen ``Tuning`` in its own units."""
    from hvdps.commands import project
    tuning = methods.tuning_of(project.make_parser().parse_args(argv))
    for name, value in fields.items():
        assert getattr(tuning, name) == (pytest.approx(value) if isinstance(value, float) else value), name
    with pytest.raises(methods.dataclasses.FrozenInstanceError):
        tuning.towers = 2


def test_every_knob_is_declared_by_its_method_and_named_nowhere_else():
    """The projection's flags for one implementation (Horovod's cycle, the PS placement) live in that
    method's package: no application module names them, and a rule between flags is the option's."""
    from hvdps.commands import project
    declared = {o.flag: m.package for m in methods.METHODS.values() for o in m.cost.options}
    assert {"cycle_time_ms": "horovod_train", "ps_sharding": "ps_train"}.items() <= declared.items()
    parser = project.make_parser()
    assert {f"--{flag}" for flag in declared} <= set(parser._option_string_actions)
    for path in glob.glob(os.path.join(REPO, "hvdps", "**", "*.py"), recursive=True):
        with open(path) as f:
            text = f.read()
        assert not [flag for flag in declared if flag in text], path
    args = parser.parse_args(["--ps_gpus_per_worker", "3", "--gpus_per_server", "4"])
    with pytest.raises(UsageError, match=r"--ps_gpus_per_worker must divide --gpus_per_server \(4\), got 3"):
        methods.tuning_of(args)


@pytest.mark.parametrize("collective, package, knob, changed", [
    (True, "horovod_train", "cycle_s", 50e-3),          # a longer background cycle: the buffer leaves later
    (True, "horovod_train", "fusion_bytes", 64 << 10),  # a smaller fusion buffer: 7 all-reduces, not 1
    (False, "ps_train", "placement", "round_robin"),    # the 784 x 100 kernel whole on one of the 8 shards
    (False, "ps_train", "towers", 4),                   # 4 GPUs a worker task: a quarter of the copies
])
def test_the_projections_generic_rows_are_the_declaring_methods_schedule(collective, package, knob, changed):
    """The ring rows and the PS rows of hvdps project are the schedule of the method that plays each
    architecture out layer by layer (Horovod's wait-free ring, the PS trainers' placement), with the
    knobs that method declares: the projection names none of them (hvdps/cost/projection.py)."""
    from hvdps.cost import projection
    from hvdps.cost.schedule import AlphaBeta
    from common.formats.schemas import Layer
    cost = methods.scheduler(collective)
    assert cost is methods.METHODS[next(n for n, m in methods.METHODS.items() if m.package == package)].cost
    # a back-propagation of 0.1 ms: every gradient is ready by the ring's first cycle
    layers = [Layer(name="dense/kernel", grad_bytes=4 * 784 * 100, flops=1)] + \
        [Layer(name=f"dense_{i}/kernel", grad_bytes=4 * 100 * 100, flops=1) for i in range(1, 7)]
    net = AlphaBeta(alpha=50e-6, bandwidth=1e8)
    arch = cost.panel if collective else "PS k=8"        # the ring's generic row is named as its panel
    rows = lambda tuning: {r.arch: r for r in projection.project(layers, 1e-4, [16], Everywhere(net), shards=(8,),
                                                                  per_server=4, tuning=tuning)}
    default, tuned = methods.tuning(), methods.tuning(**{knob: changed})
    layout = {} if collective else {"shards": 8, "per_server": 4}
    assert rows(default)[arch].step_s == cost.schedule(layers, 1e-4, 16, net, default, **layout).step_s
    assert rows(tuned)[arch].step_s == cost.schedule(layers, 1e-4, 16, net, tuned, **layout).step_s
    assert rows(tuned)[arch].step_s != rows(default)[arch].step_s, knob


def _names_compared(tree):
    """(line, constant) of every comparison against a method's name, or dict key naming one."""
    def named(node):
        if isinstance(node, ast.Constant) and node.value in NAMES:
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES]
        return []

    def constants(node):
        return [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else \
            [e.value for e in getattr(node, "elts", []) if isinstance(e, ast.Constant) and isinstance(e.value, str)]

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and node.args:
            # a label's or name's prefix: "ring" of "ring all-reduce", "PS" of "PS sync"
            hits = [c for c in constants(node.args[0]) if len(c) >= 2 and any(
                (t.startswith(c) if node.func.attr == "startswith" else t.endswith(c)) for t in NAMES | LABELS)]
            if hits:
                found.append((node.lineno, hits))
        if isinstance(node, ast.Compare):
            # a mode or a label: ``mode == "sync"`` is the registry's (Method.cost.lockstep) to answer
            sides = [node.left, *node.comparators]
            hits = [c for side in sides for c in constants(side) if c in MODES | LABELS]
            if hits:
                found.append((node.lineno, hits))
            sides = [node.left, *node.comparators]
            hits = [v for side in sides for v in named(side)]
            # "ps" is also a TF cluster role ("ps", "worker", "chief"): it counts only beside a backend
            text = " ".join(ast.unparse(side) for side in sides)
            if [v for v in hits if v != "ps"] or (hits and "backend" in text):
                found.append((node.lineno, hits))
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Tuple) and key.elts and named(key.elts[0]):
                    found.append((key.lineno, named(key.elts[0])))
    return found


def test_no_module_branches_on_a_method_name():
    """Only the registry knows the methods' names: the application and common tiers ask it. (The
    trainers' own packages and the CLI's help texts may name themselves.)"""
    offenders = []
    for path in sorted(glob.glob(os.path.join(REPO, "hvdps", "**", "*.py"), recursive=True)
                       + glob.glob(os.path.join(REPO, "common", "**", "*.py"), recursive=True)
                       + glob.glob(os.path.join(REPO, "tf_cluster", "*.py"))
                       + glob.glob(os.path.join(REPO, "allreduce", "*.py"))):
        if os.path.basename(path) == "methods.py":
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        offenders += [f"{os.path.relpath(path, REPO)}:{line} {names}" for line, names in _names_compared(tree)]
    assert not offenders, offenders


def test_the_check_sees_a_branch():
    """The scan above finds the patterns it forbids (a check that cannot fail proves nothing)."""
    code = ('if row["backend"] == "ps": pass\nif backend in ("horovod", "mpi"): pass\n'
            'NAMES = {("ps2", "async"): "x"}\nfor role in ("ps", "worker"): pass\nif role == "ps": pass\n'
            'if label.startswith("ring"): pass\nif row.get("mode") == "sync": pass\nif arch in ("PS sync",): pass\n'
            'if task.startswith("ps:"): pass\nif path.endswith(".gz"): pass\n')
    assert [line for line, _ in _names_compared(ast.parse(code))] == [1, 2, 3, 6, 7, 8]


@pytest.mark.parametrize("backend, mode, workers, label, waits, argv", [
    ("ps", "sync", 4, "PS sync", 4, ["--sync"]),
    # TF's backups: an update per N pushes, its tokens to whoever asks, at the workers' summed rates
    ("ps", "backup1", 4, "PS sync, 1 backup", None, ["--sync", "--backup_workers", "1"]),
    ("ps", "async", 4, "PS async", None, ["--async"]),
    ("horovod", "sync", 4, "Horovod", 4, None),
])
def test_a_mode_says_how_many_workers_a_step_waits_for(backend, mode, workers, label, waits, argv):
    """What the unhealthy cluster's simple model and crossings read (CostModel.waits_for), the label,
    and for PS what its launcher tells the trainer."""
    method = methods.lookup(backend)
    assert method.label(mode) == label and method.cost.waits_for(mode, workers) == waits
    if argv is not None:
        assert method.launcher().launcher_argv(workers, mode, (("ps", 1),))[4:] == argv
