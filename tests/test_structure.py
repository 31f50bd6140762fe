"""The tree's shape: no import circle among the project's modules (module-level and deferred imports
alike), common/ free of Horovod and tf.distribute, no method package reaching into another, and the
application (hvdps/) split by job."""
import ast
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

METHOD_PACKAGES = tuple(sorted(e for e in os.listdir(REPO) if e.endswith("_train")
                               and os.path.isfile(os.path.join(REPO, e, "__init__.py"))))
PACKAGES = ("common", "allreduce", "hvdps", "tf_cluster", *METHOD_PACKAGES)


def module_files():
    """Every module of the project's packages, sub-packages included, as a path from the repository."""
    for pkg in PACKAGES:
        for root, dirs, files in os.walk(os.path.join(REPO, pkg)):
            dirs[:] = sorted(d for d in dirs if os.path.isfile(os.path.join(root, d, "__init__.py")))
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(root, name), REPO)


def project_imports():
    """{module: {project modules it imports anywhere in its file}}."""
    graph = {}
    for path in module_files():
        module = path[:-3].replace(os.sep, ".").replace(".__init__", "")
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        found = set()
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found |= {n for n in names if n.split(".")[0] in PACKAGES}
        graph[module] = found
    modules = set(graph)
    return {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}


def module_path(module):
    """The file of a dotted module name: a module's own file, or a package's __init__.py."""
    path = os.path.join(REPO, *module.split("."))
    return path + ".py" if os.path.isfile(path + ".py") else os.path.join(path, "__init__.py")


def find_cycle(graph):
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                return stack[stack.index(d):] + [d]
            if d not in state:
                cycle = visit(d)
                if cycle:
                    return cycle
        state[m] = "done"
        stack.pop()
        return None
    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


@pytest.mark.unit
def test_no_import_circle():
    assert find_cycle(project_imports()) is None, " -> ".join(find_cycle(project_imports()))


@pytest.mark.unit
def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.unit
def test_common_imports_no_backend():
    """common/ is what every backend shares: no Horovod import, no tf.distribute, no backend package."""
    for module, deps in project_imports().items():
        if not module.startswith("common."):
            continue
        tree = ast.parse(open(module_path(module)).read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] == "horovod" or "distribute" in n for n in names), module
            if isinstance(node, ast.Attribute) and node.attr == "distribute":
                assert not (isinstance(node.value, ast.Name) and node.value.id == "tf"), module
        assert not any(d.split(".")[0] in (*METHOD_PACKAGES, "allreduce", "tf_cluster", "hvdps") for d in deps), module


@pytest.mark.unit
def test_a_method_package_imports_no_other_method():
    """A method is its package: what two of them share (the TensorFlow cluster plumbing of PS and
    MultiWorkerMirrored: listening, supervision, SLURM's TF_CONFIG) lives in tf_cluster/, and what the
    all-reduce methods share (their loop, the mpi4py job, the roster) in allreduce/, so no method
    package reaches into another's."""
    methods = list(METHOD_PACKAGES)
    for module, deps in project_imports().items():
        own = module.split(".")[0]
        if own in methods:
            assert not [d for d in deps if d.split(".")[0] in methods and d.split(".")[0] != own], (module, deps)
        if own in ("tf_cluster", "allreduce"):
            assert not [d for d in deps if d.split(".")[0] in methods + ["hvdps"]], (module, deps)


# common/'s sub-packages by job, each above those it may import: the foundations, what a run is asked to
# do (config, plan, data sets and plug-ins named), the file formats' readers, the training data, the model,
# the trainer's life cycle; launching stands beside them on the foundations and the formats.
COMMON_JOBS = {"base": set(), "spec": {"base"}, "formats": {"base", "spec"}, "inputs": {"base", "spec", "formats"},
               "model": {"base", "spec", "formats", "inputs"},
               "trainer": {"base", "spec", "formats", "inputs", "model"}, "launch": {"base", "spec", "formats"}}


def common_layer_violations(graph):
    """[(module, the sub-packages of common/ it reaches that are not below its own)]."""
    out = []
    for module, deps in graph.items():
        parts = module.split(".")
        if parts[0] != "common" or len(parts) < 3:
            continue
        used = {d.split(".")[1] for d in deps if d.startswith("common.") and len(d.split(".")) > 2}
        if used - COMMON_JOBS[parts[1]] - {parts[1]}:
            out.append((module, sorted(used - COMMON_JOBS[parts[1]] - {parts[1]})))
    return out


@pytest.mark.unit
def test_common_is_split_by_job_and_each_part_imports_only_those_below():
    """Every module of common/ sits in a sub-package that names its job (none is left loose beside them),
    and a sub-package imports only those below it, deferred imports included: the seams can be seen."""
    loose = sorted(e for e in os.listdir(os.path.join(REPO, "common")) if e.endswith(".py") and e != "__init__.py")
    assert not loose, loose
    folders = sorted(d for d in os.listdir(os.path.join(REPO, "common"))
                     if os.path.isfile(os.path.join(REPO, "common", d, "__init__.py")))
    assert folders == sorted(COMMON_JOBS), folders
    assert common_layer_violations(project_imports()) == []


def test_the_layer_check_sees_an_upward_import():
    """A foundation reaching up to the trainer is caught (a check that cannot fail proves nothing)."""
    graph = {"common.base.errors": {"common.trainer.metrics"}, "common.trainer.metrics": {"common.base.errors"}}
    assert common_layer_violations(graph) == [("common.base.errors", ["trainer"])]


