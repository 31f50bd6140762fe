"""README.md's command blocks, run in order as a new user pastes them, on a fresh checkout.

Every ```bash block of README.md runs, top to bottom, in one shell (``set -euo pipefail``, so
``. .venv/bin/activate`` in one block holds for the next and any failing line fails the test), in a copy of
the repository's tracked files: no runs/, no build products, no earlier output. Sizes come from the
variables the Makefile reads from the environment (DEMO_*, PYTEST_ARGS, FUZZ_EXAMPLES, FUZZ_SEED so that
every walk draws the same examples, EMU_COMPARE, SLURM_*: ``make demo`` runs its three workloads under Horovod alone, one worker, 12 steps; every
method's one-worker run is in the README's first comparison); the README's own trainer and comparison
lines run as written, except that the fixed ports of the one-role-per-process lines (localhost:2222 ...)
are mapped to free ones and each line that trains gets ``--train_steps 20 --probe_steps 5`` before its
own flags, its own ``--train_steps`` taken out (the slow-worker comparison's 300 steps: test_unhealthy.py
holds that comparison's figures), as ``make demo`` gets them through DEMO_ARGS: the lines are checked to
work, not to train to the end, and a CNN's 55-step compute probe would be a third of its run.

Set-up: the checkout gets a copy of this suite's venv (hard links; the paths in its scripts moved)
with its set-up stamp, so ``make demo`` finds the set-up done, as on a machine where ``make test``
ran first. The set-up recipe itself runs where this suite starts: CI's ``make test`` on a fresh clone.

Needs root (the README's emulated-cluster and SLURM lines); skipped with the reason elsewhere. As
root on a machine without sudo, ``sudo`` is a shim that runs its command, which is what sudo does
for root.
"""
import argparse
import contextlib
import importlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess

import pytest

from tests.conftest import REPO

FENCE = re.compile(r"^( *)```(\w*)\s*$")
# Where a line that trains takes its first flag: a trainer's script or module, the comparison, or the
# comparison's flags after hvdps emulate's "--".
TRAINS = re.compile(r"(?:(?<=horovod_train/main\.py)|(?<=mpi_train/main\.py)|(?<=ps_train/main\.py)"
                    r"|(?<=hvdps launch ps)|(?<=hvdps launch mwms))(?= --| \\$|$)"
                    r"|(?:(?<=^hvdps compare)|(?<=^hvdps tune)|(?<= --))(?= --workers)", re.M)
STEPS = " --train_steps 20 --probe_steps 5"
COMMANDS = ("make ", "hvdps ", "python ", "horovodrun ", "mpirun ", "sudo ", "TF_CONFIG=")
# The pages whose blocks tests/test_docs.py walks, in this order, in one shell (the first activates the venv);
# DOCS, the other pages, whose links are checked.
PAGES = ("docs/methods.md", "docs/faults.md", "docs/unhealthy.md", "docs/clusters.md", "docs/kubernetes.md",
         "docs/tune.md", "docs/reference.md", "tests/README.md")
DOCS = ("docs/install.md", "docs/layout.md", "docs/metrics.md", "docs/projection.md", "docs/ps.md",
        "docs/localsgd.md", "docs/plugins.md", "docs/data.md", "hostfiles/README.md")
SIZES = {
    "DEMO_ARGS": "--train_steps 12 --probe_steps 5 --backends horovod", "DEMO_WORKERS": "1",
    "DEMO_TUNE_ARGS": "--backends mpi --train_steps 20 --probe_steps 5 --repeat 1",
    "PYTEST_ARGS": "-m unit tests/test_config.py", "FUZZ_EXAMPLES": "5", "FUZZ_SEED": "0",
    "EMU_HOSTS": "3", "EMU_COMPARE": "--workers 2 --backends horovod --model mlp --train_steps 20 --log_every 5 "
                                     "--warmup_steps 5",
    "SLURM_HOSTS": "2", "SLURM_JOBS": "--sbatch hostfiles/slurm/horovod.sbatch",
    "SLURM_COMPARE": "--workers 2 --backends horovod", "SLURM_TRAIN_ARGS": "--model mlp --epochs 1 --batch_size 32",
}


