"""The tree's shape: no import circle among the project's modules (module-level and deferred imports
alike), and common/ free of Horovod and tf.distribute."""
import ast
import os

import pytest

from tests.conftest import REPO

METHOD_PACKAGES = tuple(sorted(e for e in os.listdir(REPO) if e.endswith("_train")
                               and os.path.isfile(os.path.join(REPO, e, "__init__.py"))))
PACKAGES = ("common", "hvdps", "tf_cluster", *METHOD_PACKAGES)


def project_imports():
    """{module: {project modules it imports anywhere in its file}}."""
    graph = {}
    for pkg in PACKAGES:
        for name in sorted(os.listdir(os.path.join(REPO, pkg))):
            if not name.endswith(".py"):
                continue
            module = f"{pkg}.{name[:-3]}".replace(".__init__", "")
            tree = ast.parse(open(os.path.join(REPO, pkg, name)).read())
            found = set()
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                         if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                found |= {n for n in names if n.split(".")[0] in PACKAGES}
            graph[module] = found
    modules = set(graph)
    return {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}


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
        tree = ast.parse(open(os.path.join(REPO, *module.split(".")) + ".py").read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] == "horovod" or "distribute" in n for n in names), module
            if isinstance(node, ast.Attribute) and node.attr == "distribute":
                assert not (isinstance(node.value, ast.Name) and node.value.id == "tf"), module
        assert not any(d.split(".")[0] in (*METHOD_PACKAGES, "hvdps") for d in deps), module


@pytest.mark.unit
def test_a_method_package_imports_no_other_method():
    """A method is its package: what two of them share (the TensorFlow cluster plumbing of PS and
    MultiWorkerMirrored: listening, supervision, SLURM's TF_CONFIG) lives in tf_cluster/, and the two
    all-reduce trainers' loop in common/, so no method package reaches into another's."""
    methods = list(METHOD_PACKAGES)
    for module, deps in project_imports().items():
        own = module.split(".")[0]
        if own in methods:
            assert not [d for d in deps if d.split(".")[0] in methods and d.split(".")[0] != own], (module, deps)
        if own == "tf_cluster":
            assert not [d for d in deps if d.split(".")[0] in methods + ["hvdps"]], (module, deps)