# hvdps/'s folders by job, and what each may import of the others: the cost model and the measurement
# know nothing of how results are shown or asked for; rendering shows the cost model's and the
# measurement's results; the command lines put all three together. (hvdps/ itself: the hvdps command, the method registry, the
# launchers; install/: set-up; k8s/: Kubernetes manifests, written and checked.)
JOBS = {"cost": set(), "measure": set(), "tune": {"cost", "measure"}, "render": {"cost", "measure", "tune"},
        "commands": {"cost", "measure", "render", "k8s", "tune"}, "install": set(), "k8s": set()}


@pytest.mark.unit
def test_the_application_is_split_by_job():
    graph = project_imports()
    folders = sorted(d for d in os.listdir(os.path.join(REPO, "hvdps"))
                     if os.path.isfile(os.path.join(REPO, "hvdps", d, "__init__.py")))
    assert folders == sorted(JOBS), folders
    for module, deps in graph.items():
        parts = module.split(".")
        if parts[0] != "hvdps" or len(parts) < 3:
            continue
        used = {d.split(".")[1] for d in deps if d.startswith("hvdps.") and d.split(".")[1] in JOBS}
        assert used <= JOBS[parts[1]] | {parts[1]}, (module, sorted(used - JOBS[parts[1]] - {parts[1]}))


@pytest.mark.unit
def test_only_the_command_lines_read_a_command_line():
    """A module outside hvdps/commands/ (and the hvdps dispatcher, and set-up's scripts) neither parses
    flags nor has a main: what projects, measures or renders is called with typed values."""
    for path in module_files():
        if not path.startswith("hvdps" + os.sep) or path.startswith(tuple(os.path.join("hvdps", d) for d in
                                                                          ("commands", "install"))):
            continue
        if path == os.path.join("hvdps", "cli.py"):
            continue
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        assert not [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"], path
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Parser"
                    or isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "ArgumentParser"], path


MAIN_FUNCTION_LINES = 60     # a trainer's main.py reads top to bottom, as Horovod's examples do


@pytest.mark.unit
@pytest.mark.parametrize("package", METHOD_PACKAGES)
def test_a_method_main_has_short_functions(package):
    """Every function of a method's entry script fits on a screen: what it does at length lives in
    the package's other modules, so the script stays the linear recipe a user reads."""
    path = os.path.join(REPO, package, "main.py")
    tree = ast.parse(open(path).read())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAIN_FUNCTION_LINES]
    assert not long, long


@pytest.mark.unit
def test_the_application_has_short_functions():
    """No function of hvdps/ is over 60 lines either: a command reads parse, validate, load, compute,
    write, each step a function of its own, and what it computes lives in cost/, measure/ or render/."""
    long = []
    for root, _, files in os.walk(os.path.join(REPO, "hvdps")):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            long += [(os.path.relpath(path, REPO), n.name, n.end_lineno - n.lineno + 1)
                     for n in ast.walk(ast.parse(open(path).read()))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.end_lineno - n.lineno + 1 > MAIN_FUNCTION_LINES]
    assert not long, long


@pytest.mark.unit
def test_every_module_has_a_row_in_the_tests_readme():
    """tests/README.md says which tests check each module: a module added without a row is named here."""
    text = open(os.path.join(REPO, "tests", "README.md")).read()
    missing = [p for p in module_files() if not p.endswith("__init__.py") and f"| `{p}` |" not in text]
    assert not missing, missing


# What a function may import where it runs rather than at module top: TensorFlow and what loads it
# (Keras, TensorBoard, protobuf's descriptors), Horovod and mpi4py (MPI_Init at import), matplotlib,
# and the optional readers (PIL, crc32c, YAML, tqdm): each costs seconds or is absent on some
# machines, and most commands never need it. Everything else is imported at module top, where the
# seams between the packages show.
DEFERRED = {"tensorflow", "keras", "tf_keras", "tensorboard", "google", "horovod", "mpi4py", "matplotlib", "PIL",
            "google_crc32c", "yaml", "tqdm"}


def deferred_imports(tree):
    """[(line, module)] of the imports inside functions that are not in DEFERRED."""
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                out += [(node.lineno, n) for n in names if n.split(".")[0] not in DEFERRED]
    return sorted(set(out))


@pytest.mark.unit
def test_imports_are_at_module_top():
    found = {p: d for p in module_files() for d in [deferred_imports(ast.parse(open(os.path.join(REPO, p)).read()))] if d}
    assert not found, found


@pytest.mark.unit
def test_the_import_check_sees_one_inside_a_function():
    tree = ast.parse("def f():\n    import re\n    import tensorflow as tf\n    from common.base import procs\n")
    assert deferred_imports(tree) == [(2, "re"), (4, "common.base")]


@pytest.mark.process
def test_the_suites_groups_reach_pytest_xdist():
    """tests/conftest.py's groups are what keep a shared job launched once and the root tier one test
    after another; pytest-xdist sees them only if they are marked before it reads them (its node
    ids then end in @group). A group it never saw costs the suite a copy of every shared job."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--dist", "loadgroup",
                        "-rA", "tests/test_readme.py::test_blocks_are_bash_where_they_are_commands[README.md]"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "PASSED tests/test_readme.py::test_blocks_are_bash_where_they_are_commands[README.md]@readme" in r.stdout, \
        r.stdout[-3000:]