def blocks(text):
    """[(info string, [lines])] of every fenced block, indentation removed."""
    out, cur, indent = [], None, 0
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and cur is None:
            cur, indent, info = [], len(m.group(1)), m.group(2)
        elif m:
            out.append((info, cur))
            cur = None
        elif cur is not None:
            cur.append(line[indent:] if line[:indent].strip() == "" else line)
    assert cur is None, "README.md has an unclosed code fence"
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fresh_checkout(dst):
    """The repository's tracked files as they are in the working tree, nothing else."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = os.path.join(REPO, rel)
        if os.path.lexists(src):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel), follow_symlinks=False)


def copy_venv(src, dst):
    """A working copy of a venv at another path: hard links (a plain copy across filesystems), then
    every script naming the old path rewritten (each rewrite is a new file: the original is untouched)."""
    if subprocess.run(["cp", "-al", src, dst], capture_output=True).returncode != 0:   # another filesystem
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["cp", "-a", src, dst], check=True)
    old, new = src.encode(), dst.encode()
    for name in os.listdir(os.path.join(dst, "bin")):
        path = os.path.join(dst, "bin", name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        data = open(path, "rb").read()
        if old in data:
            mode = os.stat(path).st_mode
            os.remove(path)
            with open(path, "wb") as f:
                f.write(data.replace(old, new))
            os.chmod(path, mode)


@pytest.mark.root              # with the walk-throughs it guards (tests/conftest.py: the readme group)
@pytest.mark.parametrize("page", ["README.md", *PAGES])
def test_blocks_are_bash_where_they_are_commands(page):
    """A command in a block not marked bash would escape the walk-throughs below."""
    found = blocks(open(os.path.join(REPO, page)).read())
    assert any(info == "bash" for info, _ in found), page
    for info, lines in found:
        if info != "bash":
            assert not any(l.startswith(COMMANDS) for l in lines), lines


def test_the_readme_is_a_page_a_newcomer_reads():
    """At most 200 lines, every method named, and every local link pointing at a file that exists."""
    text = open(os.path.join(REPO, "README.md")).read()
    assert len(text.splitlines()) <= 200
    for name in ("Horovod", "MultiWorkerMirroredStrategy", "bare-MPI", "local SGD", "ParameterServerStrategy",
                 "SyncReplicasOptimizer"):
        assert name in text, name
    for page in ["README.md", *PAGES, *DOCS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", open(os.path.join(REPO, page)).read()):
            if not re.match(r"\w+://", target):
                assert os.path.exists(os.path.join(REPO, os.path.dirname(page), target)), (page, target)


class _Parsed(Exception):
    """Raised in place of parsing, carrying the parser a command built."""


@pytest.mark.parametrize("command", ["compare", "tune", "project", "emulate", "hosts", "data", "k8s"])
def test_the_reference_names_every_flag_of_every_command(command, monkeypatch):
    """docs/reference.md is the reference of every command: a flag added to a parser without a line
    there is named here. The parser is the command's own, taken as its main() is about to parse."""
    def grab(self, *args, **kwargs):
        raise _Parsed(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", grab)
    with pytest.raises(_Parsed) as got, contextlib.redirect_stdout(io.StringIO()):
        importlib.import_module(f"hvdps.commands.{command}").main(["--help"])
    text = open(os.path.join(REPO, "docs", "reference.md")).read()
    section = text[text.index(f"## `hvdps {command}`"):]
    section = section[:section.find("\n## ", 1)]
    flags = [a.option_strings[0] for a in got.value.args[0]._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= 2
    shared = text[text.index("## `hvdps compare`"):] if command in ("k8s", "tune") else ""
    missing = [f for f in flags if f"`{f}`" not in section and f"`{f}`" not in shared]
    assert not missing, missing


def walk(pages, tmp_path, timeout):
    """Run every bash block of ``pages`` (paths in the repository), page after page in one shell, on a fresh
    checkout with a copy of this suite's venv; the checkout's path and the walk's log. Fails the test on a
    non-zero exit or on the bound, with the log's tail."""
    checkout = str(tmp_path / "hvdps")
    fresh_checkout(checkout)
    copy_venv(os.path.join(REPO, ".venv"), os.path.join(checkout, ".venv"))

    script = ["set -euo pipefail", "PS4='+ $(date +%T) '", "set -x"]     # each command's start time in the log
    ports = {}
    for page in pages:
        for n, (info, lines) in enumerate(blocks(open(os.path.join(checkout, page)).read())):
            if info != "bash":
                continue
            text = "\n".join(lines)
            text = re.sub(r"localhost:(22\d\d)\b",
                          lambda m: f"localhost:{ports.setdefault(m.group(1), free_port())}", text)
            text = TRAINS.sub(STEPS, re.sub(r" --train_steps \d+", "", text))
            script += [f": {page} block {n}", text]
    (tmp_path / "walk.sh").write_text("\n".join(script) + "\n")

    bindir = tmp_path / "bin"
    bindir.mkdir()
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if not shutil.which("sudo", path=path):
        (bindir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
        (bindir / "sudo").chmod(0o755)
    env = {"PATH": f"{bindir}:{path}", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", **SIZES}
    for keep in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "TMPDIR"):
        if keep in os.environ:
            env[keep] = os.environ[keep]

    log = tmp_path / "walk.log"
    with open(log, "w") as out:
        p = subprocess.Popen(["bash", str(tmp_path / "walk.sh")], cwd=checkout, env=env, stdout=out,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = log.read_text()
    assert rc == 0, f"exit {rc}\n" + text[-6000:]
    return checkout, text


def assert_nothing_left(checkout):
    """Nothing the walk started is left: namespaces (an emulation names its own hvdps-<pid>-*; one still
    running, another test's, is not the walk's), SLURM daemons, trainers from the checkout."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    owners = {int(m.group(1)) for m in (re.match(r"^hvdps-(\d+)-", n) for n in names) if m}
    assert not [pid for pid in owners if not os.path.exists(f"/proc/{pid}")], names
    left = subprocess.run(["pgrep", "-f", checkout], capture_output=True, text=True).stdout.split()
    assert not left, left


@pytest.mark.root
@pytest.mark.timeout(1200)
def test_every_readme_command_block_runs_in_order_on_a_fresh_checkout(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("make demo's slow-worker comparison needs root (the kernel's CPU cgroup)")
    checkout, text = walk(["README.md"], tmp_path, timeout=1000)
    assert re.search(r"^\d+ passed", text, re.M), "make test ran no test\n" + text[-3000:]

    # make demo's compare lines may fail one workload and still merge the rest: every run must be ok
    runs = os.path.join(checkout, "runs")
    demo = [d for d in os.listdir(runs) if d.startswith("demo-")]
    assert len(demo) == 1, os.listdir(runs)
    rows = json.load(open(os.path.join(runs, demo[0], "results.json")))
    rows = rows["rows"] if isinstance(rows, dict) else rows
    from hvdps.measure.identity import workload_name      # the transformer in the precision auto takes here
    assert sorted({r["model"] for r in rows}) == sorted(["cnn", "mlp", "rec", workload_name("transformer", "auto")]) and \
        all(r["status"] == "ok" for r in rows), rows
    tuned = open(os.path.join(runs, demo[0], "tune", "report.md")).read()       # and its short tune's report
    assert re.search(r"\| bare MPI \| (its defaults|--precision \w+) \|", tuned), tuned[:2000]
    # the README's own comparison ran every method it names, and its rebuild has the same rows
    cmp = json.load(open(os.path.join(runs, "cmp", "results.json")))
    again = json.load(open(os.path.join(runs, "cmp-again", "results.json")))
    cmp, again = (r["rows"] if isinstance(r, dict) else r for r in (cmp, again))
    assert len(cmp) == 12 and all(r["status"] == "ok" for r in cmp), cmp
    shape = lambda rows: sorted((r["backend"], r["mode"], r["workers"]) for r in rows)
    assert shape(again) == shape(cmp) and len({r["backend"] for r in cmp}) == 5, shape(cmp)
    assert_nothing_left(checkout)
